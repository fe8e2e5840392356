"""Placement over nodes: which node a task or an actor goes to. No I/O.

    Call.placement (scheduling_strategy=) --Task.placement--> None, or (strategy, node, soft)
    submit: Placer.admit -- no node can ever hold it --> fail (InfeasibleResourcesError), or,
        on a cluster nodes may join (joinable), wait for one, its owner warned once (WARNING);
        with infeasible_waits (a private cluster under the Ray runner) wait too, as Ray does
        -- hard affinity to a node not in the cluster, or one that can never hold it --> fail
    schedule, one node and no strategy: the first idle worker (SchedulerState's fast path)
    schedule, several nodes or a strategy: Placer.order(t) = the nodes where the request
        fits now, best first -> an idle worker on the first that has one, or a worker
        started there; pipelined only on workers of nodes the strategy allows

The order, per strategy:
    DEFAULT        most bytes of the task's arguments held there (primary segments and
                   pulled copies), then the most free CPU share (an idle cluster spreads:
                   two tasks on two idle nodes go one to each), then the lower node id
    SPREAD         least CPU share in use first; ties in turn, after the node chosen last
    NODE_AFFINITY  hard: that node only; soft: that node first, then as DEFAULT
    PLACEMENT_GROUP  as DEFAULT, over the nodes holding its bundle's reserved names
                   (_scheduler/groups.py); it waits while its group is not placed

Node ids missing from ``nodes`` (removed) are simply never candidates; a task with hard
affinity to one fails when it is next scheduled.

A task with no strategy and no argument held anywhere, asking for CPUs alone (the common
one), takes its first node from an index of the working nodes by CPU share free
(CpuIndex: a heap, looked at again only for the nodes whose resources changed since):
the node the pass over every node would find first, when that one fits; else the pass
decides, as before.

A request no node holds now is remembered as such (by its shape) until some node's
free resources grow (NodeResources.grown counts that): while the cluster is full,
placing a task of that shape asks no node again (at 1,000 nodes, asking each node per
placement was most of the head's time while tasks were pipelined behind busy workers).
"""
from __future__ import annotations

import collections
import heapq
from collections.abc import Hashable, Iterable, Iterator, Mapping

from .._ids import node_hex
from .._resources import CPU, EPS, NodeResources, format_resources
from .call import NODE_AFFINITY, PLACEMENT_GROUP, SPREAD
from .instructions import Warn
from .model import Node, SchedulerCore, Task


def hard_node(t: Task) -> int | None:
    """The only node ``t`` may run on, or None when it may run anywhere."""
    p = t.placement
    if p is not None and p[0] == NODE_AFFINITY and not p[2]:
        return p[1]
    return None


def fitting_nodes(nodes: Iterable[Node], req: Mapping[str, float]) -> list[Node]:
    """The nodes where ``req`` fits now, in their order (NodeResources.fits). A request
    of CPUs alone, the common one, is checked inline, as fits checks it: a pass over
    1,000 nodes takes ~80 us instead of ~230 us asking each, which was most of a
    placement there (a full cluster looks again whenever a task ends)."""
    if len(req) == 1:
        cpus = req.get(CPU)
        if cpus is not None:
            return [n for n in nodes if (r := n.resources).works
                    and r.free.get(CPU, 0.0) + EPS >= cpus]
    return [n for n in nodes if n.resources.fits(req)]


def most_cpu_free(nodes: list[Node]) -> Node:
    """The node with the largest share of its CPUs free, the lowest id of those alike:
    min(nodes, key=(-cpu_share_free(n), n.node_id)) in one inline pass (~3x less at
    1,000 nodes with room, where a placement's first node was most of its cost)."""
    best = nodes[0]
    r = best.resources
    total = r.total.get(CPU, 0.0)
    best_share = r.free.get(CPU, 0.0) / total if total else 0.0
    for n in nodes:
        r = n.resources
        total = r.total.get(CPU, 0.0)
        share = r.free.get(CPU, 0.0) / total if total else 0.0
        if share > best_share or (share == best_share and n.node_id < best.node_id):
            best, best_share = n, share
    return best


class CpuIndex:
    """The working nodes of a scheduler by CPU share free, most first, the lower id of
    those alike: ``first()`` is min(working nodes, key=(-cpu_share_free(n), n.node_id))
    without a pass over them (at 1,000 nodes that pass was a quarter of the head's time).

    A heap of (-share, node id) entries, some stale: each node's NodeResources adds its
    id to ``changed`` whenever its free resources change (its ``watch``), and first()
    pushes a fresh entry for each of those, then drops the stale entries on top (a node
    gone, or whose share is not the entry's now). The heap is made again from the nodes
    when stale entries are most of it. Owner: its Placer, on the scheduler's thread;
    nodes join and leave through added() and removed() (SchedulerState)."""

    __slots__ = ("nodes", "heap", "changed", "slack")

    def __init__(self, nodes: Mapping[int, Node], slack: int = 64) -> None:
        self.nodes = nodes
        self.heap: list[tuple[float, int]] = []
        self.changed: set[int] = set()
        self.slack = slack   # entries beyond 4 per node before the heap is made again

    def added(self, node: Node) -> None:
        node.resources.watch = self.changed
        self.changed.add(node.node_id)

    def removed(self, node: Node) -> None:
        node.resources.watch = None   # (its entries are dropped as stale)

    def first(self) -> Node | None:
        """The working node with the largest CPU share free (the lowest id of those
        alike); None when no node works."""
        heap, nodes = self.heap, self.nodes
        if self.changed:
            if len(heap) > 4 * len(nodes) + self.slack:   # mostly stale: made again
                self.changed.clear()
                heap[:] = [(-cpu_share_free(n), n.node_id) for n in nodes.values()
                           if n.resources.works]
                heapq.heapify(heap)
            else:
                for nid in self.changed:
                    n = nodes.get(nid)
                    if n is not None and n.resources.works:
                        heapq.heappush(heap, (-cpu_share_free(n), nid))
                self.changed.clear()
        while heap:
            neg, nid = heap[0]
            n = nodes.get(nid)
            if n is not None and n.resources.works and -cpu_share_free(n) == neg:
                return n
            heapq.heappop(heap)
        return None


def cpu_share_free(node: Node) -> float:
    total = node.resources.total.get("CPU", 0.0)
    return node.resources.free.get("CPU", 0.0) / total if total else 0.0


class Placer:
    """The node decisions of a SchedulerState (its helper, as Loans is)."""

    def __init__(self, state: SchedulerCore, joinable: bool = False,
                 infeasible_waits: bool = False) -> None:
        self.s = state
        # Nodes may join this cluster: a request no node holds waits (with a warning)
        # instead of failing at once. infeasible_waits: it waits although none may join.
        self.joinable = joinable
        self.infeasible_waits = infeasible_waits
        self.last_spread = -1        # the node the last SPREAD task went to
        self._warned: set[tuple[int, Hashable]] = set()   # (owner, request) warned of
        # Request shape -> NodeResources.grown when no node held it (see the docstring).
        self._nowhere: dict[Hashable, int] = {}
        # A restarted head's joined nodes of before, not back yet (KeptObjects.nodes:
        # node id -> until when it is waited for, each for up to node_wait_s), which a
        # warning names; set by the state.
        self.nodes_of_before: dict[int, float] = {}
        self.node_wait_s = 0.0
        self.index = CpuIndex(state.nodes)   # the nodes by CPU share free

    # ------------------------------------------------------------------ admission
    def admit(self, t: Task, feasible: bool) -> bytes | None:
        """At submit: the error that fails ``t`` now, or None when it may be scheduled
        (or wait for a node to join). ``feasible``: some node can ever hold its request."""
        err = self.unplaceable(t)
        if err is not None or feasible or t.placement is not None and t.placement[0] == PLACEMENT_GROUP:
            return err   # (in a group: it waits for its bundle, however long)
        s = self.s
        if not (self.joinable or self.infeasible_waits):
            return s.error("infeasible", name=t.call.name, resources=t.resources)
        key = (t.owner, (t.shape, t.placement))
        if key not in self._warned and t.owner in s.clients:
            self._warned.add(key)
            s.out.append(Warn(t.owner, _warning(
                t, s.nodes, self.joinable, len(self.nodes_of_before), self.node_wait_s)))
        return None

    def unplaceable(self, t: Task) -> bytes | None:
        """The error of a task with hard affinity to a node that is not in the cluster,
        or can never hold its request, or in a placement group that is gone or whose
        bundle cannot hold it; None when it may be placed."""
        p = t.placement
        if p is not None and p[0] == PLACEMENT_GROUP:
            return self.s.group_unplaceable(t)
        nid = hard_node(t)
        if nid is None:
            return None
        node = self.s.nodes.get(nid)
        if node is None:
            reason = "no such node is in the cluster (it never joined, or it died)"
        elif not node.resources.works:
            reason = ("that node is the head's, which runs no work (its machine's work runs "
                      "on the node beside it: pin to that one)")
        elif not node.resources.feasible(t.resources):
            reason = f"that node has only {format_resources(node.resources.total)}"
        else:
            return None
        return self.s.error("infeasible", name=t.call.name, resources=t.resources,
                            node=node_hex(nid), reason=reason)

    # ------------------------------------------------------------------ order
    def order(self, t: Task) -> list[Node]:
        """The nodes where ``t``'s request fits now and its strategy allows, best first."""
        nodes = self.s.nodes
        req = t.resources
        p = t.placement
        if p is not None and p[0] == NODE_AFFINITY and not p[2]:
            node = nodes.get(p[1])
            return [node] if node is not None and node.resources.fits(req) else []
        fitting = self.fitting(t)
        if len(fitting) < 2:
            return fitting
        if p is not None and p[0] == SPREAD:
            last = self.last_spread
            fitting.sort(key=lambda n: (-cpu_share_free(n), n.node_id <= last, n.node_id))
            return fitting
        held = self.arg_bytes(t) if t.arg_ids else {}
        fitting.sort(key=lambda n: (-held.get(n.node_id, 0), -cpu_share_free(n), n.node_id))
        if p is not None and p[0] == NODE_AFFINITY:   # soft: its node first when it fits
            for i, n in enumerate(fitting):
                if n.node_id == p[1]:
                    fitting.insert(0, fitting.pop(i))
                    break
        return fitting

    def fitting(self, t: Task) -> list[Node]:
        """The nodes where ``t``'s request fits now, in the nodes' order; none, without
        asking them, while the last look found none for its shape and no node's free
        resources grew since."""
        grown = NodeResources.grown
        nowhere = self._nowhere
        if nowhere.get(t.shape) == grown:
            return []
        fitting = fitting_nodes(self.s.nodes.values(), t.resources)
        if not fitting:
            if len(nowhere) > 256:   # (shapes are few; stale entries only cost room)
                nowhere.clear()
            nowhere[t.shape] = grown
        return fitting

    def ordered(self, t: Task) -> Iterator[Node]:
        """order(t), lazily: with no strategy, its first node is found in one pass and
        the rest sorted only if the caller goes on (a placement mostly takes the first:
        at 1,000 nodes the sort was most of a decision)."""
        if t.placement is not None:
            yield from self.order(t)
            return
        held = self.arg_bytes(t) if t.arg_ids else {}
        req = t.resources
        first = None
        if not held and len(req) == 1 and (cpus := req.get(CPU)) is not None:
            # The first node of the pass below (most_cpu_free), when it fits (fits' rule
            # for CPUs alone, as fitting_nodes checks it): no pass. Else the pass decides.
            top = self.index.first()
            if top is not None and top.resources.free.get(CPU, 0.0) + EPS >= cpus:
                first = top
                yield first
        fitting = self.fitting(t)   # (after the index's node: only if the caller goes on)

        def key(n: Node) -> tuple[int, float, int]:
            return -held.get(n.node_id, 0), -cpu_share_free(n), n.node_id
        if first is None:
            if len(fitting) < 2:
                yield from fitting
                return
            first = min(fitting, key=key) if held else most_cpu_free(fitting)
            yield first
        fitting.sort(key=key)
        yield from (n for n in fitting if n is not first)

    def placed(self, t: Task, node_id: int) -> None:
        """``t`` took a worker on ``node_id``: the next SPREAD turn starts after it."""
        p = t.placement
        if p is not None and p[0] == SPREAD:
            self.last_spread = node_id

    def arg_bytes(self, t: Task) -> dict[int, int]:
        """Node id -> bytes of ``t``'s arguments held there, in segments (primary or
        pulled copies; values inline in messages travel with the task and count nowhere)."""
        held: dict[int, int] = collections.defaultdict(int)
        objects = self.s.objects
        for oid in t.arg_ids:
            o = objects.get(oid)
            data = o.data if o is not None else None
            if data is None or data.segment is None:
                continue
            seg = data.segment
            where = {seg.node_id}
            where.update(getattr(o, "copies", None) or ())
            for nid in where:
                held[nid] += seg.size
        return held




def _warning(t: Task, nodes: dict[int, Node], joinable: bool, away: int = 0,
             wait_s: float = 0.0) -> str:
    """``away``: joined nodes of before a restart of the head, not back yet, each waited
    for up to ``wait_s``."""
    have = "; ".join(f"{node_hex(n.node_id)}: {format_resources(n.resources.total)}" for n in nodes.values())
    what = f"actor {t.call.actor.class_name}" if t.call.actor is not None else f"task {t.call.name}()"
    back = (f"It waits: {away} node{'s that were' if away > 1 else ' that was'} in the cluster "
            f"before its head restarted {'have' if away > 1 else 'has'} not joined again yet "
            f"(each is waited for up to {wait_s:g} s), and one may hold it. ") if away else ""
    return (
        f"orchestra: {what} asks for {format_resources(t.resources)}, which no node of the cluster can hold "
        f"now (nodes: {have or 'none'}). " + back + (
            "It waits until a node that can hold it joins (orchestra start --address ...); "
            "or lower the request in .options(...)." if joinable else
            "It stays pending, as in Ray, although no node can join this local cluster: "
            "lower the request in .options(...), or cancel it (cancel(ref))."))
