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
