"""SchedulerState: every scheduling decision, driven directly (no processes, no sockets).

Events go in as method calls; the decisions come out as typed instructions in
``state.out`` (Execute, CancelTask, Push, StartWorker, KillWorker, StopWorker, FreeSegment,
...: orchestra/_scheduler/instructions.py), in the scheduler's own words: these tests
read no frame. Helpers: tests/unit/_sched_helpers.py.
"""
from __future__ import annotations

import pickle
from typing import Any

import pytest

from _sched_helpers import (
    DRIVER,
    NODE,
    Cluster,
    error_of,
    executed,
    executes,
    freed_segments,
    inline,
    inline_data,
    make_call,
    new_id,
    pushes,
    ref,
    rid,
    segment_data,
    sent,
    worker_conn,
)
from orchestra._scheduler import data as values
from orchestra._scheduler.blocking import STALL_S
from orchestra._scheduler.events import Hello, TaskDone
from orchestra._scheduler.instructions import (
    CancelTask,
    Execute,
    FreeSegment,
    KillWorker,
    ReturnTasks,
    Shutdown,
    Stalled,
    StopWorker,
)
from orchestra._scheduler.model import TASK_TRANSITIONS, IllegalTransition, Task, TaskState, WorkerState

pytestmark = pytest.mark.timeout(10)

# ------------------------------------------------------------------ dependencies

def test_a_task_with_a_pending_argument_waits_then_runs_with_its_value():
    c = Cluster(cpus=2)
    producer = c.submit(make_call("producer"))
    consumer = c.submit(make_call("consumer", (ref(rid(producer)),)))
    out = c.take()
    assert executed(out) == [(1, producer.task_id)]
    assert c.s.tasks[consumer.task_id].state is TaskState.WAITING
    c.done(1, producer, "value")
    out = c.take()
    [(wid, inv)] = executes(out)
    assert inv.call.task_id == consumer.task_id
    assert [pickle.loads(d.payload) for d in inv.resolved] == ["value"]
    assert rid(producer) in pushes(out)   # the owner gets the result too


def test_a_task_whose_arguments_exist_runs_at_once():
    c = Cluster(cpus=1)
    oid = new_id() + bytes(4)
    c.s.directory.put(DRIVER, inline_data(oid, 5))
    call = c.submit(make_call("f", (ref(oid), inline(1))))
    [(_, inv)] = executes(c.take())
    assert inv.call.task_id == call.task_id and len(inv.resolved) == 1


def test_a_task_waits_for_every_argument():
    c = Cluster(cpus=3)
    a, b = c.submit(make_call("a")), c.submit(make_call("b"))
    consumer = c.submit(make_call("c", (ref(rid(a)), ref(rid(b)))))
    c.take()
    c.done(1, a)
    assert consumer.task_id not in {t for _, t in executed(c.take())}
    c.done(2, b)
    assert consumer.task_id in {t for _, t in executed(c.take())}


def test_an_argument_that_failed_fails_the_task_without_running_it():
    c = Cluster(cpus=1)
    failing = c.submit(make_call("failing"))
    later = c.submit(make_call("later", (ref(rid(failing)),)))
    c.take()
    error = values.error_value(rid(failing), b"boom")
    c.s.task_done(worker_conn(1), TaskDone(task_id=failing.task_id, returns=[error],
                                              user_error=True))
    out = c.take()
    assert executed(out) == []
    assert error_of(out, rid(later)) == b"boom"
    # Submitted after the failure: fails at submit.
    after = c.submit(make_call("after", (ref(rid(failing)),)))
    out = c.take()
    assert executed(out) == [] and error_of(out, rid(after)) == b"boom"


def test_a_ref_to_an_unknown_object_fails_the_task_as_lost():
    c = Cluster(cpus=1)
    call = c.submit(make_call("f", (ref(b"?" * 16),)))
    out = c.take()
    assert executed(out) == [] and b"lost" in error_of(out, rid(call))


def test_a_result_registered_pending_before_its_task_comes_through_the_head_wakes_its_waiters():
    # A driver's direct call f escapes as g's argument while queued for a lent worker (the
    # driver registers its result pending), then f itself goes through the head (its
    # lent worker was recalled). The Submit must not replace the pending object g waits
    # on: it did, and g stayed waiting for good (a dependent task that never started).
    c = Cluster(cpus=1)
    f = make_call("f")
    c.s.directory.register_pending(DRIVER, [rid(f)])
    g = c.submit(make_call("g", (ref(rid(f)),)))
    c.submit(f)
    c.take()
    c.done(1, f, 7)
    out = c.take()
    assert executed(out) == [(1, g.task_id)]
    # One count for the driver, as before the Submit: its own decrement frees the result.
    assert c.s.clients[DRIVER].holds[rid(f)] == 1
    c.done(1, g)
    c.take()
    c.s.directory.ref_delta(DRIVER, [], [rid(f)])
    assert rid(f) not in c.s.objects


# ------------------------------------------------------------------ resources

def test_cpus_gate_concurrency():
    c = Cluster(cpus=2, pipeline_depth=1)
    calls = [c.submit(make_call(f"t{i}")) for i in range(4)]
    out = c.take()
    assert executed(out) == [(1, calls[0].task_id), (2, calls[1].task_id)]
    assert c.started(out) == []   # no free CPU: no worker started for the rest
    assert c.available()["CPU"] == 0
    c.done(1, calls[0])
    assert executed(c.take()) == [(1, calls[2].task_id)]


def test_a_task_needing_every_cpu_runs_alone():
    c = Cluster(cpus=2)
    small = c.submit(make_call("small"))
    big = c.submit(make_call("big", cpus=2))
    assert executed(c.take()) == [(1, small.task_id)]
    c.done(1, small)
    assert executed(c.take()) == [(1, big.task_id)]
    assert c.available()["CPU"] == 0


def test_a_custom_resource_gates_concurrency():
    c = Cluster(cpus=4, custom={"widget": 1}, pipeline_depth=1)
    a = c.submit(make_call("a", resources={"widget": 1}))
    b = c.submit(make_call("b", resources={"widget": 1}))
    assert executed(c.take()) == [(1, a.task_id)]
    assert c.available() == {"CPU": 3.0, "widget": 0.0}
    c.done(1, a)
    assert executed(c.take()) == [(1, b.task_id)]


def test_gpu_ids_are_handed_to_each_task():
    c = Cluster(cpus=2, gpus=2)
    a = c.submit(make_call("a", resources={"GPU": 1}))
    b = c.submit(make_call("b", resources={"GPU": 1}))
    both = c.submit(make_call("both", resources={"GPU": 2}))
    out = executes(c.take())
    assert [(inv.call.task_id, list(inv.gpu_ids)) for _, inv in out] == [
        (a.task_id, [0]), (b.task_id, [1])]
    assert c.available()["GPU"] == 0
    c.done(1, a)
    c.done(2, b)
    [(_, inv)] = executes(c.take())
    assert inv.call.task_id == both.task_id and list(inv.gpu_ids) == [0, 1]


def test_a_non_gpu_task_gets_no_gpu_ids():
    c = Cluster(cpus=1, gpus=2)
    c.submit(make_call("cpu only"))
    [(_, inv)] = executes(c.take())
    assert list(inv.gpu_ids) == []


def test_available_resources_never_show_a_negative_amount():
    c = Cluster(cpus=1, max_workers=4)
    outer = c.submit(make_call("outer"))
    c.take()
    c.s.blocked(worker_conn(1), True)          # lends its CPU ...
    inner = c.submit(make_call("inner"))
    [new] = c.started(c.take())
    c.connect(new)
    assert executed(c.take()) == [(new, inner.task_id)]
    c.s.blocked(worker_conn(1), False)         # ... takes it back while inner runs
    assert c.available()["CPU"] == 0.0
    assert outer.task_id in c.s.tasks


def test_an_infeasible_request_fails_at_once():
    c = Cluster(cpus=2)
    call = c.submit(make_call("f", resources={"GPU": 1}))
    out = c.take()
    assert executed(out) == [] and c.started(out) == []
    assert b"infeasible" in error_of(out, rid(call))
    assert call.task_id not in c.s.tasks


# ------------------------------------------------------------------ pipelining

def test_ready_tasks_are_pipelined_to_a_busy_worker_of_the_same_shape():
    c = Cluster(cpus=1, pipeline_depth=2)
    calls = [c.submit(make_call(f"t{i}")) for i in range(3)]
    other_shape = c.submit(make_call("half", cpus=0.5))
    out = c.take()
    # The first runs, the second waits in the worker's own queue, the rest in the scheduler.
    assert executed(out) == [(1, calls[0].task_id), (1, calls[1].task_id)]
    assert c.s.tasks[calls[2].task_id].state is TaskState.READY
    assert c.s.tasks[other_shape.task_id].state is TaskState.READY
    c.done(1, calls[0])
    assert executed(c.take()) == [(1, calls[2].task_id)]


def test_a_task_is_not_pipelined_while_a_cpu_is_free():
    # The second worker is still starting: the task waits for it rather than queueing
    # behind a task that may run for a long time.
    c = Cluster(cpus=2, connect=False)
    first, second = c.pool
    c.connect(first)
    c.take()
    a = c.submit(make_call("long"))
    b = c.submit(make_call("short"))
    assert executed(c.take()) == [(first, a.task_id)]
    c.connect(second)
    assert executed(c.take()) == [(second, b.task_id)]


def test_tasks_that_hold_nothing_pipeline_instead_of_starting_workers():
    # They always "fit": waiting for a new worker each time would grow the pool to
    # max_workers under a stream of them.
    c = Cluster(cpus=1, max_workers=8)
    a = c.submit(make_call("a", cpus=0))
    b = c.submit(make_call("b", cpus=0))
    out = c.take()
    assert executed(out) == [(1, a.task_id), (1, b.task_id)]
    assert c.started(out) == []


# ------------------------------------------------------------------ blocked workers

@pytest.mark.parametrize("order", ["blocked-then-returned", "returned-then-blocked"])
def test_a_blocked_worker_lends_its_cpu_and_its_queued_tasks_run_elsewhere(order):
    c = Cluster(cpus=1, max_workers=4)
    outer = c.submit(make_call("outer"))
    queued = c.submit(make_call("queued"))
    assert executed(c.take()) == [(1, outer.task_id), (1, queued.task_id)]
    conn = worker_conn(1)
    if order == "blocked-then-returned":
        c.s.blocked(conn, True)
        c.s.return_tasks(conn, [queued.task_id])
    else:
        c.s.return_tasks(conn, [queued.task_id])
        bounced = [t for w, t in executed(c.s.out) if w == 1]
        c.s.blocked(conn, True)
        c.s.return_tasks(conn, bounced)    # a blocked worker returns what reaches it
    assert c.worker(1).state is WorkerState.BLOCKED
    assert c.available()["CPU"] == 1.0
    out = c.take()
    [new] = c.started(out)
    c.connect(new)
    assert executed(c.take()) == [(new, queued.task_id)]
    assert c.s.tasks[queued.task_id].attempt == 1   # returned unstarted: not an attempt
    c.done(new, queued)
    c.s.blocked(conn, False)
    c.done(1, outer)
    assert c.available()["CPU"] == 1.0
    # The extra worker was only lent: one of the two idle workers is stopped.
    out = c.take()
    stopped = [ins.worker_id for ins in out if type(ins) is StopWorker]
    assert len(stopped) == 1 and len(c.s.workers) == 1
    # Asked first, so that it reports what it ran before it goes.
    assert sent(out, Shutdown, worker_conn(stopped[0])) == [Shutdown(worker_conn(stopped[0]))]


def test_nested_blocking_grows_the_pool_until_max_workers():
    c = Cluster(cpus=1, max_workers=3)
    chain = [c.submit(make_call("level0"))]
    running = {1}
    for level in range(1, 4):
        conn = worker_conn(max(running))
        c.s.blocked(conn, True)
        chain.append(c.submit(make_call(f"level{level}")))
        new = c.started(c.take())
        if len(c.s.workers) > 3 or not new:
            break
        c.connect(new[0])
        running.add(new[0])
        c.take()
    assert len(c.s.workers) == 3       # max_workers bounds the growth
    assert c.s.tasks[chain[-1].task_id].state is TaskState.READY


# ------------------------------------------------------------------ tasks run inline in a blocked get()

def nested_executed(out: list[Any]) -> list[tuple[int, bytes]]:
    """(worker id, task id) of every task sent to run inside a blocked get()."""
    return [(ins.conn - 100, ins.call.task_id) for ins in out
            if type(ins) is Execute and ins.nested]


def block(c: Cluster, worker_id: int, caller: Any, *waited: Any) -> None:
    """The task ``caller`` running on ``worker_id`` blocks in get() on ``waited``."""
    c.s.blocked(worker_conn(worker_id), True, [rid(w) for w in waited], caller.task_id, caller.name)


def test_a_blocked_worker_runs_the_task_it_waits_for_when_that_task_has_not_started():
    c = Cluster(cpus=1, max_workers=4)
    outer = c.submit(make_call("outer"))
    c.take()
    inner = c.submit(make_call("inner"), conn=worker_conn(1))
    assert executed(c.take()) == [(1, inner.task_id)]      # pipelined behind outer
    block(c, 1, outer, inner)
    c.s.return_tasks(worker_conn(1), [inner.task_id])      # the worker hands it back ...
    out = c.take()
    assert nested_executed(out) == [(1, inner.task_id)]    # ... and gets it to run inline
    assert c.started(out) == [] and executed(out) == []
    assert c.worker(1).state is WorkerState.BUSY and c.available()["CPU"] == 0.0
    c.done(1, inner)                                       # back in outer's get()
    assert c.worker(1).state is WorkerState.BLOCKED and c.available()["CPU"] == 1.0
    c.s.blocked(worker_conn(1), False)
    assert c.worker(1).state is WorkerState.BUSY and c.available()["CPU"] == 0.0
    c.done(1, outer)
    assert c.worker(1).state is WorkerState.IDLE and c.available()["CPU"] == 1.0


def test_a_task_that_becomes_ready_while_its_caller_is_blocked_runs_inline():
    c = Cluster(cpus=1, max_workers=4)
    arg = new_id() + bytes(4)
    c.s.directory.register_pending(DRIVER, [arg])           # an object nobody has made yet
    outer = c.submit(make_call("outer"))
    c.take()
    inner = c.submit(make_call("inner", (ref(arg),)), conn=worker_conn(1))
    block(c, 1, outer, inner)
    assert nested_executed(c.take()) == []        # waits for its argument
    assert c.worker(1).state is WorkerState.BLOCKED
    c.s.directory.put_for(DRIVER, inline_data(arg, 7))
    out = c.take()
    assert nested_executed(out) == [(1, inner.task_id)] and c.started(out) == []


def test_a_chain_of_tasks_each_waiting_for_the_next_nests_on_one_worker():
    # rec(n) = 1 + get(rec.remote(n - 1)): one blocked process per level filled
    # max_workers at n = 40 on 2 CPUs, and the cluster stalled for good.
    c = Cluster(cpus=1, max_workers=2)
    chain = [c.submit(make_call("rec"))]
    c.take()
    started = []
    for _ in range(100):
        nxt = c.submit(make_call("rec"), conn=worker_conn(1))
        queued = [t for w, t in executed(c.s.out) if w == 1]   # pipelined to it: handed back
        block(c, 1, chain[-1], nxt)
        c.s.return_tasks(worker_conn(1), queued)
        chain.append(nxt)
        out = c.take()
        assert nested_executed(out) == [(1, nxt.task_id)]
        started += c.started(out)
    assert len(c.worker(1).nested) == 100 and started == []
    for caller, callee in zip(reversed(chain[:-1]), reversed(chain[1:]), strict=True):
        c.done(1, callee)
        c.s.blocked(worker_conn(1), False)
        assert caller.task_id in c.s.tasks
    c.done(1, chain[0])
    assert c.worker(1).state is WorkerState.IDLE and c.available()["CPU"] == 1.0
    assert c.s.blocking.waiting_for == {}


@pytest.mark.parametrize("inner_resources", [
    {"CPU": 2.0},                # more CPU than the blocked task holds
    {"CPU": 1.0, "widget": 1.0},  # a resource it does not hold at all
])
def test_a_task_needing_more_than_the_blocked_task_holds_is_not_run_inline(inner_resources):
    c = Cluster(cpus=2, custom={"widget": 1}, max_workers=4)
    outer = c.submit(make_call("outer"))
    c.take()
    cpus = inner_resources.pop("CPU")
    inner = c.submit(make_call("inner", cpus=cpus, resources=inner_resources), conn=worker_conn(1))
    block(c, 1, outer, inner)
    out = c.take()
    assert nested_executed(out) == []
    assert c.worker(1).state is WorkerState.BLOCKED   # its CPU is lent instead


def test_a_block_that_names_no_objects_lends_its_cpu_and_runs_nothing_inline():
    # A get() outside the worker's main thread: that thread may not run tasks.
    c = Cluster(cpus=1, max_workers=4)
    outer = c.submit(make_call("outer"))
    c.take()
    inner = c.submit(make_call("inner"), conn=worker_conn(1))
    c.s.blocked(worker_conn(1), True)
    c.s.return_tasks(worker_conn(1), [inner.task_id])
    out = c.take()
    assert nested_executed(out) == [] and len(c.started(out)) == 1
    assert outer.task_id in c.s.tasks


def test_a_worker_that_dies_inside_nested_tasks_retries_each_running_one():
    c = Cluster(cpus=1, max_workers=4)
    outer = c.submit(make_call("outer", max_retries=1))
    c.take()
    inner = c.submit(make_call("inner", max_retries=1), conn=worker_conn(1))
    block(c, 1, outer, inner)
    c.s.return_tasks(worker_conn(1), [inner.task_id])
    c.take()
    c.s.worker_died(1, "killed")
    assert c.s.tasks[outer.task_id].retries_left == 0    # both were running: an attempt each
    assert c.s.tasks[inner.task_id].retries_left == 0
    assert c.s.blocking.waiting_for == {}


def test_a_task_submitted_by_a_running_task_starts_no_worker_until_its_submitter_blocks():
    # The submitter will most likely block on it and run it inline: a worker started
    # now would take the chain over and stay blocked for good (rec(1000) filled the cap).
    c = Cluster(cpus=1, max_workers=4)
    outer = c.submit(make_call("outer"))
    c.take()
    inner = c.submit(make_call("inner", cpus=0.5), conn=worker_conn(1))   # cannot pipeline
    assert c.started(c.take()) == []
    block(c, 1, outer, inner)
    out = c.take()
    assert nested_executed(out) == [(1, inner.task_id)] and c.started(out) == []


def test_a_task_held_back_from_starting_a_worker_starts_one_after_a_tick():
    # Its submitter runs on without waiting for it: it may not wait for ever.
    c = Cluster(cpus=2, max_workers=4)
    a = c.submit(make_call("a"))
    b = c.submit(make_call("b"))
    c.take()
    block(c, 1, a)                                  # lends a CPU: room for one more task
    spawned = c.submit(make_call("spawned"), conn=worker_conn(2))
    assert c.started(c.take()) == []
    c.s.blocking.tick(0.0)                          # the head's next tick (<= 0.5 s later)
    assert len(c.started(c.take())) == 1
    assert b.task_id in c.s.tasks and c.s.tasks[spawned.task_id].state is TaskState.READY


# ------------------------------------------------------------------ stalls

def stalls(out: list[Any]) -> list[tuple[int, Any]]:
    return [(ins.conn, ins) for ins in out if type(ins) is Stalled]


def deadlocked() -> tuple[Cluster, Any, Any]:
    """Two tasks, each holding the resource the other's subtask needs, both blocked."""
    c = Cluster(cpus=2, custom={"left": 1, "right": 1}, max_workers=4)
    a = c.submit(make_call("hold_left", resources={"left": 1}))
    b = c.submit(make_call("hold_right", resources={"right": 1}))
    assert sorted(executed(c.take())) == [(1, a.task_id), (2, b.task_id)]
    needs_right = c.submit(make_call("needs_right", resources={"right": 1}), conn=worker_conn(1))
    needs_left = c.submit(make_call("needs_left", resources={"left": 1}), conn=worker_conn(2))
    for wid, caller, callee in ((1, a, needs_right), (2, b, needs_left)):
        block(c, wid, caller, callee)
        # A blocked worker hands back what was pipelined to it (the other's subtask).
        c.s.return_tasks(worker_conn(wid), [t.call.task_id for t in list(c.worker(wid).queue)[1:]])
    c.take()
    assert c.s.tasks[needs_left.task_id].state is TaskState.READY
    assert c.s.tasks[needs_right.task_id].state is TaskState.READY
    return c, a, b


def test_a_stall_is_told_to_the_driver_once_it_held_for_stall_s_naming_the_blocked_tasks():
    c, a, b = deadlocked()
    c.s.blocking.check_stalled(100.0)
    c.s.blocking.check_stalled(100.0 + STALL_S - 0.5)
    assert stalls(c.take()) == []                   # not yet: it may still resolve
    c.s.blocking.check_stalled(100.0 + STALL_S + 0.5)
    [(conn, msg)] = stalls(c.take())
    assert conn == DRIVER
    assert sorted(msg.task_ids) == sorted([a.task_id, b.task_id])
    for name in ("hold_left()", "hold_right()", "needs_left()", "needs_right()",
                 a.task_id.hex(), b.task_id.hex()):
        assert name in msg.text
    c.s.blocking.check_stalled(100.0 + 10 * STALL_S)
    assert stalls(c.take()) == []                   # once per stall


def test_no_stall_is_told_while_a_task_runs():
    c, a, b = deadlocked()
    c.s.blocked(worker_conn(2), False)              # b's get() returned after all: it runs
    for t in (0.0, STALL_S * 3):
        c.s.blocking.check_stalled(t)
    assert stalls(c.take()) == []


def test_no_stall_is_told_while_a_worker_starts():
    c = Cluster(cpus=1, max_workers=4)
    outer = c.submit(make_call("outer"))
    c.take()
    block(c, 1, outer)                              # waits for something else
    inner = c.submit(make_call("inner", cpus=1), conn=worker_conn(1))
    assert len(c.started(c.take())) == 1            # a worker starts for inner
    assert c.s.tasks[inner.task_id].state is TaskState.READY
    for t in (0.0, STALL_S * 3):
        c.s.blocking.check_stalled(t)
    assert stalls(c.take()) == []


# ------------------------------------------------------------------ worker death

def test_worker_death_retries_the_running_task_then_fails_it():
    c = Cluster(cpus=2)
    call = c.submit(make_call("flaky", max_retries=1))
    assert executed(c.take()) == [(1, call.task_id)]
    c.s.worker_died(1, "signal SIGKILL")
    out = c.take()
    assert executed(out) == [(2, call.task_id)]     # retried on the idle worker
    assert len(c.started(out)) == 1                  # the dead one is replaced
    c.s.worker_died(2, "exit code 3")
    out = c.take()
    error = error_of(out, rid(call))
    assert b"crashed" in error and b"exit code 3" in error
    assert call.task_id not in c.s.tasks


def test_unlimited_retries_keep_retrying():
    c = Cluster(cpus=1)
    call = c.submit(make_call("flaky", max_retries=-1))
    wid = 1
    for _ in range(5):
        assert executed(c.take()) == [(wid, call.task_id)]
        c.s.worker_died(wid, "signal SIGSEGV")
        [wid] = c.started(c.s.out)
        c.connect(wid)
    assert c.s.tasks[call.task_id].state is TaskState.DISPATCHED


def test_tasks_queued_on_a_dead_worker_run_again_without_spending_a_retry():
    c = Cluster(cpus=1)
    running = c.submit(make_call("running"))
    queued = c.submit(make_call("queued"))
    c.take()
    c.s.worker_died(1, "signal SIGKILL")
    out = c.take()
    assert b"crashed" in error_of(out, rid(running))
    [new] = c.started(out)
    c.connect(new)
    assert executed(c.take()) == [(new, queued.task_id)]


def test_a_worker_that_disconnects_is_treated_as_dead():
    c = Cluster(cpus=1)
    call = c.submit(make_call("f"))
    c.take()
    c.s.client_disconnected(worker_conn(1), "exit code 1")
    assert b"exit code 1" in error_of(c.take(), rid(call))


def test_retry_exceptions_reruns_a_task_that_raised():
    c = Cluster(cpus=1)
    call = c.submit(make_call("f", max_retries=1, retry_exceptions=True))
    c.take()
    error = values.error_value(rid(call), b"raised")
    c.s.task_done(worker_conn(1), TaskDone(task_id=call.task_id, returns=[error],
                                              user_error=True))
    assert executed(c.take()) == [(1, call.task_id)]
    c.s.task_done(worker_conn(1), TaskDone(task_id=call.task_id, returns=[error],
                                              user_error=True))
    assert error_of(c.take(), rid(call)) == b"raised"


# ------------------------------------------------------------------ cancel

def test_cancel_a_task_waiting_for_its_arguments():
    c = Cluster(cpus=2)
    producer = c.submit(make_call("producer"))
    waiting = c.submit(make_call("waiting", (ref(rid(producer)),)))
    c.take()
    c.s.cancel(rid(waiting), force=False)
    assert b"cancelled" in error_of(c.take(), rid(waiting))
    assert c.s.objects[rid(producer)].waiting_tasks == []
    c.done(1, producer)
    assert executed(c.take()) == []


def test_cancel_a_task_in_the_ready_queue():
    c = Cluster(cpus=1, pipeline_depth=1)
    c.submit(make_call("running"))
    ready = c.submit(make_call("ready"))
    c.take()
    c.s.cancel(rid(ready), force=True)   # not running: nothing to kill
    out = c.take()
    assert b"cancelled" in error_of(out, rid(ready))
    assert not any(type(ins) is KillWorker for ins in out)
    assert not any(c.s.ready.values())


def test_cancel_a_running_task_asks_its_worker():
    c = Cluster(cpus=1)
    call = c.submit(make_call("running"))
    c.take()
    c.s.cancel(rid(call), force=False)
    assert c.take() == [CancelTask(worker_conn(1), call.task_id)]
    c.done(1, call, cancelled=True)
    assert b"cancelled" in error_of(c.take(), rid(call))
    assert c.worker(1).state is WorkerState.IDLE


def test_a_recursive_cancel_cancels_what_the_running_task_submitted():
    c = Cluster(cpus=2)
    parent = c.submit(make_call("parent"))
    c.take()
    # Waits for its argument: the parent's own result.
    child = c.submit(make_call("child", (ref(rid(parent)),)), conn=worker_conn(1))
    grandchild_of_other = c.submit(make_call("other"))
    c.take()
    c.s.cancel(rid(parent), force=False, recursive=True)
    out = c.take()
    child_result = pushes(out, worker_conn(1))[rid(child)]   # to its owner, the worker
    assert b"cancelled" in child_result.payload
    assert CancelTask(worker_conn(1), parent.task_id, recursive=True) in out
    assert not c.s.tasks[grandchild_of_other.task_id].cancelled


def test_a_cancel_that_is_not_recursive_leaves_the_children():
    c = Cluster(cpus=2)
    parent = c.submit(make_call("parent"))
    c.take()
    child = c.submit(make_call("child", (ref(rid(parent)),)), conn=worker_conn(1))
    c.take()
    c.s.cancel(rid(parent), force=False)
    c.take()
    assert not c.s.tasks[child.task_id].cancelled


def test_pending_tasks_counts_a_drivers_tasks_and_those_its_tasks_made():
    c = Cluster(cpus=1)
    first = c.submit(make_call("first"))
    c.submit(make_call("queued"))
    c.take()
    c.submit(make_call("child", (ref(rid(first)),)), conn=worker_conn(1))
    c.s.client_connected(DRIVER + 1, Hello(kind="driver", pid=2))
    c.submit(make_call("another driver's"), conn=DRIVER + 1)
    assert c.s.pending_tasks(DRIVER) == 3
    assert c.s.pending_tasks(DRIVER, own_only=True) == 2
    c.done(1, first)
    c.take()
    assert c.s.pending_tasks(DRIVER, own_only=True) == 1   # "queued"
    assert c.s.pending_tasks(DRIVER) == 2                   # and the child, now ready


def test_cancel_with_force_kills_the_worker_and_does_not_retry():
    c = Cluster(cpus=1)
    call = c.submit(make_call("running", max_retries=3))
    c.take()
    c.s.cancel(rid(call), force=True)
    assert c.take() == [KillWorker(NODE, 1, "cancelled with force=True")]
    c.s.worker_died(1, "cancelled with force=True")
    out = c.take()
    assert b"cancelled" in error_of(out, rid(call))
    assert executed(out) == []


def test_cancel_with_force_of_a_pipelined_task_does_not_kill_the_worker():
    c = Cluster(cpus=1)
    c.submit(make_call("running"))
    pipelined = c.submit(make_call("pipelined"))
    c.take()
    c.s.cancel(rid(pipelined), force=True)
    assert c.take() == [CancelTask(worker_conn(1), pipelined.task_id)]


@pytest.mark.parametrize("how", ["returned", "worker-died"])
def test_a_cancelled_task_handed_back_unstarted_is_not_run(how):
    # The cancel and the hand-back (a steal, a block, or the worker's death) cross: the
    # worker no longer has the task when the CancelTask reaches it, and says nothing.
    c = Cluster(cpus=1)
    c.submit(make_call("running"))
    pipelined = c.submit(make_call("pipelined"))
    c.take()
    c.s.cancel(rid(pipelined), force=False)
    c.take()
    if how == "returned":
        c.s.return_tasks(worker_conn(1), [pipelined.task_id])
    else:
        c.s.worker_died(1, "signal SIGKILL")
        c.connect(c.started(c.s.out)[0])
    out = c.take()
    assert pipelined.task_id not in {t for _, t in executed(out)}
    assert b"cancelled" in error_of(out, rid(pipelined))


def test_an_idle_worker_takes_back_tasks_pipelined_behind_a_running_one():
    c = Cluster(cpus=2)
    long = c.submit(make_call("long"))
    short = c.submit(make_call("short"))
    behind = c.submit(make_call("behind"))   # no CPU free: pipelined
    out = c.take()
    assert executed(out) == [(1, long.task_id), (2, short.task_id), (1, behind.task_id)]
    c.done(2, short)
    assert sent(c.take(), ReturnTasks, worker_conn(1)) == [ReturnTasks(worker_conn(1), [behind.task_id])]
    c.s.return_tasks(worker_conn(1), [behind.task_id])
    assert executed(c.take()) == [(2, behind.task_id)]


def test_cancelling_a_finished_task_does_nothing():
    c = Cluster(cpus=1)
    call = c.submit(make_call("f"))
    c.take()
    c.done(1, call, "result")
    c.take()
    c.s.cancel(rid(call), force=True)
    assert c.take() == []
    assert pickle.loads(c.s.objects[rid(call)].data.payload) == "result"


def test_a_result_that_arrives_after_a_cancel_is_kept():
    c = Cluster(cpus=1)
    call = c.submit(make_call("f"))
    c.take()
    c.s.cancel(rid(call), force=False)
    c.done(1, call, "finished first")      # the task ended before the cancel reached it
    assert pickle.loads(pushes(c.take())[rid(call)].payload) == "finished first"


# ------------------------------------------------------------------ reference counts

def test_increments_apply_before_decrements_in_one_batch():
    c = Cluster(cpus=1)
    oid = new_id() + bytes(4)
    c.s.directory.put(DRIVER, segment_data(oid, "seg-a"))
    c.s.directory.ref_delta(DRIVER, incr=[oid], decr=[oid])
    assert oid in c.s.objects and freed_segments(c.take()) == []
    c.s.directory.ref_delta(DRIVER, incr=[], decr=[oid])
    assert oid not in c.s.objects and freed_segments(c.take()) == ["seg-a"]


def test_freeing_a_segment_object_frees_its_segment():
    c = Cluster(cpus=1)
    oid = new_id() + bytes(4)
    c.s.directory.put(DRIVER, segment_data(oid, "seg-b"))
    c.take()
    c.s.directory.ref_delta(DRIVER, incr=[], decr=[oid])
    assert c.take() == [FreeSegment(NODE, "seg-b")]
    assert oid not in c.s.objects


def test_freeing_an_inline_object_frees_no_segment():
    c = Cluster(cpus=1)
    oid = new_id() + bytes(4)
    c.s.directory.put(DRIVER, inline_data(oid))
    c.s.directory.ref_delta(DRIVER, incr=[], decr=[oid])
    assert oid not in c.s.objects and freed_segments(c.take()) == []


def test_a_decrement_the_client_does_not_hold_is_ignored():
    c = Cluster(cpus=1)
    oid = new_id() + bytes(4)
    c.s.directory.put(DRIVER, inline_data(oid))
    c.s.directory.ref_delta(worker_conn(1), incr=[], decr=[oid])   # a worker that never held it
    assert oid in c.s.objects


def test_refs_contained_in_an_object_keep_the_inner_objects_alive():
    c = Cluster(cpus=1)
    inner, outer = new_id() + bytes(4), new_id() + bytes(4)
    c.s.directory.put(DRIVER, segment_data(inner, "seg-inner"))
    c.s.directory.put(DRIVER, inline_data(outer, contained=(inner,)))
    c.s.directory.ref_delta(DRIVER, incr=[], decr=[inner])
    assert inner in c.s.objects and freed_segments(c.take()) == []
    c.s.directory.ref_delta(DRIVER, incr=[], decr=[outer])
    assert outer not in c.s.objects and inner not in c.s.objects
    assert freed_segments(c.take()) == ["seg-inner"]


def test_a_queued_task_keeps_its_arguments_alive():
    c = Cluster(cpus=1, pipeline_depth=1)
    blocker = c.submit(make_call("blocker"))
    arg, nested = new_id() + bytes(4), new_id() + bytes(4)
    c.s.directory.put(DRIVER, segment_data(arg, "seg-arg"))
    c.s.directory.put(DRIVER, segment_data(nested, "seg-nested"))
    queued = c.submit(make_call("queued", (ref(arg), inline([1])), nested=(nested,)))
    c.take()
    c.s.directory.ref_delta(DRIVER, incr=[], decr=[arg, nested])
    assert arg in c.s.objects and nested in c.s.objects
    c.done(1, blocker)
    assert executed(c.take()) == [(1, queued.task_id)]
    c.done(1, queued)
    assert sorted(freed_segments(c.take())) == ["seg-arg", "seg-nested"]


def test_a_result_nobody_holds_is_freed_when_it_is_sealed():
    c = Cluster(cpus=1)
    call = c.submit(make_call("f"))
    c.take()
    c.s.directory.ref_delta(DRIVER, incr=[], decr=[rid(call)])
    assert rid(call) in c.s.objects          # pending: freed at seal
    c.s.task_done(worker_conn(1), TaskDone(task_id=call.task_id,
                                              returns=[segment_data(rid(call), "seg-r")]))
    out = c.take()
    assert rid(call) not in c.s.objects
    assert freed_segments(out) == ["seg-r"] and rid(call) not in pushes(out)


def test_a_disconnected_client_drops_every_ref_it_held():
    c = Cluster(cpus=1)
    other = 7
    c.s.client_connected(other, Hello(kind="driver", pid=2))
    oid = new_id() + bytes(4)
    c.s.directory.put(other, segment_data(oid, "seg-other"))
    c.s.directory.ref_delta(DRIVER, incr=[oid], decr=[])
    c.s.client_disconnected(other)
    assert oid in c.s.objects
    c.s.directory.ref_delta(DRIVER, incr=[], decr=[oid])
    assert freed_segments(c.take()) == ["seg-other"]


# ------------------------------------------------------------------ subscribe

def test_subscribing_to_an_unknown_object_gets_a_lost_error():
    c = Cluster(cpus=1)
    c.s.directory.subscribe(DRIVER, [b"?" * 16])
    assert b"lost" in error_of(c.take(), b"?" * 16)


def test_a_subscriber_gets_the_object_when_it_is_sealed():
    c = Cluster(cpus=1)
    other = 7
    c.s.client_connected(other, Hello(kind="driver", pid=2))
    call = c.submit(make_call("f"))
    c.take()
    c.s.directory.subscribe(other, [rid(call)])
    assert pushes(c.take(), other) == {}
    c.done(1, call)
    assert rid(call) in pushes(c.take(), other)


# ------------------------------------------------------------------ task states

ALL_STATES = list(TaskState)


@pytest.mark.parametrize("old, new", [
    (a, b) for a in ALL_STATES for b in ALL_STATES if b not in TASK_TRANSITIONS[a]
], ids=lambda s: s.value)
def test_an_illegal_task_transition_raises(old, new):
    t = Task(make_call("f"), DRIVER)
    t.state = old
    with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value}"):
        t.move(new)


@pytest.mark.parametrize("old, new", [
    (a, b) for a in ALL_STATES for b in sorted(TASK_TRANSITIONS[a], key=lambda s: s.value)
], ids=lambda s: s.value)
def test_a_legal_task_transition_moves(old, new):
    t = Task(make_call("f"), DRIVER)
    t.state = old
    t.move(new)
    assert t.state is new


def test_a_finished_task_cannot_run_again():
    c = Cluster(cpus=1)
    call = c.submit(make_call("f"))
    t = c.s.tasks[call.task_id]
    c.done(1, call)
    assert t.state is TaskState.DONE
    with pytest.raises(IllegalTransition):
        t.move(TaskState.READY)


def test_a_node_removed_while_one_of_its_workers_waits_for_a_task_its_other_one_ran():
    # remove_node schedules between its workers' deaths: the task the dead one ran was
    # ready again and went to run inline in the other's blocked get(), whose node was
    # gone already (KeyError in the head's connection_lost; the soak's round hung).
    c = Cluster(cpus=0, workers=0)
    c.s.add_node(2, {"CPU": 2.0, "far": 2.0}, num_workers=2, max_workers=2)
    w1, w2 = c.started(c.take())
    for w in (w1, w2):
        c.connect(w)
    c.take()
    outer = c.submit(make_call("outer", resources={"far": 1.0}))
    ((waiter, _),) = executes(c.take())
    other = w2 if waiter == w1 else w1
    inner = c.submit(make_call("inner", resources={"far": 1.0}, max_retries=3),
                     conn=worker_conn(waiter))
    out = c.take()
    assert executed(out) == [(other, inner.task_id)]   # the waiter is busy with outer
    block(c, waiter, outer, inner)
    c.take()
    # The worker that ran the task dies first in remove_node's loop, the waiter second.
    c.s.workers[other] = c.s.workers.pop(other)
    c.s.workers[waiter] = c.s.workers.pop(waiter)
    c.s.remove_node(2, "killed")
    assert 2 not in c.s.nodes
    assert nested_executed(c.take()) == []
