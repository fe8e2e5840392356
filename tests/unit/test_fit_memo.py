"""The placer remembers, for a resource shape, that no node can hold it now, until some
node's free resources grow (_scheduler/placement.py, Placer): a placement of a task
that may go anywhere then asks no node while the cluster is full. Whatever happens to
the nodes (tasks placed and ended, workers blocked in get() lending their CPU and
taking it back, placement groups reserving and giving back bundles, nodes joining and
leaving), the nodes it offers a task are those a scan finds."""
from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from _sched_helpers import DRIVER, Nodes, executed, make_call, worker_conn
from orchestra._proto import types_pb2
from orchestra._resources import NodeResources
from orchestra._scheduler import placement
from orchestra._scheduler.groups import GroupSpec
from orchestra._scheduler.model import Task, TaskState

pytestmark = pytest.mark.timeout(120)

_gids = itertools.count(1)
SHAPES = [0.5, 1.0, 2.0, 3.0]


def _scan(c: Nodes, t: Task) -> set[int]:
    return {nid for nid, n in c.s.nodes.items() if n.resources.fits(t.resources)}


class FitMemo(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = Nodes({0: {"CPU": 2.0}, 1: {"CPU": 3.0}}, max_workers=6, pipeline_depth=2)
        self.calls: dict[bytes, Any] = {}
        self.groups: list[bytes] = []
        self.blocked: set[int] = set()
        self.next_node = 2

    def _take(self) -> None:
        out = self.c.take()
        for wid in self.c.started(out):
            self.c.connect(wid)
        self.c.take()

    def _running(self, i: int) -> tuple[int, Any] | None:
        """The i-th (modulo) worker running a task, not blocked: (its id, the call)."""
        running = [(w.worker_id, w.queue[0].call) for w in self.c.s.workers.values()
                   if w.queue and w.queue[0].state is TaskState.DISPATCHED
                   and w.worker_id not in self.blocked and not w.nested]
        return running[i % len(running)] if running else None

    @rule(cpus=st.sampled_from(SHAPES), n=st.integers(1, 4))
    def submit(self, cpus: float, n: int) -> None:
        for _ in range(n):
            call = self.c.submit(make_call("t", cpus=cpus))
            self.calls[call.task_id] = call
        self._take()

    @rule(i=st.integers(0, 50))
    def finish(self, i: int) -> None:
        picked = self._running(i)
        if picked is not None:
            self.c.done(*picked)
            self._take()

    @rule(i=st.integers(0, 50))
    def block(self, i: int) -> None:
        picked = self._running(i)
        if picked is not None:
            wid, call = picked
            self.c.s.blocked(worker_conn(wid), True, [b"x" * 16], call.task_id, "t")
            self.blocked.add(wid)
            self._take()

    @precondition(lambda self: self.blocked)
    @rule(i=st.integers(0, 50))
    def resume(self, i: int) -> None:
        wid = sorted(self.blocked)[i % len(self.blocked)]
        self.blocked.discard(wid)
        if wid in self.c.s.workers:
            self.c.s.blocked(worker_conn(wid), False)
            self._take()

    @rule(bundles=st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=1, max_size=2))
    def create_group(self, bundles: list[float]) -> None:
        gid = next(_gids).to_bytes(12, "big")
        spec = GroupSpec(gid, tuple({"CPU": b} for b in bundles), "PACK")
        self.c.s.groups.create(DRIVER, spec)
        self.c.s.schedule()
        self.groups.append(gid)
        self._take()

    @precondition(lambda self: self.groups)
    @rule(i=st.integers(0, 50))
    def remove_group(self, i: int) -> None:
        self.c.s.groups.remove(self.groups.pop(i % len(self.groups)))
        self.c.s.schedule()
        self._take()

    @rule(cpus=st.sampled_from([1.0, 4.0]))
    def node_joins(self, cpus: float) -> None:
        nid = self.next_node
        self.next_node += 1
        self.c.s.add_node(nid, {"CPU": cpus}, num_workers=1, max_workers=3)
        self._take()

    @precondition(lambda self: len(self.c.s.nodes) > 2)
    @rule()
    def node_leaves(self) -> None:
        self.c.s.remove_node(max(self.c.s.nodes), "killed")
        self.blocked &= set(self.c.s.workers)
        self._take()

    @invariant()
    def the_nodes_offered_are_those_a_scan_finds(self) -> None:
        probes = [make_call("probe", cpus=shape) for shape in SHAPES]
        probes += [make_call("in-group", cpus=0.5, placement=types_pb2.Placement(
            strategy="PLACEMENT_GROUP", group_id=gid, bundle_index=-1)) for gid in self.groups]
        for call in probes:
            t = Task(call, DRIVER)
            assert {n.node_id for n in self.c.s.placer.order(t)} == _scan(self.c, t)
            ordered = [n.node_id for n in self.c.s.placer.ordered(t)]
            assert set(ordered) == _scan(self.c, t)
            if call.name == "probe":   # no strategy: the most CPU share free first (CpuIndex)
                nodes = self.c.s.nodes
                assert ordered == sorted(ordered, key=lambda nid: (
                    -placement.cpu_share_free(nodes[nid]), nid))

    @invariant()
    def a_waiting_task_fits_nowhere_or_waits_for_a_worker_coming(self) -> None:
        """A ready task left in its queue while a node with an idle worker holds it
        waits for a worker starting on a node it fits (placement prefers the better
        node's coming worker); else it is a placement missed."""
        pool = self.c.s.worker_pool
        for q in self.c.s.ready.values():
            if q and q[0].placement is None:
                fits = [self.c.s.nodes[nid] for nid in _scan(self.c, q[0])]
                if any(self.c.s.workers.idle_on(n.node_id) is not None for n in fits):
                    assert any(pool.can_grow(n) for n in fits), "a ready task fits an idle worker"


FitMemo.TestCase.settings = settings(max_examples=120, stateful_step_count=30, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
test_fit_memo = FitMemo.TestCase


def test_a_full_cluster_is_asked_once_per_shape_until_resources_free(monkeypatch) -> None:
    """Every CPU taken: tasks of one shape queued behind each other ask the nodes once;
    a task ending frees its CPU and the next placement looks again."""
    c = Nodes({0: {"CPU": 1.0}, 1: {"CPU": 1.0}}, pipeline_depth=3)
    calls = [c.submit(make_call(f"t{i}")) for i in range(2)]
    assert len(executed(c.take())) == 2
    asked: list[dict[str, float]] = []   # a request asked of a node, per node asked
    fits = NodeResources.fits
    monkeypatch.setattr(NodeResources, "fits", lambda self, req: asked.append(req) or fits(self, req))
    scan = placement.fitting_nodes   # (a request of CPUs alone is checked there, inline)

    def counted(nodes, req):
        nodes = list(nodes)
        if len(req) == 1 and "CPU" in req:
            asked.extend(req for _ in nodes)
        return scan(nodes, req)
    monkeypatch.setattr(placement, "fitting_nodes", counted)
    for i in range(3):
        c.submit(make_call(f"w{i}"))
    assert len(executed(c.take())) == 3   # pipelined behind the running ones
    assert len(asked) == 2                # the first placement asked both nodes; the next two none
    w = c.s.tasks[calls[0].task_id].worker
    c.s.blocked(worker_conn(w.worker_id), True, [b"x" * 16], calls[0].task_id, "t0")
    c.take()                              # blocked in get(): it lends its CPU
    before = len(asked)
    c.submit(make_call("after"))          # so the next placement looks again
    assert len(asked) > before
