"""Helpers of the scheduler core's unit tests: a SchedulerState with one node, a driver
and workers that connect on demand, calls and objects to feed it, and readers of the
instructions it emits (state.out), taken the way orchestra/_head/head.py carries them out."""
from __future__ import annotations

import itertools
import pickle
from typing import Any

from orchestra._head.inbound import call_in
from orchestra._proto import types_pb2
from orchestra._scheduler import data as values
from orchestra._scheduler.data import ERROR, Data, Segment
from orchestra._scheduler.events import Hello, TaskDone
from orchestra._scheduler.instructions import Execute, FreeSegment, Push, StartWorker
from orchestra._scheduler.model import cluster_free
from orchestra._scheduler.state import SchedulerState

DRIVER = 1
NODE = 0
_ids = itertools.count(1)


def worker_conn(worker_id: int) -> int:
    return 100 + worker_id


def new_id() -> bytes:
    return next(_ids).to_bytes(12, "big")


def ref(oid: bytes) -> Any:
    return types_pb2.Value(ref=oid)


def inline(value: Any) -> Any:
    return types_pb2.Value(inline=pickle.dumps(value))


def call_msg(name: str = "f", args: tuple[Any, ...] = (), *, cpus: float = 1.0,
              resources: dict[str, float] | None = None, max_retries: int = 0,
              num_returns: int = 1, nested: tuple[bytes, ...] = (),
              retry_exceptions: bool = False, placement: Any = None, actor: Any = None,
              actor_id: bytes = b"") -> Any:
    """A task's Call message, as a process sends it; ``placement``: a
    types_pb2.Placement (scheduling_strategy=);
    ``actor``: a types_pb2.ActorSpec, the actor it constructs (its id, when it names
    none: the call's task id and 0xffffffff); ``actor_id``: the actor whose method it
    calls."""
    res = dict(resources or {})
    if cpus:
        res["CPU"] = cpus
    call = types_pb2.Call(task_id=new_id(), function_id=b"F" * 16, args=list(args),
                          num_returns=num_returns, resources=res, max_retries=max_retries,
                          name=name, nested=list(nested), retry_exceptions=retry_exceptions,
                          actor_id=actor_id)
    if actor is not None:
        call.actor.CopyFrom(actor)
        if not actor.actor_id:
            call.actor.actor_id = call.task_id + b"\xff\xff\xff\xff"
    if placement is not None:
        call.placement.CopyFrom(placement)
    return call


def make_call(name: str = "f", args: tuple[Any, ...] = (), **options: Any) -> Any:
    """A task's Call, as the head's edge hands it to the scheduler (call_msg's message,
    read by call_in)."""
    return call_in(call_msg(name, args, **options))


def spread() -> Any:
    return types_pb2.Placement(strategy="SPREAD")


def affinity(node_id: int, soft: bool = False) -> Any:
    return types_pb2.Placement(strategy="NODE_AFFINITY", node_id=node_id, soft=soft)


def rid(call: Any, i: int = 0) -> bytes:
    """Object id of return ``i`` of ``call``."""
    return call.task_id + i.to_bytes(4, "big")


def inline_data(oid: bytes, value: Any = "v", contained: tuple[bytes, ...] = ()) -> Data:
    """A value as the scheduler holds one it made (its bytes in ``payload``)."""
    return values.inline(oid, pickle.dumps(value), contained)


def inline_msg(oid: bytes, value: Any = "v", contained: tuple[bytes, ...] = ()) -> Any:
    """The ObjectData of a value, as a process sends it (the head reads it: data_in)."""
    return types_pb2.ObjectData(object_id=oid, inline=pickle.dumps(value), contained=list(contained))


def segment_msg(oid: bytes, name: str, contained: tuple[bytes, ...] = (), *,
                node_id: int = NODE, size: int = 1 << 20) -> Any:
    return types_pb2.ObjectData(object_id=oid, contained=list(contained), segment=types_pb2.Segment(
        name=name, size=size, node_id=node_id))


def segment_data(oid: bytes, name: str, contained: tuple[bytes, ...] = (), *,
                 node_id: int = NODE, size: int = 1 << 20) -> Data:
    return values.at(oid, Segment(name, size, node_id), contained)


class Cluster:
    """A SchedulerState with one node, a driver, and workers that connect on demand."""

    def __init__(self, cpus: float = 2, *, gpus: float = 0, custom: dict[str, float] | None = None,
                 workers: int | None = None, max_workers: int = 8, pipeline_depth: int = 2,
                 connect: bool = True, worker_socket: bool = False, lending: bool = False) -> None:
        self.s = SchedulerState(pipeline_depth=pipeline_depth)
        if worker_socket or lending:   # direct calls: callers learn each worker's socket
            self.s.worker_socket = socket_path
        self.s.lending = lending
        res = {"CPU": float(cpus), "GPU": float(gpus), **(custom or {})}
        self.s.add_node(NODE, res, num_workers=int(cpus) if workers is None else workers,
                        max_workers=max_workers)
        self.s.client_connected(DRIVER, Hello(kind="driver", pid=1))
        self.pool = self.started()
        if connect:
            for wid in self.pool:
                self.connect(wid)
        self.take()

    def started(self, out: list[Any] | None = None) -> list[int]:
        out = self.s.out if out is None else out
        return [ins.worker_id for ins in out if type(ins) is StartWorker]

    def connect(self, worker_id: int) -> None:
        self.s.client_connected(worker_conn(worker_id),
                                Hello(kind="worker", pid=1000 + worker_id, worker_id=worker_id))

    def take(self) -> list[Any]:
        out, self.s.out = self.s.out, []
        return out

    def submit(self, call: Any, conn: int = DRIVER) -> Any:
        self.s.submit(conn, call)
        return call

    def done(self, worker_id: int, call: Any, value: Any = "v", **flags: Any) -> None:
        returns = [inline_data(rid(call, i), value) for i in range(call.num_returns)]
        if flags.get("cancelled"):
            returns = []
        self.s.task_done(worker_conn(worker_id), TaskDone(task_id=call.task_id,
                                                              returns=returns, **flags))

    def worker(self, worker_id: int) -> Any:
        return self.s.workers[worker_id]

    def available(self) -> dict[str, float]:
        return cluster_free(self.s.nodes)


def executes(out: list[Any]) -> list[tuple[int, Execute]]:
    """(worker id, Execute) of every task sent to run on its own (not nested)."""
    return [(ins.conn - 100, ins) for ins in out if type(ins) is Execute and not ins.nested]


def executed(out: list[Any]) -> list[tuple[int, bytes]]:
    return [(w, inv.call.task_id) for w, inv in executes(out)]


def pushes(out: list[Any], conn: int = DRIVER) -> dict[bytes, Any]:
    return {ins.data.object_id: ins.data for ins in out if type(ins) is Push and ins.conn == conn}


def error_of(out: list[Any], oid: bytes) -> bytes:
    data = pushes(out)[oid]
    assert data.kind == ERROR
    return data.payload


def freed_segments(out: list[Any]) -> list[str]:
    return [ins.key for ins in out if type(ins) is FreeSegment]


def sent(out: list[Any], kind: type, conn: int | None = None) -> list[Any]:
    """The instructions of type ``kind`` in ``out`` (Warn, Loan, ...), to ``conn`` when
    given."""
    return [ins for ins in out if type(ins) is kind and (conn is None or ins.conn == conn)]


def socket_path(node_id: int, worker_id: int) -> str:
    return f"/tmp/orchestra-test/w{worker_id}.sock"


class Nodes(Cluster):
    """A SchedulerState with several nodes (node id -> resources, each with a worker per
    CPU unless ``workers`` says otherwise), a driver, and workers connected at once."""

    def __init__(self, nodes: dict[int, dict[str, float]], *, workers: dict[int, int] | None = None,
                 max_workers: int = 8, pipeline_depth: int = 2, joinable: bool = False,
                 error_factory: Any = None, no_work: tuple[int, ...] = ()) -> None:
        self.s = SchedulerState(pipeline_depth=pipeline_depth, joinable=joinable,
                                error_factory=error_factory)
        self.max_workers = max_workers
        for nid, res in nodes.items():
            n = int(res.get("CPU", 0)) if workers is None else workers.get(nid, 0)
            self.s.add_node(nid, dict(res), num_workers=n, max_workers=max_workers,
                            works=nid not in no_work)
        self.s.client_connected(DRIVER, Hello(kind="driver", pid=1))
        self.pool = self.started()
        for wid in self.pool:
            self.connect(wid)
        self.take()

    def node_of(self, worker_id: int) -> int:
        return self.s.workers[worker_id].node_id

    def ran_on(self, out: list[Any]) -> list[int]:
        """The node of each task sent in ``out``, in order."""
        return [self.node_of(w) for w, _ in executed(out)]

    def started_on(self, out: list[Any]) -> list[int]:
        """The node of each worker started in ``out``."""
        return [ins.node_id for ins in out if type(ins) is StartWorker]
