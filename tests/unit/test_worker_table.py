"""The scheduler's worker table (orchestra/_scheduler/model.py, WorkerTable): its
indexes (each node's workers, each node's idle ones) are what a scan of the table finds
after any sequence of workers put in, changing state, replaced, deleted, popped and
cleared; a worker out of the table no longer reaches it. Placement reads the indexes
instead of scanning every worker of the cluster (WorkerPool.pick_placed)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestra._scheduler.model import Worker, WorkerState, WorkerTable

STATES = list(WorkerState)


def _scan(table: WorkerTable) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    by_node: dict[int, set[int]] = {}
    idle: dict[int, set[int]] = {}
    for wid, w in table.items():
        by_node.setdefault(w.node_id, set()).add(wid)
        if w.state is WorkerState.IDLE:
            idle.setdefault(w.node_id, set()).add(wid)
    return by_node, idle


def _indexes(table: WorkerTable) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    return ({n: set(ws) for n, ws in table.by_node.items()},
            {n: set(ws) for n, ws in table.idle_by_node.items()})


def test_an_idle_worker_is_found_by_its_node_and_the_last_one_idle_first() -> None:
    table = WorkerTable()
    a, b, c = Worker(1, 0), Worker(2, 0), Worker(3, 1)
    for w in (a, b, c):
        table[w.worker_id] = w
    assert table.idle_on(0) is None and list(table.on_node(0)) == [a, b]
    a.state = WorkerState.IDLE
    b.state = WorkerState.IDLE
    assert table.idle_on(0) is b and table.idle_on(1) is None
    b.state = WorkerState.BUSY
    assert table.idle_on(0) is a
    b.state = WorkerState.IDLE
    assert table.idle_on(0) is b
    del table[2]
    del table[1]
    assert table.idle_on(0) is None and a.table is None
    a.state = WorkerState.IDLE              # out of the table: the table does not hear it
    assert table.idle_on(0) is None
    assert table.pop(3) is c and table.pop(3, None) is None
    assert _indexes(table) == ({}, {}) and not table


@given(st.lists(st.tuples(st.sampled_from(["put", "state", "del", "pop", "clear"]),
                          st.integers(0, 5), st.integers(0, 2), st.sampled_from(STATES)),
                max_size=60))
def test_the_indexes_are_what_a_scan_finds_after_any_changes(ops) -> None:
    table = WorkerTable()
    gone: list[Worker] = []
    for op, wid, node, state in ops:
        if op == "put":                     # a new worker, or one replacing that id
            w = Worker(wid, node)
            w.state = state
            old = table.get(wid)
            table[wid] = w
            if old is not None:
                gone.append(old)
        elif op == "state" and wid in table:
            table[wid].state = state
        elif op == "del" and wid in table:
            gone.append(table[wid])
            del table[wid]
        elif op == "pop":
            w = table.pop(wid, None)
            if w is not None:
                gone.append(w)
        elif op == "clear":
            gone.extend(table.values())
            table.clear()
        for w in gone:                      # a worker gone changes state: no effect
            w.state = state
            assert w.table is None
        assert _indexes(table) == _scan(table)
        assert all(table.by_node.values()) and all(table.idle_by_node.values())   # none empty


def _busy(table: WorkerTable, wid: int, node: int, queued: int, shape=(("CPU", 1.0),)) -> Worker:
    w = Worker(wid, node)
    w.grant_shape = shape
    table[wid] = w
    w.queue.extend(object() for _ in range(queued))   # (before: indexed under this length)
    w.state = WorkerState.BUSY
    return w


def test_the_pipelining_pick_is_the_least_queued_worker_however_queues_grew() -> None:
    shape = (("CPU", 1.0),)
    table = WorkerTable()
    a, b, c = _busy(table, 1, 0, 1), _busy(table, 2, 0, 1), _busy(table, 3, 1, 3)
    assert table.pipeline_pick(shape, 8) is a            # ties: the first indexed
    a.queue.extend([object(), object()])                 # no notice: filed under 1, has 3
    assert table.pipeline_pick(shape, 8) is b
    b.queue.extend([object()] * 5)                       # 6
    assert table.pipeline_pick(shape, 8) in (a, c)       # 3 each
    assert table.pipeline_pick(shape, 8, only=1) is c    # a node's own only
    a.queue.pop()                                        # shorter: told, as the scheduler does
    table.may_pipeline(a)
    assert table.pipeline_pick(shape, 8) is a            # 2
    assert table.pipeline_pick(shape, 3) is a and table.pipeline_pick(shape, 2) is None
    a.lent_to = 5                                        # lent: none of it
    assert table.pipeline_pick(shape, 8) is c
    c.state = WorkerState.IDLE
    assert table.pipeline_pick(shape, 8) is b            # 6 < 8
    assert table.pipeline_pick((("CPU", 2.0),), 8) is None


@given(st.lists(st.tuples(st.sampled_from(["grow", "shrink", "lend", "back", "idle", "busy"]),
                          st.integers(0, 5)), max_size=50))
def test_the_pipelining_pick_equals_a_scan_for_the_least_queued(ops) -> None:
    """Queues grow without a notice and shrink with one (as in the scheduler); after any
    of it the pick's queue length is the shortest a scan finds below the depth."""
    shape, depth = (("CPU", 1.0),), 4
    table = WorkerTable()
    workers = [_busy(table, wid, wid % 2, wid % 3) for wid in range(6)]
    for op, i in ops:
        w = workers[i]
        if op == "grow":
            w.queue.append(object())
        elif op == "shrink" and w.queue:
            w.queue.pop()
            table.may_pipeline(w)
        elif op == "lend":
            w.lent_to = 9
        elif op == "back":
            w.lent_to = None
            table.may_pipeline(w)
        elif op == "idle":
            w.state = WorkerState.IDLE
        elif op == "busy":
            w.state = WorkerState.BUSY
        free = [len(x.queue) for x in workers
                if x.state is WorkerState.BUSY and x.lent_to is None and len(x.queue) < depth]
        got = table.pipeline_pick(shape, depth)
        assert (None if got is None else len(got.queue)) == (min(free) if free else None)
