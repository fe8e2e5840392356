"""Objects copied between nodes for their readers, under random interleavings
(Hypothesis state machine): the head's pulls (orchestra/_head/pulls.py) with a real
SchedulerState, three nodes whose pulls and stores are the machine's model, and a
clock and timers the machine moves.

Rules are the events the head meets: readers on each node locating objects (made by
tasks, with lineage, or put), the nodes' pulls ending (a copy, or a failure: the source
node or its segment gone), the scheduler's own pulls (a task's argument on another
node), objects dropped, readers leaving, a node dying (its objects rebuilt by their
tasks, lost, or living on in a copy) and joining again, and time passing (a failed
pull is asked again until the source node's fate is known). After every step:

- each reader waiting on a pull has that pull in flight at a live node (none waits
  for a pull nobody makes);
- a reader is answered at most once, and an answer that maps a segment names one on
  the reader's node that is still there;
- no segment is freed twice or freed while the directory still names it, and none is
  left that the directory does not name (a copy pulled for an object freed meanwhile
  is freed).

``drain`` (also run at the end) lets every pull succeed, every task finish and every
timer fire: then every reader still connected has its one answer.
"""
from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from _sched_helpers import DRIVER, NODE, Cluster, affinity, make_call, new_id, rid, segment_data
from orchestra._head.grpc_service import GRPC_CONN
from orchestra._head.pulls import Pulls
from orchestra._protocol import pb
from orchestra._protocol import wire as _wire
from orchestra._scheduler.events import Hello, TaskDone
from orchestra._scheduler.instructions import FreeSegment, Pull, Push, StartWorker
from orchestra._scheduler.model import WorkerState

pytestmark = pytest.mark.timeout(120)

A, B = 7, 8            # joined nodes: A may die and join again, B stays
NODES = (NODE, A, B)   # NODE: the head's own
SIZE = 1 << 20


class Request(NamedTuple):
    """A pull a node was asked for: object, where from (node and key)."""

    dest: int
    object_id: bytes
    source: int
    key: str


class FakeNode:
    """A node as pulls see it: it takes pull requests and frees segments."""

    def __init__(self, machine: PullInterleavings, node_id: int) -> None:
        self.m, self.node_id = machine, node_id
        self.data_address = f"10.0.0.{node_id}:9000"

    def pull(self, object_id: bytes, address: str, key: str, size: int, token: str) -> None:
        assert size == SIZE and token == "token"
        self.m.requests.append(Request(self.node_id, object_id, self.m.by_address[address], key))

    def free_segment(self, name: str) -> None:
        self.m.free(self.node_id, name)


class Reader:
    """A reader's connection (a worker or driver on a node)."""

    def __init__(self, conn_id: int, node: FakeNode) -> None:
        self.conn_id, self.node = conn_id, node


class Loop:
    def __init__(self, machine: PullInterleavings) -> None:
        self.m = machine

    def call_later(self, delay: float, fn: Any, *args: Any) -> None:
        self.m.timers.append((self.m.now + delay, fn, args))


class Head:
    """What Pulls use of the head, carried out on the machine's model."""

    def __init__(self, machine: PullInterleavings) -> None:
        self.m = machine
        self.state = machine.s
        self.conns: dict[int, Reader] = {}
        self.cfg = {"node_timeout_s": 1.0}
        self.loop = Loop(machine)
        self.nodes: dict[int, FakeNode] = {}
        self.data_address = "127.0.0.1:9000"
        self.token = "token"
        self.watchers: dict[bytes, list[Any]] = {}

    @property
    def local(self) -> FakeNode:
        return self.nodes[NODE]

    def queue_if_open(self, conn: Reader, data: bytes) -> None:
        if self.conns.get(conn.conn_id) is conn:
            [(kind, reply)] = _wire.FrameDecoder().feed(data)
            assert kind == _wire.REPLY
            self.m.answered(conn, reply)

    def watch_object(self, oid: bytes, fut: Any) -> None:
        self.watchers.setdefault(oid, []).append(fut)
        self.state.directory.subscribe(GRPC_CONN, [oid])

    def carry_out(self) -> None:
        self.m.carry_out()


class PullInterleavings(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = Cluster(cpus=1)
        self.s = self.c.s
        self.s.client_connected(GRPC_CONN, Hello(kind="grpc"))
        self.head = Head(self)
        self.now = 0.0
        self.pulls = Pulls(self.head, clock=lambda: self.now)   # type: ignore[arg-type]
        self.timers: list[tuple[float, Any, tuple[Any, ...]]] = []
        self.requests: list[Request] = []
        self.live: set[tuple[int, str]] = set()   # segments in the nodes' stores
        self.by_address = {self.head.data_address: NODE}
        self.conn_ids = itertools.count(500)
        self.names = itertools.count(1)
        self.req_ids = itertools.count(1)
        self.asked: dict[tuple[int, int], bytes] = {}     # (reader, request) -> object
        self.answers: dict[tuple[int, int], Any] = {}
        self.made: list[bytes] = []                       # every object made, freed or not
        self.held: list[bytes] = []                       # the driver's refs
        for nid in NODES:
            self._join(nid)
        self.c.take()

    # ------------------------------------------------------------ plumbing
    def _join(self, nid: int) -> None:
        node = FakeNode(self, nid)
        self.head.nodes[nid] = node
        if nid != NODE:
            self.by_address[node.data_address] = nid
            self.s.add_node(nid, {"CPU": 1.0}, num_workers=1, max_workers=2)
        for _ in range(2):
            reader = Reader(next(self.conn_ids), node)
            self.head.conns[reader.conn_id] = reader
        self.carry_out()

    def carry_out(self) -> None:
        while self.s.out:
            out, self.s.out = self.s.out, []
            for ins in out:
                kind = type(ins)
                if kind is StartWorker:
                    w = self.s.workers.get(ins.worker_id)
                    if w is not None and w.state is WorkerState.STARTING:
                        self.c.connect(ins.worker_id)
                elif kind is FreeSegment:
                    if ins.node_id in self.head.nodes:
                        self.free(ins.node_id, ins.key)
                elif kind is Pull:
                    self.pulls.pull(ins.node_id, ins.object_id)
                elif kind is Push and ins.conn == GRPC_CONN:
                    for fut in self.head.watchers.pop(ins.data.object_id, []):
                        if not fut.done():
                            fut.set_result(ins.data)

    def free(self, node_id: int, key: str) -> None:
        assert (node_id, key) in self.live, f"segment {key} on node {node_id} freed twice or never made"
        assert (node_id, key) not in self._named(), \
            f"segment {key} on node {node_id} freed while the directory names it"
        self.live.discard((node_id, key))

    def _named(self) -> set[tuple[int, str]]:
        """The segments the object directory names: each object's own, and its copies."""
        named = set()
        for o in self.s.objects.values():
            if o.data is not None and o.data.segment is not None:
                named.add((o.data.segment.node_id, o.data.segment.name))
            for seg in (o.copies or {}).values():
                named.add((seg.node_id, seg.name))
        return named

    def answered(self, reader: Reader, reply: Any) -> None:
        key = (reader.conn_id, reply.req_id)
        assert key in self.asked, f"an answer to a request never made: {key}"
        assert key not in self.answers, f"request {key} answered twice"
        self.answers[key] = reply
        if reply.HasField("object") and reply.object.WhichOneof("data") == "segment":
            seg = reply.object.segment
            assert seg.node_id == reader.node.node_id, \
                f"a reader on node {reader.node.node_id} sent to node {seg.node_id}'s segment"
            assert (seg.node_id, seg.name) in self.live, f"a reader sent to segment {seg.name}, gone"

    def _running(self) -> list[Any]:
        return [w for w in self.s.workers.values()
                if w.queue and w.conn >= 0 and w.state is not WorkerState.DEAD]

    def _readers(self) -> list[Reader]:
        return sorted(self.head.conns.values(), key=lambda r: r.conn_id)

    # ------------------------------------------------------------ events
    @rule(node=st.sampled_from(NODES))
    def make(self, node: int) -> None:
        """The driver submits a task that runs on ``node`` (its result may be made again)."""
        call = make_call("make", placement=affinity(node, soft=True), max_retries=1)
        self.s.submit(DRIVER, call)
        self.made.append(rid(call))
        self.held.append(rid(call))
        self.carry_out()

    @rule(node=st.sampled_from(NODES))
    def put(self, node: int) -> None:
        """An object put on ``node`` (no lineage: lost with its node unless copied)."""
        if node not in self.head.nodes:
            return
        oid, name = new_id() + bytes(4), f"put-{next(self.names)}"
        self.live.add((node, name))
        self.s.directory.put(DRIVER, segment_data(oid, name, node_id=node, size=SIZE))
        self.made.append(oid)
        self.held.append(oid)
        self.carry_out()

    @rule(i=st.integers(0, 20))
    def finish(self, i: int) -> None:
        """A running task ends: its result is a segment in its node's store."""
        workers = self._running()
        if not workers:
            return
        w = workers[i % len(workers)]
        call = w.queue[0].call
        name = f"seg-{next(self.names)}"
        self.live.add((w.node_id, name))
        data = segment_data(rid(call), name, node_id=w.node_id, size=SIZE)
        self.s.task_done(w.conn, TaskDone(task_id=call.task_id, returns=[data]))
        self.carry_out()

    @rule(r=st.integers(0, 20), o=st.integers(0, 50))
    def locate(self, r: int, o: int) -> None:
        """A reader on some node asks where to map an object (made, pending or freed)."""
        readers = self._readers()
        if not readers or not self.made:
            return
        reader, oid = readers[r % len(readers)], self.made[o % len(self.made)]
        req_id = next(self.req_ids)
        self.asked[(reader.conn_id, req_id)] = oid
        self.pulls.locate(reader, req_id, oid)   # type: ignore[arg-type]
        self.carry_out()

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 20), ok=st.booleans())
    def pull_ends(self, i: int, ok: bool) -> None:
        """A node's pull ends: a copy (its bytes may have come before the source node
        or its segment went), or a failure (the source gone, or the network)."""
        req = self.requests.pop(i % len(self.requests))
        if req.dest not in self.head.nodes:
            return   # a dead node reports nothing
        if ok:
            name = f"copy-{next(self.names)}"
            self.live.add((req.dest, name))
            seg = pb.Segment(name=name, size=SIZE, node_id=req.dest)
            self.pulls.pulled(req.dest, req.object_id, seg, "")
        else:
            self.pulls.pulled(req.dest, req.object_id, None,
                              f"the node cannot send {req.key!r}: no object stored under it here")
        self.carry_out()

    @rule(i=st.integers(0, 50))
    def drop(self, i: int) -> None:
        if not self.held:
            return
        oid = self.held.pop(i % len(self.held))
        self.s.directory.ref_delta(DRIVER, [], [oid])
        self.carry_out()

    @rule(r=st.integers(0, 20))
    def reader_leaves(self, r: int) -> None:
        """A reader's connection closes; another connects on its node."""
        readers = self._readers()
        reader = readers[r % len(readers)]
        del self.head.conns[reader.conn_id]
        new = Reader(next(self.conn_ids), reader.node)
        self.head.conns[new.conn_id] = new

    @rule()
    def time_passes(self) -> None:
        self.now += 0.5
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, fn, args in due:
            fn(*args)
        self.carry_out()

    @precondition(lambda self: A in self.head.nodes)
    @rule()
    def node_dies(self) -> None:
        """Node A dies, as the head meets it: its readers' and workers' connections
        close, its pulls fail, its store is gone."""
        for cid in [cid for cid, r in self.head.conns.items() if r.node.node_id == A]:
            del self.head.conns[cid]
        del self.head.nodes[A]
        self.pulls.node_gone(A, "killed")
        conns = [w.conn for w in self.s.workers.values() if w.node_id == A and w.conn >= 0]
        self.s.remove_node(A, "killed")
        for conn in conns:
            self.s.client_disconnected(conn, "its node died")
        self.live = {(n, k) for n, k in self.live if n != A}
        self.requests = [r for r in self.requests if r.dest != A]
        self.carry_out()

    @precondition(lambda self: A not in self.head.nodes)
    @rule()
    def node_joins(self) -> None:
        self._join(A)

    # ------------------------------------------------------------ promises
    @invariant()
    def a_reader_waits_only_on_a_pull_in_flight(self) -> None:
        in_flight = {(r.object_id, r.dest) for r in self.requests}
        for key, waiting in self.pulls.pending.items():
            assert key in in_flight, \
                f"{len(waiting)} reader(s) wait on a pull of {key[0].hex()} to node {key[1]} nobody makes"

    @invariant()
    def every_segment_is_named_once_and_none_named_is_gone(self) -> None:
        named = self._named()
        alive = set(self.head.nodes)
        gone = {s for s in named if s[0] in alive and s not in self.live}
        assert not gone, f"the directory names segments no store has: {gone}"
        leaked = self.live - named
        assert not leaked, f"segments no object names (leaked): {leaked}"

    @rule()
    def drain(self) -> None:
        """Let everything end: nodes join, pulls succeed, tasks finish, timers fire."""
        for _ in range(300):
            if A not in self.head.nodes:
                self.node_joins()
            elif self.requests:
                self.pull_ends(0, True)
            elif self._running():
                self.finish(0)
            elif self.timers:
                self.time_passes()
            else:
                break
        waiting = {k: v.hex() for k, v in self.asked.items()
                   if k not in self.answers and k[0] in self.head.conns}
        assert not waiting, f"readers never answered: {waiting}"

    def teardown(self) -> None:
        self.drain()


PullInterleavings.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_pull_interleavings = PullInterleavings.TestCase
