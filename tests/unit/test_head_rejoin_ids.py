"""A restarted head's ids (orchestra/_head/rejoin.py): workers and connections start
above every id a head before it gave (the store counts heads), a joined node gets its
id of before back unless another node holds or held it, and the next node's id is kept
in the store; the joined nodes serving are kept there too, and a restarted head waits
for them. No processes: a head's parts, without its loop's I/O."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orchestra._head import rejoin
from orchestra._head.pulls import Pulls
from orchestra._head.state_store import CLUSTER
from orchestra._scheduler.durable import NODES
from orchestra._scheduler.jobs import JobBook
from orchestra._scheduler.state import SchedulerState

pytestmark = pytest.mark.timeout(30)


class Store:
    """The parts of HeadState rejoin reads and writes."""

    def __init__(self, boots: int, next_node: int, nodes: tuple[int, ...] = ()) -> None:
        self.boots, self.next_node = boots, next_node
        self.written: list[tuple[str, str, bytes | None]] = []
        self.nodes = {str(n): b"" for n in nodes}
        self.stopped = False

    def records(self) -> dict[str, dict[str, bytes]]:
        return {NODES: dict(self.nodes)}

    def write(self, table: str, key: str, value: bytes | None) -> None:
        self.written.append((table, key, value))
        if table == NODES:
            if value is None:
                self.nodes.pop(key, None)
            else:
                self.nodes[key] = value

    def stop(self) -> None:
        self.stopped = True


class Head:
    def __init__(self, durable: Store | None) -> None:
        self.state = SchedulerState()
        self.durable: Any = durable
        self.next_node_id = 2
        self.next_conn = 1
        self.nodes: dict[int, Any] = {0: object()}
        self.gone: dict[int, Any] = {}
        self.cfg: dict[str, Any] = {}
        self.loop = asyncio.new_event_loop()
        self.pulls = Pulls(self)   # type: ignore[arg-type]
        self.jobs = JobBook()

    def carry_out(self) -> None:
        pass


def test_the_third_head_starts_its_ids_above_those_of_the_two_before() -> None:
    head = Head(Store(boots=3, next_node=9))
    head.cfg["reconnect_timeout_s"] = 30.0
    rejoin.restore(head, 2, -1)   # type: ignore[arg-type]
    assert head.state.start_worker(0).worker_id == (2 << 32) + 1
    assert head.next_conn == (2 << 32) + 1 and head.next_node_id == 9
    # Readers of objects it does not know yet wait while the drivers come back.
    assert 29.0 < head.pulls.recover_until - head.pulls.clock() <= 30.0
    head.loop.close()


def test_the_first_head_and_one_without_a_store_start_at_one() -> None:
    for durable in (Store(boots=1, next_node=0), None):
        head = Head(durable)
        rejoin.restore(head, 2, -1)   # type: ignore[arg-type]
        assert head.state.start_worker(0).worker_id == 1 and head.next_conn == 1
        assert head.pulls.recover_until == 0.0   # nothing to wait for
        head.loop.close()


def test_a_node_gets_its_id_of_before_back_unless_it_is_taken() -> None:
    store = Store(boots=2, next_node=5)
    head = Head(store)
    rejoin.restore(head, 2, -1)   # type: ignore[arg-type]
    assert rejoin.node_id_for(head, 3, 2) == 3      # free: its own again
    head.nodes[3] = object()
    assert rejoin.node_id_for(head, 3, 2) == 5      # held by another: a new one
    head.gone[7] = object()
    assert rejoin.node_id_for(head, 7, 2) == 6      # held by one that died
    assert rejoin.node_id_for(head, 0, 2) == 7      # a new node
    assert rejoin.node_id_for(head, 1, 2) == 8      # never the head's own ids
    assert store.written[-1] == (CLUSTER, "next_node", b"9")
    head.loop.close()


def test_a_restarted_head_waits_for_the_joined_nodes_of_before_and_their_workers() -> None:
    """The store names the joined nodes serving; a head started on it runs no task made
    ready until each joined again (or its wait ran out) and the workers each names
    connected or exited; a node that leaves, or a head that stops, drops its record."""
    store = Store(boots=2, next_node=4, nodes=(2, 3))
    head = Head(store)
    rejoin.restore(head, 2, -1)   # type: ignore[arg-type]
    kept = head.state.kept
    assert kept.parking and set(kept.nodes) == {2, 3}
    rejoin.node_back(head, 2, [])                   # (its record written again)
    assert kept.parking and set(kept.nodes) == {3}
    rejoin.node_back(head, 3, [7, 8])               # two workers of before live there
    assert kept.parking and set(kept.awaited) == {7, 8}
    kept.worker_gone(7)                             # exited before it connected
    assert kept.parking
    kept.tick(1e12)                                 # 8's wait ran out
    assert not kept.parking and not kept.active
    rejoin.node_left(head, 2)
    assert store.nodes == {"3": b""}
    rejoin.stop_store(head)   # type: ignore[arg-type]
    assert store.nodes == {} and store.stopped
    head.loop.close()


def test_a_head_without_a_store_waits_for_no_node() -> None:
    head = Head(None)
    rejoin.restore(head, 2, -1)   # type: ignore[arg-type]
    rejoin.node_back(head, 2, [])   # type: ignore[arg-type]
    assert not head.state.kept.parking
    head.loop.close()


class Timers:
    """A loop's call_later that the test runs by hand."""

    def __init__(self) -> None:
        self.due: list[tuple[float, Any, tuple[Any, ...]]] = []

    def call_later(self, delay: float, fn: Any, *args: Any) -> None:
        self.due.append((delay, fn, args))

    def run(self) -> None:
        due, self.due = self.due, []
        for _, fn, args in due:
            fn(*args)


def test_a_restarted_heads_reader_of_an_unknown_object_waits_until_the_window_ends() -> None:
    # A task carried over the restart locates its argument before the driver that made
    # it has come back: it is not told "freed" until the recovery window is over.
    from orchestra._protocol import wire as _wire
    now = [100.0]
    answers: list[Any] = []

    class Conn:
        conn_id = 7

    conn = Conn()

    class PullsHead:
        state = SchedulerState()
        loop = Timers()
        conns = {7: conn}

        def queue_if_open(self, c: Any, data: bytes) -> None:
            if self.conns.get(c.conn_id) is c:
                answers.extend(reply for _, reply in _wire.FrameDecoder().feed(data))

    head = PullsHead()
    pulls = Pulls(head, clock=lambda: now[0])   # type: ignore[arg-type]
    pulls.recover_until = 130.0
    oid = b"\x01" * 28
    pulls.locate(conn, 1, oid)   # type: ignore[arg-type]
    assert answers == [] and len(head.loop.due) == 1
    now[0] = 120.0
    head.loop.run()
    assert answers == [] and len(head.loop.due) == 1   # still waiting, asked again
    now[0] = 131.0
    head.loop.run()
    assert [a.error_kind for a in answers] == ["ObjectLostError"] and not head.loop.due
    # A reader that left meanwhile is not answered, nor asked after again.
    answers.clear()
    now[0], pulls.recover_until = 0.0, 10.0
    pulls.locate(conn, 2, oid)   # type: ignore[arg-type]
    head.conns.clear()
    head.loop.run()
    assert answers == [] and not head.loop.due
