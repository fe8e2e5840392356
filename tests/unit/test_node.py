"""Node: one machine's object store and worker pool, driven through its commands alone.

No head, no processes, no sockets: a fake NodeHost records what the node reports, a
fake loop runs what the node schedules when a test says so, and a fake pool stands in
for worker processes. Segments are real files in the store's private directory under
/dev/shm (removed by each test); spilling copies them to a temporary directory.
"""
from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestra._node.node import Node, worker_socket
from orchestra._objects.errors import describe_exit
from orchestra._objects.segments import open_segment, segment_path
from orchestra._objects.slabs import is_slot
from orchestra._protocol import pb
from orchestra._protocol import wire as _wire

pytestmark = pytest.mark.timeout(30)

KiB = 1 << 10
MiB = 1 << 20
SEG = 64 * KiB            # the smallest size class: objects of this size fill one each
WRITER, READER, OTHER = 5, 6, 7


class FakeHost:
    """Records the node's events; relocates every object unless told otherwise."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int, Any]] = []
        self.relocated: list[tuple[bytes, Any]] = []
        self.failed: list[tuple[int, str]] = []
        self.exited: list[tuple[int, str, bool]] = []
        self.flushes = 0
        self.idle = True
        self.accept_relocate = True

    def send(self, conn_id: int, kind: int, msg: Any) -> None:
        self.sent.append((conn_id, kind, msg))

    def flush(self) -> None:
        self.flushes += 1

    def worker_failed_to_start(self, worker_id: int, reason: str) -> None:
        self.failed.append((worker_id, reason))

    def worker_exited(self, worker_id: int, reason: str, *, connected: bool) -> None:
        self.exited.append((worker_id, reason, connected))

    def relocate(self, object_id: bytes, segment: Any) -> bool:
        self.relocated.append((object_id, segment))
        return self.accept_relocate

    def is_idle(self) -> bool:
        return self.idle

    def frames(self, kind: int, conn: int | None = None) -> list[Any]:
        return [m for c, k, m in self.sent if k == kind and (conn is None or c == conn)]

    def replies(self, conn: int | None = None) -> list[Any]:
        return self.frames(_wire.REPLY, conn)


class FakeLoop:
    """call_later waits for run_timers(); call_soon_threadsafe (from the node's threads)
    waits for run_until()."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Callable[..., Any], tuple[Any, ...]]] = []
        self.ready: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.Queue()

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.timers.append((delay, fn, args))

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        self.ready.put((fn, args))

    def run_timers(self) -> None:
        timers, self.timers = self.timers, []
        for _, fn, args in timers:
            fn(*args)

    def run_until(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            assert left > 0, "the node's thread did not report back in time"
            fn, args = self.ready.get(timeout=left)
            fn(*args)


class FakeProc:
    def __init__(self) -> None:
        self.returncode: int | None = None
        self.killed = False

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.killed = True
        self.returncode = -9


class FakePool:
    """WorkerPool's interface as the node uses it; start() makes a live fake process."""

    def __init__(self) -> None:
        self.procs: dict[int, FakeProc] = {}
        self.zygote = None
        self.closed = False

    def start(self, worker_id: int) -> None:
        self.procs[worker_id] = FakeProc()

    def snapshot(self) -> list[tuple[int, FakeProc]]:
        return list(self.procs.items())

    def kill(self, worker_id: int) -> None:
        p = self.procs.get(worker_id)
        if p is not None:
            p.kill()

    def kill_all(self) -> None:
        self.closed = True


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()


@pytest.fixture
def loop() -> FakeLoop:
    return FakeLoop()


@pytest.fixture
def make_node(host: FakeHost, loop: FakeLoop, tmp_path: Path) -> Iterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def make(capacity: int = 4 * SEG, **kw: Any) -> Node:
        kw.setdefault("spill_dir", str(tmp_path / "spill"))
        node = Node(3, host, loop, session_id="unit", session_dir=str(tmp_path),
                    sock_path=str(tmp_path / "head.sock"), capacity=capacity, **kw)
        nodes.append(node)
        return node
    yield make
    for node in nodes:
        node.close()


_req_ids = iter(range(1, 1 << 30))


def create(node: Node, conn: int, oid: bytes, size: int = SEG) -> int:
    req = pb.Request(req_id=next(_req_ids))
    req.create_segment.object_id = oid
    req.create_segment.size = size
    node.create_segment(conn, req)
    return req.req_id


def put(node: Node, host: FakeHost, oid: bytes, conn: int = WRITER) -> Any:
    """Create, write and seal one object as a writer does; returns its Segment."""
    rid = create(node, conn, oid)
    (reply,) = [r for r in host.replies(conn) if r.req_id == rid]
    assert not reply.error, reply.error
    mm = open_segment(node.shm_dir, reply.segment)
    mm[:4] = oid[:4]
    mm.close()
    assert node.seal(reply.segment.name)
    return reply.segment


def oid(i: int) -> bytes:
    return i.to_bytes(16, "big")


# ---------------------------------------------------------------- objects


def test_a_create_is_answered_with_a_segment_of_this_node(make_node: Any, host: FakeHost) -> None:
    node = make_node()
    rid = create(node, WRITER, oid(1), 1000)
    (reply,) = host.replies(WRITER)
    assert reply.req_id == rid and not reply.error
    assert reply.segment.node_id == 3 and reply.segment.size == 1000
    assert node.store_info().used == SEG


def test_a_freed_segment_is_kept_warm_and_handed_out_again(make_node: Any, host: FakeHost) -> None:
    node = make_node()
    seg = put(node, host, oid(1))
    node.free_segment(seg.name)
    info = node.store_info()
    assert (info.used, info.pooled) == (0, SEG)
    create(node, WRITER, oid(2))
    assert host.replies(WRITER)[-1].segment.reused


def test_a_pinned_segment_is_reused_only_after_its_reader_unpins(make_node: Any,
                                                                 host: FakeHost) -> None:
    node = make_node(capacity=SEG)
    seg = put(node, host, oid(1))
    node.pin(READER, [seg.name])
    node.free_segment(seg.name)
    assert node.store_info().used == SEG   # retired: a live view may read it
    node.unpin(READER, [seg.name])
    assert node.store_info().used == 0


def test_an_aborted_segment_gives_its_bytes_back_and_its_file_goes(make_node: Any,
                                                                   host: FakeHost) -> None:
    node = make_node(capacity=8 * MiB)
    create(node, WRITER, oid(1), 3 * MiB)   # a segment of its own (above SLAB_MAX)
    seg = host.replies(WRITER)[-1].segment
    assert not is_slot(seg.name)
    open_segment(node.shm_dir, seg).close()
    node.abort_segment(WRITER, seg.name)
    assert node.store_info().used == 0
    assert not os.path.exists(segment_path(node.shm_dir, seg.name))


def test_an_aborted_slot_gives_its_bytes_back_and_is_reused(make_node: Any,
                                                            host: FakeHost) -> None:
    """A slot's file is its slab, the store's own: what a writer left there is sound
    to write again, so an aborted slot is pooled, not removed."""
    node = make_node()
    create(node, WRITER, oid(1))
    seg = host.replies(WRITER)[-1].segment
    assert is_slot(seg.name)
    open_segment(node.shm_dir, seg).close()
    node.abort_segment(WRITER, seg.name)
    assert node.store_info().used == 0
    assert os.path.exists(segment_path(node.shm_dir, seg.name))
    create(node, WRITER, oid(2))
    assert host.replies(WRITER)[-1].segment.name == seg.name


def test_a_writer_is_told_to_drop_its_map_of_a_segment_the_store_unlinks(
        make_node: Any, host: FakeHost) -> None:
    node = make_node(capacity=8 * MiB)
    create(node, WRITER, oid(1), 3 * MiB)
    seg = host.replies(WRITER)[-1].segment
    node.abort_segment(WRITER, seg.name)   # never pooled: unlinked
    (drop,) = host.frames(_wire.DROP_MAPS, WRITER)
    assert list(drop.names) == [seg.name]


def test_a_closed_connection_loses_its_unsealed_segments(make_node: Any, host: FakeHost) -> None:
    node = make_node()
    create(node, WRITER, oid(1))
    node.drop_conn(WRITER)
    assert node.store_info().used == 0


def test_a_create_larger_than_the_store_is_refused_naming_the_remedy(make_node: Any,
                                                                     host: FakeHost) -> None:
    node = make_node(capacity=SEG)
    create(node, WRITER, oid(1), 2 * SEG)
    (reply,) = host.replies(WRITER)
    assert reply.error_kind == "ObjectStoreFullError"
    assert "object_store_memory" in reply.error


# ---------------------------------------------------------------- spilling


def test_a_create_that_needs_room_waits_for_a_spill_then_is_answered(
        make_node: Any, host: FakeHost, loop: FakeLoop, tmp_path: Path) -> None:
    node = make_node(capacity=SEG)
    first = put(node, host, oid(1))
    rid = create(node, WRITER, oid(2))
    assert len(host.replies(WRITER)) == 1   # the second waits for the first to be spilled
    loop.run_until(lambda: len(host.replies(WRITER)) == 2)
    assert host.replies(WRITER)[-1].req_id == rid and not host.replies(WRITER)[-1].error
    (moved_id, moved), = host.relocated
    assert moved_id == oid(1) and moved.name == first.name
    assert moved.path == str(tmp_path / "spill" / first.name)
    with open(moved.path, "rb") as f:
        assert f.read(4) == oid(1)[:4]
    assert node.store_info().spilled_objects == 1
    assert host.flushes >= 1


def test_creates_that_wait_for_room_are_answered_in_the_order_they_came(
        make_node: Any, host: FakeHost, loop: FakeLoop) -> None:
    node = make_node(capacity=2 * SEG)
    put(node, host, oid(1))
    put(node, host, oid(2))
    asked = [create(node, c, oid(10 + c)) for c in (WRITER, OTHER)]
    loop.run_until(lambda: len(host.replies()) == 4)
    assert [r.req_id for r in host.replies()][2:] == asked


def test_a_waiting_create_of_a_closed_connection_is_dropped_and_the_next_answered(
        make_node: Any, host: FakeHost, loop: FakeLoop) -> None:
    node = make_node(capacity=SEG)
    put(node, host, oid(1))
    create(node, OTHER, oid(2))
    rid = create(node, WRITER, oid(3))
    node.drop_conn(OTHER)
    loop.run_until(lambda: len(host.replies(WRITER)) == 2)
    assert host.replies(WRITER)[-1].req_id == rid and not host.replies(OTHER)


def test_a_spill_file_of_an_object_freed_meanwhile_is_removed(
        make_node: Any, host: FakeHost, loop: FakeLoop) -> None:
    node = make_node(capacity=SEG)
    put(node, host, oid(1))
    host.accept_relocate = False   # the object was freed while its copy ran
    create(node, WRITER, oid(2))
    loop.run_until(lambda: len(host.replies(WRITER)) == 2)
    (_, moved), = host.relocated
    assert not os.path.exists(moved.path)
    assert node.store_info().spilled_objects == 0


def test_without_a_spill_directory_a_full_store_refuses_saying_spilling_is_off(
        make_node: Any, host: FakeHost) -> None:
    node = make_node(capacity=SEG, spill_dir=None)
    put(node, host, oid(1))
    create(node, WRITER, oid(2))
    reply = host.replies(WRITER)[-1]
    assert reply.error_kind == "ObjectStoreFullError" and "spilling to disk is off" in reply.error


def _create_behind_a_readers_map(make_node: Any, host: FakeHost) -> tuple[Node, Any, int]:
    """A full store whose one object a reader maps, and a create that needs its room:
    (the node, that object's segment, the create's request id)."""
    node = make_node(capacity=SEG)
    seg = put(node, host, oid(1))
    node.pin(READER, [seg.name])
    return node, seg, create(node, WRITER, oid(2))


def _answered_without_error(host: FakeHost, loop: FakeLoop, rid: int) -> bool:
    loop.run_timers()
    loop.run_until(lambda: len(host.replies(WRITER)) == 2)
    return host.replies(WRITER)[-1].req_id == rid and not host.replies(WRITER)[-1].error


def test_readers_are_asked_to_let_go_of_maps_that_keep_the_room(
        make_node: Any, host: FakeHost, loop: FakeLoop) -> None:
    node, seg, rid = _create_behind_a_readers_map(make_node, host)
    (release,) = host.frames(_wire.RELEASE_MAPS, READER)
    assert list(release.names) == [seg.name]
    node.unpin(READER, [seg.name])
    assert _answered_without_error(host, loop, rid)   # the retry after a round trip


def test_a_reader_slow_to_let_go_of_its_maps_is_waited_for(
        make_node: Any, host: FakeHost, loop: FakeLoop) -> None:
    # A busy machine: the reader's answer to RELEASE_MAPS comes after the first retry.
    node, seg, rid = _create_behind_a_readers_map(make_node, host)
    assert host.frames(_wire.RELEASE_MAPS, READER)
    loop.run_timers()                      # the retry: the map still stands
    loop.run_timers()
    assert len(host.replies(WRITER)) == 1  # no answer yet (not "store full")
    assert len(host.frames(_wire.RELEASE_MAPS, READER)) == 1   # asked once
    node.unpin(READER, [seg.name])
    assert _answered_without_error(host, loop, rid)


def test_a_map_a_reader_keeps_fails_the_create_once_the_retries_are_spent(
        make_node: Any, host: FakeHost, loop: FakeLoop) -> None:
    _create_behind_a_readers_map(make_node, host)   # a value it holds: the map stays
    for _ in range(40):
        if not loop.timers:
            break
        loop.run_timers()
    reply = host.replies(WRITER)[-1]
    assert len(host.replies(WRITER)) == 2 and reply.error_kind == "ObjectStoreFullError"
    assert "in use" in reply.error and not loop.timers


# ---------------------------------------------------------------- warming


def test_the_warm_reserve_is_offered_to_the_driver_to_map_ahead(
        make_node: Any, host: FakeHost, loop: FakeLoop) -> None:
    node = make_node(warm_bytes=SEG)
    node.set_driver(WRITER)
    node.warm()
    loop.run_until(lambda: bool(host.frames(_wire.MAP_AHEAD)))
    (offer,) = host.frames(_wire.MAP_AHEAD, WRITER)
    assert len(offer.names) == 1 and node.store_info().pooled == SEG


# ---------------------------------------------------------------- workers


@pytest.fixture
def pooled_node(make_node: Any) -> Node:
    node = make_node()
    node.pool = FakePool()
    return node


def test_a_worker_that_exits_before_it_connects_is_reported_with_its_status(
        pooled_node: Node, host: FakeHost, loop: FakeLoop) -> None:
    pooled_node.start_worker(11)
    pooled_node.pool.procs[11].returncode = 3
    pooled_node._watch()
    assert host.exited == [(11, describe_exit(3), False)]
    assert 11 not in pooled_node.pool.procs


def test_a_connected_worker_is_reported_once_its_connection_closes(
        pooled_node: Node, host: FakeHost, loop: FakeLoop) -> None:
    pooled_node.start_worker(11)
    pooled_node.worker_connected(11)
    pooled_node.pool.procs[11].returncode = -11
    pooled_node._watch()
    assert host.exited == []             # its connection's end reports it
    pooled_node.worker_disconnected(11)
    assert host.exited == [(11, describe_exit(-11), True)]


def test_a_killed_worker_is_reported_with_the_reason_it_was_killed(
        pooled_node: Node, host: FakeHost) -> None:
    pooled_node.start_worker(11)
    pooled_node.worker_connected(11)
    pooled_node.kill_worker(11, "cancelled with force=True")
    pooled_node.worker_disconnected(11)
    assert host.exited == [(11, "cancelled with force=True", True)]


def test_a_worker_that_lingers_after_its_connection_closed_is_killed(
        pooled_node: Node, host: FakeHost, loop: FakeLoop, monkeypatch: Any) -> None:
    import orchestra._node.node as node_module
    monkeypatch.setattr(node_module, "_REAP_LIMIT_S", 0.0)
    pooled_node.start_worker(11)
    pooled_node.worker_connected(11)
    proc = pooled_node.pool.procs[11]
    pooled_node.worker_disconnected(11)
    assert proc.killed and host.exited == [(11, describe_exit(None), True)]


def test_a_reaped_worker_leaves_no_socket_for_direct_calls(
        pooled_node: Node, host: FakeHost, tmp_path: Path) -> None:
    pooled_node.start_worker(11)
    pooled_node.worker_connected(11)
    path = worker_socket(str(tmp_path), 11)
    Path(path).touch()
    pooled_node.pool.procs[11].returncode = 0
    pooled_node.worker_disconnected(11)
    assert not os.path.exists(path)


def test_a_worker_that_cannot_be_started_is_reported_on_the_loop(
        make_node: Any, host: FakeHost, loop: FakeLoop) -> None:
    node = make_node()
    node._spawn_failed(11, "No such file or directory")   # as the spawning thread does
    assert host.failed == []
    loop.run_until(lambda: bool(host.failed))
    assert host.failed == [(11, "No such file or directory")]


def test_a_closed_node_starts_no_worker_and_leaves_no_segment(
        make_node: Any, host: FakeHost) -> None:
    node = make_node()
    node.pool = FakePool()
    put(node, host, oid(1))
    shm_dir = node.shm_dir
    node.close()
    node.start_worker(11)
    assert node.pool.procs == {} and node.pool.closed
    assert not os.path.exists(shm_dir)


def test_the_fork_server_ends_quietly_when_the_head_is_gone_before_a_reply(tmp_path: Path) -> None:
    """The head SIGKILLed: its fork server, before its parent-death signal came, wrote a
    reply into the closed pipe, and a BrokenPipeError's traceback went to the cluster's
    log (test_head_restart.py's log check failed on it once in CI)."""
    import subprocess
    import sys

    from _probes import child_env
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestra._worker.zygote", str(tmp_path / "no.sock"),
         str(req_r), str(rep_w)], pass_fds=(req_r, rep_w), stderr=subprocess.PIPE,
        text=True, env=child_env())
    os.close(req_r)
    os.close(rep_w)
    os.close(rep_r)   # the head's end of the replies: gone
    try:
        os.write(req_w, b"spawn 1\n")   # forks a worker and replies with its pid
        _, err = proc.communicate(timeout=30)
    finally:
        os.close(req_w)
        proc.kill()
    assert "BrokenPipeError" not in err and proc.returncode == 0, err


def test_close_ends_while_pull_threads_add_and_drop_their_maps(make_node: Callable[..., Node]) -> None:
    # A head lost during pulls: the loop closes the node while pull threads still add the
    # map of a segment they fill and drop one that failed (fetch_into). The close once
    # raised "dictionary changed size during iteration", and the node never joined again.
    import mmap
    import sys
    import threading
    node = make_node()
    maps = node._pull_maps
    for i in range(3000):
        maps[f"s{i}"] = mmap.mmap(-1, 4096)
    stop = threading.Event()

    def pulls() -> None:
        i = 0
        while not stop.is_set() and i < 3000:
            i += 1
            maps[f"p{i}"] = mmap.mmap(-1, 4096)   # a pull's new map
            if i % 3 == 0:
                maps.pop(f"p{i - 1}", None)       # a pull that failed
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=pulls)
    t.start()
    try:
        node.close(kill_workers=False, keep_store=True)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert node.closed
    for mm in maps.values():   # those a pull added after the close
        mm.close()
    node.store.close()   # kept for the node that joins next, which no test makes here
