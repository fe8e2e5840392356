"""Copying an object between two nodes: two Nodes (two stores, each its own private
directory under /dev/shm) on one event loop in this process; the source serves its
store (serve_data), the destination pulls (pull) over loopback with the real handshake,
and its host hears of the result (pulled) on the loop."""
from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestra._node.node import PULL_CONN, Node
from orchestra._objects.segments import open_segment, segment_file
from orchestra._objects.store import size_class
from orchestra._protocol import auth as _auth
from orchestra._protocol import pb

pytestmark = pytest.mark.timeout(60)

KiB, MiB = 1 << 10, 1 << 20
WRITER = 5


class Host:
    """A NodeHost that records pulls (and relocations) and accepts everything else."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pulls: list[tuple[bytes, Any, str]] = []
        self.relocated: list[tuple[bytes, Any]] = []
        self.sent: list[tuple[int, int, Any]] = []
        self.waiter: asyncio.Future[None] | None = None

    def send(self, conn_id: int, kind: int, msg: Any) -> None:
        self.sent.append((conn_id, kind, msg))

    def flush(self) -> None:
        pass

    def worker_failed_to_start(self, worker_id: int, reason: str) -> None:
        pass

    def worker_exited(self, worker_id: int, reason: str, *, connected: bool) -> None:
        pass

    def relocate(self, object_id: bytes, segment: Any) -> bool:
        self.relocated.append((object_id, segment))
        return True

    def pulled(self, object_id: bytes, segment: Any, error: str) -> None:
        self.pulls.append((object_id, segment, error))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def is_idle(self) -> bool:
        return False

    def wait_pulled(self, n: int = 1, timeout: float = 30.0) -> list[tuple[bytes, Any, str]]:
        """Run the loop until ``n`` pulls have been reported."""
        async def wait() -> None:
            while len(self.pulls) < n:
                self.waiter = self.loop.create_future()
                await asyncio.wait_for(self.waiter, timeout)
        self.loop.run_until_complete(wait())
        return self.pulls


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture
def token() -> str:
    return _auth.new_token()


@pytest.fixture
def make_node(loop: asyncio.AbstractEventLoop,
              tmp_path: Path) -> Iterator[Callable[..., tuple[Node, Host]]]:
    nodes: list[Node] = []

    def make(node_id: int, capacity: int = 16 * MiB, **kw: Any) -> tuple[Node, Host]:
        host = Host(loop)
        d = tmp_path / f"node{node_id}"
        d.mkdir()
        kw.setdefault("spill_dir", str(d / "spill"))
        node = Node(node_id, host, loop, session_id="unit", session_dir=str(d),
                    sock_path=str(d / "head.sock"), capacity=capacity, **kw)
        nodes.append(node)
        return node, host
    yield make
    for node in nodes:
        node.close()


def put(node: Node, oid: bytes, data: bytes) -> Any:
    """Create, write and seal an object as a writer does; its Segment."""
    seg = node.store.create(WRITER, oid, len(data))
    mm = open_segment(node.shm_dir, seg)
    mm[: len(data)] = data
    mm.close()
    assert node.seal(seg.name)
    return seg


def read(node: Node, segment: Any) -> bytes:
    path, start = (segment.path, 0) if segment.path else segment_file(node.shm_dir, segment.name)
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(segment.size)


def oid(i: int) -> bytes:
    return i.to_bytes(16, "big")


@pytest.mark.parametrize("size", [0, 1, 200 * KiB, 5 * MiB])
def test_a_pulled_object_is_a_sealed_copy_in_the_pullers_store(
        make_node: Any, token: str, size: int) -> None:
    src, _ = make_node(2)
    dst, host = make_node(3)
    data = os.urandom(size)
    seg = put(src, oid(1), data)
    dst.pull(oid(1), src.serve_data("127.0.0.1", token), seg.name, size, token)
    ((got_oid, copy, error),) = host.wait_pulled()
    assert (got_oid, error) == (oid(1), "")
    assert copy.node_id == 3 and copy.size == size
    assert read(dst, copy) == data
    assert dst.store.segs[copy.name].state == "sealed"
    assert copy.name in dst._pull_maps   # kept for the segment's next use
    assert dst.store_info().used == size_class(max(size, 1))
    assert src.store_info().used == size_class(max(size, 1))   # the source keeps its own


def test_a_spilled_object_is_pulled_from_its_file(make_node: Any, token: str) -> None:
    src, src_host = make_node(2)
    dst, host = make_node(3)
    data = os.urandom(300 * KiB)
    seg = put(src, oid(1), data)
    (job,) = src.store.begin_spill([seg.name])
    from orchestra._objects.segments import spill_file
    assert spill_file(job.source, job.dest, job.size) == ""
    spilled = src.store.end_spill(job.name, job.dest, "")
    dst.pull(oid(1), src.serve_data("127.0.0.1", token), spilled.path, len(data), token)
    ((_, copy, error),) = host.wait_pulled()
    assert error == "" and read(dst, copy) == data


def test_a_pull_that_comes_before_the_sources_seal_command_waits_for_it(
        make_node: Any, token: str, loop: asyncio.AbstractEventLoop) -> None:
    # The head seals a joined node's segment with a command on that node's connection
    # and may start a pull of it at once on another: the pull must not find the segment
    # still being written and fail (ObjectLostError for an object alive and sealed).
    src, _ = make_node(2)
    dst, host = make_node(3)
    data = os.urandom(200 * KiB)
    seg = src.store.create(WRITER, oid(1), len(data))
    mm = open_segment(src.shm_dir, seg)
    mm[: len(data)] = data
    mm.close()
    dst.pull(oid(1), src.serve_data("127.0.0.1", token), seg.name, len(data), token)
    loop.call_later(0.2, src.seal, seg.name)   # the seal command, read a loop turn later
    ((_, copy, error),) = host.wait_pulled()
    assert error == "" and read(dst, copy) == data


def test_a_pull_of_a_segment_never_sealed_fails_after_the_seal_wait(
        make_node: Any, token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra._node import node as _node
    monkeypatch.setattr(_node, "SEAL_WAIT_S", 0.2)
    src, _ = make_node(2)
    dst, host = make_node(3)
    seg = src.store.create(WRITER, oid(1), 1000)
    dst.pull(oid(1), src.serve_data("127.0.0.1", token), seg.name, 1000, token)
    ((_, copy, error),) = host.wait_pulled()
    assert copy is None and f"no object stored under {seg.name!r}" in error


def test_a_missing_key_fails_the_pull_and_gives_its_bytes_back(make_node: Any,
                                                               token: str) -> None:
    src, _ = make_node(2)
    dst, host = make_node(3)
    dst.pull(oid(1), src.serve_data("127.0.0.1", token), "seg-99", 100 * KiB, token)
    ((got_oid, copy, error),) = host.wait_pulled()
    assert got_oid == oid(1) and copy is None
    assert "no object stored under 'seg-99'" in error
    assert dst.store_info().used == 0   # the half-written slot is given back
    assert all(seg.state in ("pooled", "cold") for seg in dst.store.segs.values())
    assert set(os.listdir(dst.shm_dir)) == set(dst.store.slabs)


def test_a_pull_from_a_node_that_is_gone_fails_with_the_reason(make_node: Any,
                                                               token: str) -> None:
    src, _ = make_node(2)
    dst, host = make_node(3)
    seg = put(src, oid(1), b"x" * 1000)
    address = src.serve_data("127.0.0.1", token)
    src.close()
    dst.pull(oid(1), address, seg.name, 1000, token)
    ((_, copy, error),) = host.wait_pulled()
    assert copy is None and f"cannot reach the data server of the node at {address}" in error
    assert dst.store_info().used == 0


def test_a_pull_with_the_wrong_token_fails_and_names_it(make_node: Any, token: str) -> None:
    src, _ = make_node(2)
    dst, host = make_node(3)
    seg = put(src, oid(1), b"x" * 1000)
    dst.pull(oid(1), src.serve_data("127.0.0.1", token), seg.name, 1000, _auth.new_token())
    ((_, copy, error),) = host.wait_pulled()
    assert copy is None and "token" in error
    assert dst.store_info().used == 0


def test_a_pull_that_cannot_fit_fails_as_a_put_would(make_node: Any, token: str) -> None:
    src, _ = make_node(2)
    dst, host = make_node(3, capacity=1 * MiB)
    seg = put(src, oid(1), b"x" * (2 * MiB))
    dst.pull(oid(1), src.serve_data("127.0.0.1", token), seg.name, 2 * MiB, token)
    ((_, copy, error),) = host.wait_pulled()
    assert copy is None and "cannot fit in the object store" in error
    assert dst.store_info().used == 0


def test_a_pull_into_a_full_store_spills_first(make_node: Any, token: str) -> None:
    src, _ = make_node(2)
    dst, host = make_node(3, capacity=1 * MiB)
    old = put(dst, oid(7), b"o" * 700 * KiB)   # sealed, nobody maps it: may be spilled
    data = os.urandom(600 * KiB)
    seg = put(src, oid(1), data)
    dst.pull(oid(1), src.serve_data("127.0.0.1", token), seg.name, len(data), token)
    ((_, copy, error),) = host.wait_pulled()
    assert error == "" and read(dst, copy) == data
    ((moved, spilled),) = host.relocated
    assert moved == oid(7) and spilled.path and old.name not in dst.store.segs


def test_pulls_in_a_row_reuse_one_connection(make_node: Any, token: str) -> None:
    src, _ = make_node(2)
    dst, host = make_node(3)
    address = src.serve_data("127.0.0.1", token)
    objects = {oid(i): os.urandom(i * 10 * KiB) for i in range(1, 6)}
    segs = {o: put(src, o, d) for o, d in objects.items()}
    for o, d in objects.items():
        dst.pull(o, address, segs[o].name, len(d), token)
        host.wait_pulled(len(host.pulls) + 1)
    assert all(not e for _, _, e in host.pulls)
    assert {o: read(dst, c) for o, c, _ in host.pulls} == objects
    assert dst._fetcher is not None
    assert sum(len(v) for v in dst._fetcher._idle.values()) == 1


@pytest.mark.parametrize("key", ["/etc/passwd", "../x", "seg-1/../../x", ".", ""])
def test_the_data_server_serves_nothing_but_the_stores_own_objects(make_node: Any,
                                                                   key: str) -> None:
    src, _ = make_node(2)
    put(src, oid(1), b"x" * 10)
    assert src._resolve(key) is None


def test_an_object_being_written_is_not_served(make_node: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra._node import node as _node
    monkeypatch.setattr(_node, "SEAL_WAIT_S", 0.1)   # (its seal is waited for that long)
    src, _ = make_node(2)
    seg = src.store.create(WRITER, oid(1), 100)
    assert src._resolve(seg.name) is None
    src.seal(seg.name)
    path, start = segment_file(src.shm_dir, seg.name)
    assert src._resolve(seg.name) == (path, 100, start)


def test_close_stops_the_data_server(make_node: Any, token: str) -> None:
    src, _ = make_node(2)
    address = src.serve_data("127.0.0.1", token)
    assert src.serve_data("127.0.0.1", token) == address   # once
    src.close()
    import socket

    from orchestra._objects.transfer import parse_address
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(parse_address(address), timeout=5).close()


def test_a_pull_into_a_pooled_segment_reuses_its_map_until_the_segment_goes(
        make_node: Any, token: str) -> None:
    src, _ = make_node(2)
    dst, host = make_node(3, capacity=1 * MiB)
    address = src.serve_data("127.0.0.1", token)
    first, second = os.urandom(100 * KiB), os.urandom(100 * KiB)
    segs = [put(src, oid(1), first), put(src, oid(2), second)]
    dst.pull(oid(1), address, segs[0].name, len(first), token)
    ((_, copy, _),) = host.wait_pulled()
    kept = dst._pull_maps[copy.name]
    dst.free_segment(copy.name)   # pooled, still mapped
    dst.pull(oid(2), address, segs[1].name, len(second), token)
    (_, (_, again, error)) = host.wait_pulled(2)
    assert not error and again.name == copy.name and again.reused
    assert dst._pull_maps[again.name] is kept and read(dst, again) == second
    dst.free_segment(again.name)
    req = pb.Request(req_id=1, create_segment=pb.CreateSegment(object_id=oid(3), size=900 * KiB))
    dst.create_segment(WRITER, req)   # evicts the pooled segment: its map is closed
    assert [m.req_id for c, _, m in host.sent if c == WRITER] == [1]
    assert again.name not in dst._pull_maps and kept.closed
    assert [m for c, _, m in host.sent if c == PULL_CONN] == []   # never a frame
