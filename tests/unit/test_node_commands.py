"""A node in a process of its own, without the process: the head's RemoteNode encodes
each Node command as a frame, the node process's side (_node_process.command) carries
the decoded frames out on a Node in the same order; the node's NodeHost calls come back
as event frames that RemoteNode turns into the head's calls. Fakes stand in for the
head, the node, the loop and the transports: no processes, no sockets."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestra._head.remote_node import NodeConn, RemoteNode
from orchestra._node.process import NodeProcess, command
from orchestra._protocol import pb
from orchestra._protocol import wire as _wire

pytestmark = pytest.mark.timeout(10)

NODE = 1
DRIVER, WORKER_CONN = 3, 4


class FakeTransport:
    def __init__(self) -> None:
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def frames(self) -> list[tuple[int, Any]]:
        out, self.written = _wire.FrameDecoder().feed(self.written), b""
        return out


class FakeFuture:
    def __init__(self) -> None:
        self.value: Any = None
        self.is_done = False

    def done(self) -> bool:
        return self.is_done

    def set_result(self, value: Any) -> None:
        self.value, self.is_done = value, True


class FakeLoop:
    """call_soon waits for run_soon(); timers are dropped (none matters here)."""

    def __init__(self) -> None:
        self.soon: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.soon.append((fn, args))

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        pass

    def create_future(self) -> FakeFuture:
        return FakeFuture()

    def run_soon(self) -> None:
        soon, self.soon = self.soon, []
        for fn, args in soon:
            fn(*args)


class ClientConn:
    def __init__(self) -> None:
        self.wbuf: list[bytes] = []


class FakeHead:
    """The part of the Head a RemoteNode uses; records the NodeHost calls."""

    def __init__(self) -> None:
        self.conns = {DRIVER: ClientConn()}
        self.dirty: set[Any] = set()
        self.calls: list[tuple[Any, ...]] = []
        self.stopping = False
        self.known_objects = {b"o1"}

    def carry_out(self) -> None:
        self.calls.append(("carry_out",))

    def worker_exited(self, worker_id: int, reason: str, *, connected: bool) -> None:
        self.calls.append(("worker_exited", worker_id, reason, connected))

    def worker_failed_to_start(self, worker_id: int, reason: str) -> None:
        self.calls.append(("worker_failed_to_start", worker_id, reason))

    def relocate(self, object_id: bytes, segment: Any) -> bool:
        self.calls.append(("relocate", object_id, segment.path))
        return object_id in self.known_objects

    def node_pulled(self, node_id: int, object_id: bytes, segment: Any, error: str) -> None:
        assert node_id == NODE
        self.calls.append(("pulled", object_id, segment and segment.name, error))

    def is_idle(self) -> bool:
        return True


class FakeStore:
    used = pooled = spilled_bytes = 0
    files: dict[str, int] = {}


class RecordingNode:
    """The Node's command interface, recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.node_id, self.capacity, self.shm_dir = NODE, 1 << 20, "/dev/shm/orchestra-x"
        self.closed = False
        self.store = FakeStore()

    def __getattr__(self, name: str) -> Callable[..., None]:
        def record(*args: Any) -> None:
            self.calls.append((name, *[list(a) if not isinstance(a, (int, str, bytes))
                                       and hasattr(a, "__iter__") else a for a in args]))
        return record

    def start(self) -> None:
        pass

    def store_info(self) -> Any:
        return pb.ObjStoreDebugInfoReply(capacity=self.capacity, used=self.store.used)

    def close(self) -> None:
        self.closed = True


def remote_node() -> tuple[RemoteNode, FakeHead, FakeLoop, FakeTransport]:
    head, loop, transport = FakeHead(), FakeLoop(), FakeTransport()
    remote = RemoteNode(NODE, head, loop, {"session_dir": "/nonexistent"})
    NodeConn(remote).connection_made(transport)
    return remote, head, loop, transport


def node_process(**cfg: Any) -> tuple[NodeProcess, RecordingNode, FakeTransport]:
    node, loop, transport = RecordingNode(), FakeLoop(), FakeTransport()
    proc = NodeProcess(loop, {"resources": {"CPU": 2}, **cfg}, lambda host: node)  # type: ignore[arg-type,return-value]
    proc.connection_made(transport)
    loop.run_soon()
    return proc, node, transport


def carry_out_on(node: RecordingNode, frames: list[tuple[int, Any]]) -> list[bool]:
    assert all(kind == _wire.NODE_COMMAND for kind, _ in frames)
    return [command(node, cmd) for _, cmd in frames]  # type: ignore[arg-type]


# ------------------------------------------------------------------ commands

def test_every_command_reaches_the_node_with_its_arguments_in_the_order_given() -> None:
    remote, head, loop, transport = remote_node()
    create = pb.Request(req_id=9, create_segment=pb.CreateSegment(object_id=b"o2", size=70))
    remote.seal("s1", b"o1", 70)
    remote.pin(DRIVER, ["s1", "s2"])
    remote.free_segment("s1")
    remote.unpin(DRIVER, ["s1"])
    remote.create_segment(DRIVER, create)
    remote.abort_segment(DRIVER, "s3")
    remote.start_worker(0)
    remote.worker_connected(0)
    remote.kill_worker(0, "cancelled with force=True")
    remote.worker_disconnected(0)
    remote.stop_worker(5)
    remote.set_driver(DRIVER)
    remote.drop_conn(WORKER_CONN)
    loop.run_soon()   # written at the latest on the loop's next turn
    node = RecordingNode()
    assert carry_out_on(node, transport.frames()) == [True] * 13
    assert node.calls == [
        ("seal", "s1", b"o1", 70), ("pin", DRIVER, ["s1", "s2"]), ("free_segment", "s1"),
        ("unpin", DRIVER, ["s1"]), ("create_segment", DRIVER, create),
        ("abort_segment", DRIVER, "s3"), ("start_worker", 0), ("worker_connected", 0),
        ("kill_worker", 0, "cancelled with force=True"), ("worker_disconnected", 0),
        ("stop_worker", 5), ("set_driver", DRIVER), ("drop_conn", WORKER_CONN)]


def test_commands_go_out_with_the_heads_next_write() -> None:
    remote, head, loop, transport = remote_node()
    remote.free_segment("s1")
    assert remote.conn in head.dirty and transport.written == b""


def test_close_tells_the_node_to_end() -> None:
    remote, head, loop, transport = remote_node()
    remote.close()
    ((kind, cmd),) = transport.frames()
    assert command(RecordingNode(), cmd) is False  # type: ignore[arg-type]
    remote.free_segment("late")   # nothing goes to a closed node
    loop.run_soon()
    assert transport.frames() == []


def test_the_node_hears_when_the_cluster_goes_idle() -> None:
    proc, node, transport = node_process()
    proc._last_command -= 1.0
    assert not proc.is_idle()
    proc.data_received(_wire.encode(_wire.NODE_COMMAND, pb.NodeCommand(cluster_idle=True)))
    assert proc.is_idle()
    proc.data_received(_wire.encode(_wire.NODE_COMMAND, pb.NodeCommand(seal="s1")))
    assert not proc.is_idle()   # busy at the first command, before the head says so
    assert node.calls == [("seal", "s1", b"", 0)]


def test_a_close_command_closes_the_node() -> None:
    proc, node, transport = node_process()
    proc.data_received(_wire.encode(_wire.NODE_COMMAND, pb.NodeCommand(close=True)))
    assert node.closed and proc.done.done()


# ------------------------------------------------------------------ events

def test_the_node_registers_first_with_what_a_hello_reply_needs() -> None:
    proc, node, transport = node_process()
    remote, head, loop, _ = remote_node()
    frames = transport.frames()
    assert [ev.WhichOneof("event") for _, ev in frames] == ["register"]
    remote.handle(frames)
    assert remote.registered.done()
    assert (remote.capacity, remote.shm_dir, remote.resources) == (
        1 << 20, "/dev/shm/orchestra-x", {"CPU": 2.0})


def test_a_frame_the_node_sends_reaches_its_connection_unchanged() -> None:
    proc, node, transport = node_process()
    transport.frames()   # the registration
    reply = pb.Reply(req_id=9, segment=pb.Segment(name="s1", size=70, capacity=65536))
    proc.send(DRIVER, _wire.REPLY, reply)
    proc.send(99, _wire.DROP_MAPS, pb.SegmentNames(names=["s2"]))   # a closed connection
    proc.flush()
    remote, head, loop, _ = remote_node()
    remote.handle(transport.frames())
    assert head.conns[DRIVER].wbuf == [_wire.encode(_wire.REPLY, reply)]
    assert head.dirty == {head.conns[DRIVER]} and head.calls == [("carry_out",)]


def test_worker_exits_and_failed_starts_become_the_heads_calls() -> None:
    proc, node, transport = node_process()
    transport.frames()
    proc.worker_failed_to_start(2, "No such file or directory")
    proc.worker_exited(3, "signal SIGSEGV", connected=True)
    proc.worker_exited(4, "exit code 1", connected=False)
    proc.flush()
    remote, head, loop, _ = remote_node()
    remote.handle(transport.frames())
    assert head.calls == [("worker_failed_to_start", 2, "No such file or directory"),
                          ("worker_exited", 3, "signal SIGSEGV", True),
                          ("worker_exited", 4, "exit code 1", False), ("carry_out",)]


def test_a_spilled_object_that_is_gone_has_its_file_freed_on_the_node() -> None:
    proc, node, transport = node_process()
    transport.frames()
    assert proc.relocate(b"o1", pb.Segment(name="s1", path="/spill/s1")) is True
    assert proc.relocate(b"gone", pb.Segment(name="s2", path="/spill/s2")) is True
    proc.flush()
    remote, head, loop, remote_transport = remote_node()
    remote.handle(transport.frames())
    assert head.calls[:2] == [("relocate", b"o1", "/spill/s1"), ("relocate", b"gone", "/spill/s2")]
    loop.run_soon()
    carry_out_on(node, remote_transport.frames())
    assert node.calls == [("free_segment", "/spill/s2")]


def test_store_figures_changed_by_commands_go_back_with_their_replies() -> None:
    proc, node, transport = node_process()
    transport.frames()
    node.store.used = 4096   # what the create_segment below would count
    create = pb.Request(req_id=9, create_segment=pb.CreateSegment(object_id=b"o2", size=70))
    proc.data_received(_wire.encode(_wire.NODE_COMMAND, pb.NodeCommand(
        create_segment=pb.NodeCreateSegment(conn_id=DRIVER, request=create))))
    events = [ev for _, ev in transport.frames()]
    assert [ev.WhichOneof("event") for ev in events] == ["store_info"]
    assert events[0].store_info.used == 4096
    proc.data_received(_wire.encode(_wire.NODE_COMMAND, pb.NodeCommand(seal="s1")))
    assert transport.frames() == []   # unchanged: nothing sent


def test_the_store_figures_are_answered_from_the_last_report() -> None:
    remote, head, loop, _ = remote_node()
    info = pb.ObjStoreDebugInfoReply(capacity=100, used=40, spilled_objects=2)
    remote.handle([(_wire.NODE_EVENT, pb.NodeEvent(store_info=info))])
    assert remote.store_info() == info


def test_a_sync_is_answered_after_the_events_of_the_commands_before_it() -> None:
    proc, node, transport = node_process()
    remote, head, loop, remote_transport = remote_node()
    remote.handle(transport.frames())   # the registration
    answered: list[str] = []
    remote.free_segment("s1")
    remote.after_node(lambda: answered.append(f"after {len(head.calls)} calls"))
    loop.run_soon()
    node.calls.clear()
    for kind, cmd in remote_transport.frames():
        if cmd.WhichOneof("command") == "free_segment":
            # What the node's free causes, say a spill's end: an event before the answer.
            proc.relocate(b"o1", pb.Segment(name="s0", path="/spill/s0"))
        proc.data_received(_wire.encode(kind, cmd))
    assert answered == []
    remote.handle(transport.frames())
    assert answered == ["after 2 calls"]   # the relocate (and a carry_out) came first
    assert head.calls[1] == ("relocate", b"o1", "/spill/s0")


# ------------------------------------------------------------------ transfers

def test_a_pull_reaches_the_node_with_the_token_of_its_own_cfg() -> None:
    remote, head, loop, transport = remote_node()
    remote.pull(b"o1", "10.0.0.2:4100", "seg-3", 70, "the head's token stays home")
    loop.run_soon()
    (frame,) = transport.frames()
    proc, node, _ = node_process(token="cluster-token")
    proc.data_received(_wire.encode(*frame))
    assert node.calls == [("pull", b"o1", "10.0.0.2:4100", "seg-3", 70, "cluster-token")]


def test_a_pulls_end_becomes_the_heads_call_with_its_segment_or_error() -> None:
    proc, node, transport = node_process()
    transport.frames()
    proc.pulled(b"o1", pb.Segment(name="seg-4", size=70, node_id=NODE), "")
    proc.pulled(b"o2", None, "the data server at 10.0.0.2:4100 closed the connection")
    proc.flush()
    remote, head, loop, _ = remote_node()
    remote.handle(transport.frames())
    assert head.calls == [
        ("pulled", b"o1", "seg-4", ""),
        ("pulled", b"o2", None, "the data server at 10.0.0.2:4100 closed the connection"),
        ("carry_out",)]
