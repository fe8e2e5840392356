"""The task event table (orchestra/_observe/task_events.py) and what is made of its rows
(_state_query.select, the timeline's events): no processes.

A worker buffers starts and ends as tuples and packs them into a TaskEventBatch; the
head's TaskTable turns batches and submits into records, bounded, with legal
transitions only, and settles what no worker said against the scheduler's view."""
from __future__ import annotations

import json

import pytest

from orchestra._api.timeline import timeline_events
from orchestra._head.state_query import select
from orchestra._observe.task_events import (
    _DEPARTED_MAX,
    ACTOR_CREATION_TASK,
    ACTOR_TASK,
    DRIVER,
    FAILED,
    FINISHED,
    NORMAL_TASK,
    NOT_RUN,
    PENDING_ARGS_AVAIL,
    PENDING_NODE_ASSIGNMENT,
    RUNNING,
    TASK_CANCELLED,
    WORKER_DIED,
    EventBuffer,
    IllegalTaskTransition,
    SchedView,
    TaskRecord,
    TaskTable,
    end_error_type,
    summarize,
)
from orchestra._protocol import pb

pytestmark = pytest.mark.timeout(30)


def tid(n: int) -> bytes:
    return n.to_bytes(12, "big")


def call(n: int, name: str = "f", actor_id: bytes = b"") -> pb.Call:
    return pb.Call(task_id=tid(n), name=name, actor_id=actor_id)


def batch(starts=(), ends=(), flush_id: int = 0):
    """A worker's report: starts (n, name, kind, owner, t), ends (n, t, error)."""
    buf = EventBuffer()
    for n, name, kind, owner, t in starts:
        buf.started.append((tid(n), name, b"", kind, owner, t))
    for n, t, err in ends:
        buf.ended.append((tid(n), t, err))
    return buf.take(flush_id)


def no_sched(_tid: bytes) -> str | None:
    return None


def alive(_wid: int) -> bool:
    return True


# ------------------------------------------------------------------ worker side

def test_buffer_packs_starts_and_ends_into_columns_and_empties() -> None:
    buf = EventBuffer()
    buf.started.append((tid(1), "f", b"", 0, 7, 10.0))
    buf.ended.append((tid(1), 11.0, ""))
    b = buf.take(flush_id=3)
    assert list(b.start_task_id) == [tid(1)] and list(b.start_owner) == [7]
    assert list(b.end_time) == [11.0] and b.flush_id == 3
    assert not buf.started and not buf.ended
    assert pb.TaskEventBatch.FromString(b.SerializeToString()) == b


def test_buffer_is_due_only_with_something_buffered_and_after_the_interval() -> None:
    buf = EventBuffer()
    assert not buf.due(buf.last_report + 10)
    buf.ended.append((tid(1), 1.0, ""))
    assert not buf.due(buf.last_report + 0.1)
    assert buf.due(buf.last_report + 0.6)


@pytest.mark.parametrize("done,expected", [
    (pb.TaskDone(), ""),
    (pb.TaskDone(cancelled=True), "TASK_CANCELLED"),
    (pb.TaskDone(user_error=True, task_id=b"t"), "KeyError"),
])
def test_end_error_type_names_the_exception_class(done, expected) -> None:
    assert end_error_type(done, {b"t": "KeyError"}) == expected


# ------------------------------------------------------------------ transitions

def test_a_submitted_task_runs_then_finishes() -> None:
    table = TaskTable()
    table.submitted(5, [call(1, "f")], now=100.0)
    table.ingest()
    r = table.records[tid(1)]
    assert (r.state, r.name, r.caller, r.submit_time) == (PENDING_ARGS_AVAIL, "f", 5, 100.0)
    table.worker_batch(batch(starts=[(1, "f", 0, 0, 101.0)]), worker_id=2, pid=42, node_id=0)
    assert (r.state, r.start_time, r.pid, r.worker_id) == (RUNNING, 101.0, 42, 2)
    table.worker_batch(batch(ends=[(1, 102.0, "")]), 2, 42, 0)
    assert (r.state, r.end_time, r.error_type) == (FINISHED, 102.0, "")


def test_a_submitted_call_keeps_its_name_and_kind_though_the_scheduler_dropped_it() -> None:
    table = TaskTable()
    make = pb.Call(task_id=tid(3), name="A.__init__")
    make.actor.actor_id = b"a" * 12
    table.submitted(5, [call(1, "g"), call(2, "A.m", b"a" * 12), make], now=1.0)
    table.ingest()
    got = [(r.name, r.kind, r.actor_id) for r in table.records.values()]
    assert got == [("g", NORMAL_TASK, b""), ("A.m", ACTOR_TASK, b"a" * 12),
                   ("A.__init__", ACTOR_CREATION_TASK, b"a" * 12)]


def test_a_direct_call_is_known_from_its_start_with_its_caller_as_job() -> None:
    table = TaskTable()
    table.worker_batch(batch(starts=[(1, "g", 1, 9, 5.0)], ends=[(1, 6.0, "ValueError")]),
                       3, 43, 1)
    r = table.records[tid(1)]
    assert (r.state, r.error_type, r.caller, r.submit_time, r.kind) == (FAILED, "ValueError", 9, 0.0, 1)


def test_an_ended_task_may_run_again_but_not_go_back_to_pending() -> None:
    r = TaskRecord(tid(1))
    r.move(RUNNING)
    r.move(FAILED)
    r.move(RUNNING)   # retry_exceptions: it runs again
    r.move(FINISHED)
    with pytest.raises(IllegalTaskTransition, match="FINISHED -> PENDING_ARGS_AVAIL"):
        r.move(PENDING_ARGS_AVAIL)


def test_a_running_task_whose_worker_died_failed_unless_the_scheduler_retries_it() -> None:
    table = TaskTable()
    table.worker_batch(batch(starts=[(1, "f", 0, 0, 1.0), (2, "f", 0, 0, 1.0)]), 2, 42, 0)
    sched = {tid(2): PENDING_NODE_ASSIGNMENT}
    table.settle(SchedView(sched.get, lambda w: False), flushed=True, now=5.0)
    assert (table.records[tid(1)].state, table.records[tid(1)].error_type) == (FAILED, WORKER_DIED)
    assert table.records[tid(2)].state == PENDING_NODE_ASSIGNMENT


def test_a_running_task_whose_worker_was_killed_to_cancel_it_was_cancelled() -> None:
    """cancel(force=True), or its driver's death on a started cluster, kills the worker
    under a running task: it read WORKER_DIED, as a crash does."""
    table = TaskTable()
    table.worker_batch(batch(starts=[(1, "f", 0, 0, 1.0)]), 2, 42, 0)
    table.settle(SchedView({}.get, lambda w: False, lambda w: w == 2), flushed=True, now=5.0)
    assert (table.records[tid(1)].state, table.records[tid(1)].error_type) == \
        (FAILED, TASK_CANCELLED)


def test_a_submitted_task_no_one_has_ended_without_running_once_flushed_or_old() -> None:
    table = TaskTable()
    table.submitted(5, [call(1), call(2)], now=100.0)
    table.ingest()
    table.settle(SchedView(no_sched, alive), flushed=False, now=100.5)
    assert table.records[tid(1)].state == PENDING_ARGS_AVAIL   # its report may be on its way
    table.settle(SchedView(no_sched, alive), flushed=True, now=100.5)
    assert (table.records[tid(1)].state, table.records[tid(1)].error_type) == (FAILED, NOT_RUN)


def test_a_waiting_task_takes_the_schedulers_state() -> None:
    table = TaskTable()
    table.submitted(5, [call(1)], now=1.0)
    table.ingest()
    table.settle(SchedView({tid(1): PENDING_NODE_ASSIGNMENT}.get, alive), flushed=True)
    assert table.records[tid(1)].state == PENDING_NODE_ASSIGNMENT


# ------------------------------------------------------------------ bounded

def test_the_table_drops_the_oldest_ended_tasks_first_and_counts_them() -> None:
    table = TaskTable(max_tasks=3)
    table.worker_batch(batch(starts=[(1, "f", 0, 0, 1.0)]), 2, 42, 0)          # running
    table.worker_batch(batch(starts=[(n, "f", 0, 0, 1.0) for n in (2, 3, 4)],
                             ends=[(n, 2.0, "") for n in (2, 3, 4)]), 2, 42, 0)
    assert list(table.records) == [tid(1), tid(3), tid(4)]
    assert table.dropped == 1


def test_the_table_drops_the_oldest_of_any_state_when_nothing_ended() -> None:
    table = TaskTable(max_tasks=2)
    table.submitted(1, [call(1), call(2), call(3)], now=1.0)
    table.ingest()
    assert list(table.records) == [tid(2), tid(3)] and table.dropped == 1


def test_an_end_of_a_dropped_task_is_ignored() -> None:
    table = TaskTable(max_tasks=1)
    table.worker_batch(batch(ends=[(9, 1.0, "")]), 2, 42, 0)
    assert not table.records


def test_a_table_of_no_rows_is_refused() -> None:
    with pytest.raises(ValueError, match="task_events_max"):
        TaskTable(max_tasks=0)


# ------------------------------------------------------------------ jobs, summary, filters

def test_the_job_of_a_task_submitted_by_a_task_is_its_drivers() -> None:
    table = TaskTable()
    table.worker_batch(batch(starts=[(1, "parent", 0, 7, 1.0)]), worker_id=2, pid=42, node_id=0)
    drivers, workers = {7}, {20: 2}   # connection 20 is worker 2's
    assert table.job_of(20, drivers.__contains__, lambda c: workers.get(c, -1)) == 7
    assert table.job_of(7, drivers.__contains__, lambda c: -1) == 7
    assert table.job_of(99, drivers.__contains__, lambda c: -1) == 0


def test_a_closed_drivers_tasks_and_its_tasks_tasks_keep_its_job() -> None:
    table = TaskTable()
    table.worker_batch(batch(starts=[(1, "parent", 0, 7, 1.0)]), worker_id=2, pid=42, node_id=0)
    table.client_gone(7, DRIVER)    # the driver was killed; then its task's worker died
    table.client_gone(20, 2)
    no_one = frozenset[int]().__contains__
    assert table.job_of(7, no_one, lambda c: -1) == 7
    assert table.job_of(20, no_one, lambda c: -1) == 7


def test_the_closed_connections_remembered_are_bounded() -> None:
    table = TaskTable()
    for conn in range(1, _DEPARTED_MAX + 11):
        table.client_gone(conn, DRIVER)
    assert len(table.departed) == _DEPARTED_MAX and 10 not in table.departed
    assert table.job_of(_DEPARTED_MAX + 10, lambda c: False, lambda c: -1) == _DEPARTED_MAX + 10


def test_counts_and_summary_group_by_state_and_name() -> None:
    table = TaskTable()
    table.worker_batch(batch(starts=[(1, "f", 0, 0, 1.0), (2, "f", 0, 0, 1.0), (3, "A.m", 1, 0, 1.0)],
                             ends=[(1, 2.0, "")]), 2, 42, 0)
    assert table.counts() == {FINISHED: 1, RUNNING: 2}
    rows = [{"name": r.name, "state": r.state, "type": ["NORMAL_TASK", "ACTOR_TASK"][r.kind]}
            for r in table.records.values()]
    s = summarize(rows)["cluster"]
    assert s["summary"]["f"]["state_counts"] == {FINISHED: 1, RUNNING: 1}
    assert s["total_tasks"] == 3 and s["total_actor_tasks"] == 1


def test_select_filters_by_equality_case_blind_and_keeps_the_newest() -> None:
    rows = [{"state": s, "n": i} for i, s in enumerate(["RUNNING", "FINISHED", "RUNNING"])]
    assert select(rows, [["state", "=", "running"]], 0) == [rows[0], rows[2]]
    assert select(rows, [["state", "!=", "RUNNING"]], 0) == [rows[1]]
    assert select(rows, [], 2) == rows[1:]


@pytest.mark.parametrize("bad,match", [
    (["state", "~", "x"], "bad filter"), (["nope", "=", "x"], "unknown filter key")])
def test_select_refuses_a_bad_filter_naming_the_fix(bad, match) -> None:
    with pytest.raises(ValueError, match=match):
        select([{"state": "RUNNING"}], [bad], 0)


# ------------------------------------------------------------------ timeline

def test_timeline_has_one_complete_event_per_started_call_and_names_its_tracks() -> None:
    task = {"task_id": "ab", "name": "f", "state": FINISHED, "job_id": "00000001",
            "actor_id": None, "error_type": None, "attempt_number": 0, "type": "NORMAL_TASK",
            "node_id": "0000000000000000", "worker_pid": 42, "caller_pid": 7,
            "caller_node_id": "0000000000000000", "creation_time_us": 900,
            "start_time_us": 1000, "end_time_us": 1500}
    nodes = [{"node_id": "0000000000000000", "node_ip": "127.0.0.1"}]
    workers = [{"worker_id": "0000000000000001", "worker_type": "WORKER", "node_id":
                "0000000000000000", "pid": 42}]
    events = json.loads(json.dumps(timeline_events([task], nodes, workers)))
    for e in events:
        assert {"ph", "ts", "dur", "pid", "tid", "name"} <= set(e)
    (x,) = [e for e in events if e["ph"] == "X"]
    assert (x["ts"], x["dur"], x["pid"], x["tid"], x["args"]["task_id"]) == (1000, 500, 1, 42, "ab")
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {
        "Node 0000000000000000 (127.0.0.1)", "worker 1 (pid 42)"}
    assert [e["ph"] for e in events if e.get("cat") == "submit"] == ["i", "s", "f"]


def test_a_direct_call_adopted_from_a_dead_worker_failed_with_worker_died() -> None:
    table = TaskTable()
    table.adopted(7, 3, [pb.Call(task_id=tid(1), name="f")])
    table.settle(SchedView(no_sched, lambda w: False), flushed=True, now=5.0)
    r = table.records[tid(1)]
    assert (r.state, r.error_type, r.caller, r.name) == (FAILED, WORKER_DIED, 7, "f")


def test_counts_and_the_live_set_follow_transitions_and_drops() -> None:
    table = TaskTable(max_tasks=2)
    table.submitted(1, [call(1)], now=1.0)
    table.ingest()
    table.worker_batch(batch(starts=[(1, "f", 0, 0, 2.0), (2, "f", 0, 0, 2.0)],
                             ends=[(1, 3.0, "")]), 2, 42, 0)
    assert table.counts() == {FINISHED: 1, RUNNING: 1} and set(table.live) == {tid(2)}
    table.worker_batch(batch(starts=[(3, "f", 0, 0, 4.0)]), 2, 42, 0)   # task 1 dropped
    assert table.counts() == {RUNNING: 2} and set(table.live) == {tid(2), tid(3)}
    expected: dict[str, int] = {}
    for r in table.records.values():
        expected[r.state] = expected.get(r.state, 0) + 1
    assert table.counts() == expected


def test_a_report_never_carries_an_end_without_its_start() -> None:
    buf = EventBuffer()

    class Racing(list):
        """The started list of a worker where a call starts and ends while take()
        reads the ends: that end is left for the next report, with its start."""

        def __len__(self) -> int:
            n = super().__len__()
            if not self.raced:
                self.raced = True
                self.append((tid(2), "f", b"", 0, 0, 1.0))
                buf.ended.append((tid(2), 2.0, ""))
            return n

    started = Racing()
    started.raced = False
    buf.started = started
    buf.ended.append((tid(1), 1.0, ""))
    started.raced = True
    started.append((tid(1), "f", b"", 0, 0, 0.5))
    started.raced = False
    b = buf.take()
    assert set(b.end_task_id) <= set(b.start_task_id)
    b2 = buf.take()
    assert list(b2.start_task_id) == [tid(2)] and list(b2.end_task_id) == [tid(2)]
