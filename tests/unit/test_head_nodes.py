"""Head: node instructions are carried out on the node they name (no processes, no
sockets: the head is built without starting, its nodes replaced by recorders)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _head_helpers import RecordingTransport, unstarted_head
from orchestra._head import inbound
from orchestra._head.head import Conn, Head
from orchestra._protocol import pb
from orchestra._protocol import wire as _wire
from orchestra._scheduler.events import Hello
from orchestra._scheduler.instructions import FreeSegment, Instruction, KillWorker, StartWorker, StopWorker

pytestmark = pytest.mark.timeout(10)

REMOTE = 9


class RecordingNode:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.capacity = 1000 + node_id
        self.shm_dir = f"/dev/shm/node-{node_id}"
        self.calls: list[tuple[Any, ...]] = []

    def free_segment(self, key: str) -> None:
        self.calls.append(("free_segment", key))

    def start_worker(self, worker_id: int) -> None:
        self.calls.append(("start_worker", worker_id))

    def kill_worker(self, worker_id: int, reason: str) -> None:
        self.calls.append(("kill_worker", worker_id, reason))

    def stop_worker(self, worker_id: int) -> None:
        self.calls.append(("stop_worker", worker_id))

    def set_driver(self, conn_id: int) -> None:
        self.calls.append(("set_driver", conn_id))

    def worker_connected(self, worker_id: int) -> None:
        self.calls.append(("worker_connected", worker_id))




@pytest.fixture
def head(tmp_path: Path) -> Iterator[Head]:
    h = unstarted_head(tmp_path)
    real = h.local
    h.local = RecordingNode(real.node_id)  # type: ignore[assignment]
    h.nodes = {real.node_id: h.local, REMOTE: RecordingNode(REMOTE)}  # type: ignore[dict-item]
    yield h
    real.close()


def carry(head: Head, *instructions: Instruction) -> None:
    head.state.out = list(instructions)
    head.carry_out()


def calls(head: Head, node_id: int) -> list[tuple[Any, ...]]:
    return head.nodes[node_id].calls  # type: ignore[attr-defined]


def test_a_segment_is_freed_on_the_node_the_instruction_names(head: Head) -> None:
    carry(head, FreeSegment(REMOTE, "seg-3"))
    assert calls(head, REMOTE) == [("free_segment", "seg-3")]
    assert calls(head, head.local.node_id) == []


def test_a_worker_is_started_killed_and_stopped_on_the_node_the_instruction_names(head: Head) -> None:
    carry(head, StartWorker(REMOTE, 4))
    carry(head, KillWorker(REMOTE, 4, "cancelled with force=True"), StopWorker(REMOTE, 4))
    assert calls(head, REMOTE) == [("start_worker", 4),
                                   ("kill_worker", 4, "cancelled with force=True"),
                                   ("stop_worker", 4)]
    assert calls(head, head.local.node_id) == []


def test_hello_reply_describes_the_node_of_the_connection(head: Head) -> None:
    head.state.add_node(REMOTE, {"CPU": 2.0}, num_workers=0, max_workers=1)
    conn = Conn(head, 1, head.nodes[REMOTE])
    conn.transport = RecordingTransport()
    head.conns[1] = conn
    head.hello(conn, pb.Hello(kind="driver", pid=1))
    head.carry_out()
    ((kind, reply),) = _wire.FrameDecoder().feed(conn.transport.written)
    assert kind == _wire.HELLO_REPLY
    assert reply.node_id == REMOTE and dict(reply.node_resources) == {"CPU": 2.0}
    assert reply.store_capacity == 1000 + REMOTE and reply.shm_dir == f"/dev/shm/node-{REMOTE}"
    assert calls(head, REMOTE) == [("set_driver", 1)]


class _Later:
    def call_later(self, delay: float, fn: Any, *args: Any) -> None:
        pass


def test_a_worker_gets_its_hello_reply_before_the_constructor_sent_at_its_connect(head: Head) -> None:
    # A driver that connects before any worker has its reply parked; the first worker's
    # connect released it, carrying out what was decided so far, so an actor's
    # constructor dispatched at that connect went out before the worker's own
    # HelloReply, which the worker's client dropped: the actor never started (a
    # detached actor made again by a restarted head, 1 start in ~15).
    from orchestra._head.grpc_service import GRPC_CONN
    from orchestra._proto import types_pb2
    head.loop = _Later()  # type: ignore[assignment]
    local = head.local.node_id
    head.state.add_node(local, {"CPU": 1.0}, num_workers=0, max_workers=2)
    head.state.client_connected(GRPC_CONN, Hello("grpc"))
    tid = bytes(range(12))
    ctor = types_pb2.Call(task_id=tid, function_id=b"cls", name="C.__init__", resources={"CPU": 1.0})
    ctor.actor.CopyFrom(types_pb2.ActorSpec(actor_id=tid + b"\xff" * 4, class_name="C",
                                            detached=True))
    head.state.register_function(inbound.function_in(pb.RegisterFunctionRequest(
        function_id=b"cls", pickled=b"C")))
    head.state.create_actor(GRPC_CONN, inbound.call_in(ctor))
    [start] = [ins for ins in head.state.out if type(ins) is StartWorker]
    head.carry_out()
    driver = Conn(head, 5, head.local)
    driver.transport = RecordingTransport()
    head.conns[5] = driver
    head.hello(driver, pb.Hello(kind="driver", pid=1))   # parked: no worker yet
    head.carry_out()
    assert driver.transport.written == b""
    worker = Conn(head, 6, head.local)
    worker.transport = RecordingTransport()
    head.conns[6] = worker
    head.hello(worker, pb.Hello(kind="worker", pid=2, workerid=start.worker_id))
    head.carry_out()
    kinds = [kind for kind, _ in _wire.FrameDecoder().feed(worker.transport.written)]
    assert kinds[0] == _wire.HELLO_REPLY and _wire.EXECUTE in kinds, kinds
    assert [k for k, _ in _wire.FrameDecoder().feed(driver.transport.written)] == [_wire.HELLO_REPLY]
