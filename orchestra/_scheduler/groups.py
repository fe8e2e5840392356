"""Placement groups in the scheduler: bundles of resources reserved on nodes. No I/O.

    create (Request.create_placement_group) --no node set could ever hold it--> refused
        (InfeasibleResourcesError naming the bundle), or on a joinable cluster PENDING
        with a warning to its creator, until nodes that hold it join
    PENDING --every bundle fits a node its strategy allows, now--> CREATED: each bundle's
        resources leave its node's free pool and come back there under the bundle's own
        names; the group's ready pseudo-object is sealed (pg.ready() resolves)
    CREATED --a node holding bundles died--> PENDING: those bundles are placed again
    a task or actor started with no strategy by one running in the group with
        capture_child_tasks=True --capture--> in the same group, any bundle
    remove_placement_group, or its creator's connection closed (unless detached)
        --> REMOVED: its actors are killed, tasks running in it are killed (their
        workers too) and fail, queued ones fail, the bundles return to their nodes

Resource names (Ray's): bundle i of group G reserving {"CPU": 2} adds to its node
``CPU_group_i_G`` = 2 and ``CPU_group_G`` = 2 (summed over G's bundles there), and
``bundle_group_i_G`` = ``bundle_group_G`` = 1000 (a task that asks for nothing takes
0.001). A task in bundle i asks for both names, one in any bundle (-1) for the second
(_sched_types.bundle_request). So fits/acquire, the node order, pipelining by shape and
the one-worker-per-grant accounting work on bundles unchanged.

Strategies, all or nothing (a group is placed whole, or waits):
    PACK           all on one node when one holds them, else as few nodes as fit
    SPREAD         each bundle on the node holding fewest of the group's, when it fits
    STRICT_PACK    all on one node, or wait
    STRICT_SPREAD  each bundle on a node of its own, or wait
"""
from __future__ import annotations

import collections
import enum
from collections.abc import Mapping
from typing import NamedTuple

from .._ids import node_hex
from .._objects.serialization import serialize
from .._resources import format_resources
from ..exceptions import InfeasibleResourcesError
from .actors import ActorTable
from .call import PLACEMENT_GROUP, PlacementSpec
from .data import error_value, inline
from .durable import group_gone, group_kept
from .instructions import KillWorker, Warn
from .model import SchedulerCore, Task, TaskState, Worker
from .objects import ObjectDirectory

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
BUNDLE_UNITS = 1000.0   # "bundle" units per bundle: tasks asking for nothing take 0.001
READY_SUFFIX = b"\xff\xff\xff\xfe"   # group id + this: its ready pseudo-object
_EPS = 1e-9
_REMOVED_KEPT = 1000   # removed groups' records kept for placement_group_table


class GroupState(enum.Enum):
    PENDING = "PENDING"
    CREATED = "CREATED"
    REMOVED = "REMOVED"


class GroupSpec(NamedTuple):
    """A placement group as its creator asked for it: ``bundles``, each a resource
    request; ``strategy`` PACK, SPREAD, STRICT_PACK or STRICT_SPREAD; ``name`` ("": none),
    findable by it; ``detached``: it outlives its creator's connection. (The head's edge
    reads it from the protocol's PlacementGroupSpec, and writes it there for the state
    store and the replies.)"""

    group_id: bytes
    bundles: tuple[Mapping[str, float], ...]
    strategy: str
    name: str = ""
    detached: bool = False


class GroupInfo(NamedTuple):
    """A placement group as placement_group_table() shows it: its spec, its state
    (PENDING, CREATED, REMOVED), and for each bundle its node's id + 1 (0: not placed)."""

    spec: GroupSpec
    state: str
    bundle_nodes: list[int]


class Group:
    __slots__ = ("spec", "gid", "hex", "state", "nodes", "owner", "bundles")

    def __init__(self, spec: GroupSpec, owner: int) -> None:
        self.spec = spec
        self.gid: bytes = spec.group_id
        self.hex = spec.group_id.hex()
        self.state = GroupState.PENDING
        self.bundles = [dict(b) for b in spec.bundles]
        self.nodes: list[int | None] = [None] * len(self.bundles)   # where each bundle is
        self.owner = owner


def _fits(avail: Mapping[str, float], req: Mapping[str, float]) -> bool:
    return all(avail.get(k, 0.0) + _EPS >= v for k, v in req.items())


def _take(avail: dict[str, float], req: Mapping[str, float]) -> None:
    for k, v in req.items():
        avail[k] = avail.get(k, 0.0) - v


def _sum(reqs: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in reqs:
        for k, v in r.items():
            out[k] = out.get(k, 0.0) + v
    return out


def place_bundles(strategy: str, bundles: list[dict[str, float]],
                  avail: dict[int, dict[str, float]],
                  fixed: Mapping[int, int] | None = None) -> dict[int, int] | None:
    """Where each bundle not in ``fixed`` (bundle index -> node id, already placed) goes:
    bundle index -> node id, or None when the strategy cannot place them all in
    ``avail`` (node id -> resources free there; not changed)."""
    fixed = dict(fixed or {})
    todo = [i for i in range(len(bundles)) if i not in fixed]
    free = {n: dict(r) for n, r in avail.items()}
    used = sorted(set(fixed.values()))
    nodes = used + [n for n in sorted(free) if n not in used]   # nodes of the group first
    if strategy in ("PACK", "STRICT_PACK"):
        need = _sum([bundles[i] for i in todo])
        candidates = used if strategy == "STRICT_PACK" and used else nodes
        for n in candidates:
            if n in free and _fits(free[n], need):
                return {i: n for i in todo}
        if strategy == "STRICT_PACK":
            return None
        return _greedy(todo, bundles, free, nodes, fixed, spread=False)
    if strategy == "SPREAD":
        return _greedy(todo, bundles, free, nodes, fixed, spread=True)
    if strategy == "STRICT_SPREAD":
        taken = set(fixed.values())
        return _distinct(todo, bundles, free, [n for n in sorted(free) if n not in taken])
    raise ValueError(f"unknown placement strategy {strategy!r}")


def _greedy(todo: list[int], bundles: list[dict[str, float]], free: dict[int, dict[str, float]],
            nodes: list[int], fixed: dict[int, int], spread: bool) -> dict[int, int] | None:
    count = {n: 0 for n in nodes}
    for n in fixed.values():
        count[n] = count.get(n, 0) + 1
    out: dict[int, int] = {}
    for i in todo:
        fitting = [n for n in nodes if _fits(free[n], bundles[i])]
        if not fitting:
            return None
        if spread:   # fewest bundles of the group first
            n = min(fitting, key=lambda x: (count[x], nodes.index(x)))
        else:        # a node already used first (nodes lists those first)
            n = max(fitting, key=lambda x: (count[x] > 0, -nodes.index(x)))
        _take(free[n], bundles[i])
        count[n] += 1
        out[i] = n
    return out


def _distinct(todo: list[int], bundles: list[dict[str, float]], free: dict[int, dict[str, float]],
              nodes: list[int]) -> dict[int, int] | None:
    """Each bundle on a node of its own (a small search: groups have few bundles)."""
    if not todo:
        return {}
    i, rest = todo[0], todo[1:]
    for n in nodes:
        if _fits(free[n], bundles[i]):
            others = _distinct(rest, bundles, free, [m for m in nodes if m != n])
            if others is not None:
                return {i: n, **others}
    return None


def group_resources(bundle: Mapping[str, float], index: int, group_hex: str) -> dict[str, float]:
    """The names and amounts a bundle adds to its node once reserved."""
    out: dict[str, float] = {}
    for k, v in {**bundle, "bundle": BUNDLE_UNITS}.items():
        out[f"{k}_group_{index}_{group_hex}"] = v
        out[f"{k}_group_{group_hex}"] = v
    return out




class PlacementGroups:
    """The placement groups of a SchedulerState (its helper, as ActorTable is)."""

    def __init__(self, state: SchedulerCore, directory: ObjectDirectory, actors: ActorTable,
                 joinable: bool = False, infeasible_waits: bool = False) -> None:
        self.s = state
        self.directory = directory   # the group's ready object: made, sealed, dropped there
        self.actors = actors         # the actors created in a group end with it
        self.joinable = joinable
        self.infeasible_waits = infeasible_waits
        self.groups: dict[bytes, Group] = {}
        # Removed groups stay in ``groups`` (placement_group_table gives their record,
        # state REMOVED, as Ray does), the newest _REMOVED_KEPT of them, oldest first here.
        self.removed: collections.deque[bytes] = collections.deque()
        self.names: dict[str, bytes] = {}
        self.pending: list[Group] = []
        # Tasks killed with their group, by task id: the error they end with when their
        # worker's death is seen (instead of "cancelled").
        self.doomed: dict[bytes, bytes] = {}

    # ------------------------------------------------------------------ create
    def create(self, conn: int, spec: GroupSpec) -> None:
        """Raises ValueError (a bad spec, a taken name) or InfeasibleResourcesError (no
        set of the cluster's nodes could ever hold it, on a cluster no node may join)."""
        if spec.strategy not in STRATEGIES:
            raise ValueError(f"placement group strategy {spec.strategy!r}: use one of "
                             f"{', '.join(STRATEGIES)}")
        known = self.groups.get(spec.group_id)
        if known is not None and known.spec == spec and known.state is not GroupState.REMOVED:
            # The same request again, made on a restarted head that kept the group (a
            # driver that did not hear the first answer, _runtime/verbs.py): the caller
            # holds its ready object, as its creator does.
            self.directory.hold_once(conn, spec.group_id + READY_SUFFIX)
            return
        if known is not None:
            raise ValueError(f"placement group {spec.group_id.hex()} exists already")
        if spec.name and spec.name in self.names:
            raise ValueError(f"a placement group named {spec.name!r} exists already: names are "
                             "unique among live groups; pick another, or "
                             "get_placement_group() the existing one")
        g = Group(spec, conn)
        why = self.infeasible(g)
        if why is not None:
            if not (self.joinable or self.infeasible_waits):
                raise InfeasibleResourcesError(why + " Lower the bundle, or start the cluster with "
                                               "more, e.g. orchestra.init(num_cpus=..., resources={...}).")
            if conn in self.s.clients:
                self.s.out.append(Warn(conn, (
                    f"orchestra: {why} " + (
                        "It waits until nodes that can hold it join (orchestra start "
                        "--address ...)." if self.joinable else
                        "It stays pending, as in Ray, although no node can join this "
                        "local cluster: remove it, or lower its bundles."))))
        self.groups[g.gid] = g
        if spec.name:
            self.names[spec.name] = g.gid
        if spec.detached:
            self.s.out.append(group_kept(spec))
        ready = g.gid + READY_SUFFIX
        self.directory.new_object(conn, ready).count += 1   # held by its creator and by the group
        if not self._try_place(g):
            self.pending.append(g)

    def infeasible(self, g: Group) -> str | None:
        """Why no set of the cluster's nodes, empty, could hold ``g``; None when one could."""
        totals = {n.node_id: dict(n.resources.total) for n in self.s.nodes.values()
                  if n.resources.works}
        if place_bundles(g.spec.strategy, g.bundles, totals) is not None:
            return None
        have = "; ".join(f"{node_hex(n)}: {format_resources(t)}" for n, t in sorted(totals.items())) or "none"
        for i, b in enumerate(g.bundles):
            if not any(_fits(t, b) for t in totals.values()):
                return (f"placement group {self._label(g)}: bundle {i} ({format_resources(b)}) is "
                        f"larger than any node of the cluster (nodes: {have}).")
        what = {"STRICT_PACK": f"all {len(g.bundles)} bundles on one node",
                "STRICT_SPREAD": f"its {len(g.bundles)} bundles on {len(g.bundles)} distinct nodes"
                }.get(g.spec.strategy, "its bundles")
        return (f"placement group {self._label(g)} ({g.spec.strategy}) needs {what} "
                f"({'; '.join(format_resources(b) for b in g.bundles)}), which the cluster's nodes cannot "
                f"hold (nodes: {have}).")

    @staticmethod
    def _label(g: Group) -> str:
        return repr(g.spec.name) if g.spec.name else g.hex

    def place_pending(self) -> None:
        if self.pending:
            waiting, self.pending = self.pending, []
            for g in waiting:
                if g.state is GroupState.PENDING and not self._try_place(g):
                    self.pending.append(g)

    def _try_place(self, g: Group) -> bool:
        """Reserve every unplaced bundle of ``g`` now, or none; True when it is whole."""
        s = self.s
        fixed = {i: n for i, n in enumerate(g.nodes) if n is not None}
        avail = {n.node_id: n.resources.free for n in s.nodes.values() if n.resources.works}
        where = place_bundles(g.spec.strategy, g.bundles, avail, fixed)
        if where is None:
            return False
        for i, nid in sorted(where.items()):
            self._reserve(g, i, nid)
        g.state = GroupState.CREATED
        ready = g.gid + READY_SUFFIX
        o = s.objects.get(ready)
        if o is not None and o.data is None:
            self.directory.seal(ready, inline(ready, serialize(True).to_bytes()))
        return True

    def _reserve(self, g: Group, i: int, node_id: int) -> None:
        r = self.s.nodes[node_id].resources
        r.overdraw(g.bundles[i])   # (it fits: place_bundles chose the node for it)
        r.add(group_resources(g.bundles[i], i, g.hex))
        g.nodes[i] = node_id

    def _unreserve(self, g: Group, i: int) -> None:
        nid = g.nodes[i]
        g.nodes[i] = None
        node = self.s.nodes.get(nid) if nid is not None else None
        if node is None:
            return
        r = node.resources
        r.remove(group_resources(g.bundles[i], i, g.hex))
        r.release(g.bundles[i], [])

    # ------------------------------------------------------------------ tasks in groups
    def cancelled_error(self, t: Task) -> bytes:
        """The error of a cancelled task: killed with its placement group (``doomed``),
        or cancelled by cancel()."""
        doomed = self.doomed.pop(t.call.task_id, None) if self.doomed else None
        return doomed or self.s.error("cancelled", name=t.call.name)

    def unplaceable(self, t: Task) -> bytes | None:
        """The error of a task or actor whose group is gone, or whose request its bundle
        can never hold; None when it may run (maybe once the group is placed)."""
        gid = t.call.group_id
        g = self.groups.get(gid)
        s = self.s
        what = f"actor {t.call.actor.class_name}" if t.call.actor is not None else f"task {t.call.name}()"
        if g is None or g.state is GroupState.REMOVED:
            return s.error("group", text=(
                f"{what} was to run in placement group {gid.hex()}, which "
                f"{'was removed' if g is not None else 'does not exist'}. Create the group "
                "first, and keep it until its tasks and actors are done."), cancelled=g is not None)
        p = t.call.placement
        idx = p.bundle_index if p is not None else -1
        if idx >= len(g.bundles) or idx < -1:
            return s.error("group", text=(
                f"{what}: placement_group_bundle_index={idx}, but placement group "
                f"{self._label(g)} has {len(g.bundles)} bundles (0..{len(g.bundles) - 1}, or -1 "
                "for any)."))
        req = dict(t.call.resources) or {}
        bundles = g.bundles if idx < 0 else [g.bundles[idx]]
        if not any(_fits(b, req) for b in bundles):
            which = "any bundle" if idx < 0 else f"bundle {idx}"
            return s.error("group", text=(
                f"{what} asks for {format_resources(req)}, more than {which} of placement group "
                f"{self._label(g)} holds ({'; '.join(format_resources(b) for b in bundles)}). Ask for less "
                "in .options(...), or make the bundle larger."))
        return None

    @staticmethod
    def capture(t: Task, w: Worker) -> Task | None:
        """``t``, submitted with no strategy by a task or actor running in a placement
        group with placement_group_capture_child_tasks=True: the same task in that group
        (any bundle). None when it is not captured."""
        parent = w.actor.creation if w.actor is not None else w.queue[0] if w.queue else None
        p = parent.placement if parent is not None else None
        if parent is None or p is None or p[0] != PLACEMENT_GROUP or not p[2]:
            return None
        call = t.call
        call.place(PlacementSpec(PLACEMENT_GROUP, group_id=parent.call.group_id, bundle_index=-1,
                                 capture_child_tasks=True))
        return Task(call, t.owner)

    # ------------------------------------------------------------------ removal
    def remove(self, gid: bytes, reason: str = "removed by remove_placement_group()") -> None:
        g = self.groups.get(gid)
        if g is None or g.state is GroupState.REMOVED:
            return
        s = self.s
        g.state = GroupState.REMOVED
        self.removed.append(gid)
        if g.spec.detached:
            s.out.append(group_gone(gid))
        while len(self.removed) > _REMOVED_KEPT:
            self.groups.pop(self.removed.popleft(), None)
        if g.spec.name and self.names.get(g.spec.name) == gid:
            del self.names[g.spec.name]
        if g in self.pending:
            self.pending.remove(g)
        err = s.error("group", text=(f"placement group {self._label(g)} was {reason} while "
                                     "this ran in it, or waited to"), cancelled=True)
        mine = f"_group_{g.hex}"

        def in_group(t: Task) -> bool:
            return t.placement is not None and t.placement[0] == PLACEMENT_GROUP \
                and t.call.group_id == gid

        for aid in self.actors.in_group(gid):
            self.actors.kill(aid, True, reason=f"its placement group {self._label(g)} was {reason}")
        for w in list(s.workers.values()):
            if not any(k.endswith(mine) for k in w.grant):
                continue
            s.release_grant(w)   # now, before the bundle's names leave the node
            if w.actor is None and w.queue:
                for t in w.queue:
                    t.cancelled = True
                    self.doomed[t.call.task_id] = err
                s.out.append(KillWorker(w.node_id, w.worker_id, f"its placement group was {reason}"))
        for q in s.ready.values():
            for t in [t for t in q if in_group(t)]:
                s.fail_task(t, err)
        for t in list(s.tasks.values()):   # waiting for arguments: fail now, not when ready
            if t.state is TaskState.WAITING and in_group(t) and not t.call.actor_id:
                s.fail_task(t, err)
        for i in range(len(g.bundles)):
            self._unreserve(g, i)
        ready = gid + READY_SUFFIX
        o = s.objects.get(ready)
        if o is not None and o.data is None:
            self.directory.seal(ready, error_value(ready, s.error("group", text=(
                f"placement group {self._label(g)} was {reason} before all its bundles were "
                "reserved"), cancelled=True)))
        self.directory.decr(ready)
        s.schedule()

    def client_gone(self, conn: int) -> None:
        """A connection closed: the groups it made go with it, unless detached."""
        for g in list(self.groups.values()):
            if g.owner == conn and not g.spec.detached and g.state is not GroupState.REMOVED:
                self.remove(g.gid, "removed when the process that made it exited")

    def node_removed(self, node_id: int) -> None:
        """The node died: its bundles are placed again (the group waits until they are)."""
        for g in self.groups.values():
            if g.state is not GroupState.REMOVED and node_id in g.nodes:
                g.nodes = [None if n == node_id else n for n in g.nodes]
                if g.state is GroupState.CREATED:
                    g.state = GroupState.PENDING
                    self.pending.append(g)

    # ------------------------------------------------------------------ queries
    def info(self, g: Group) -> GroupInfo:
        return GroupInfo(g.spec, g.state.value, [0 if n is None else n + 1 for n in g.nodes])

    def by_name(self, name: str) -> GroupInfo:
        gid = self.names.get(name)
        if gid is None:
            raise ValueError(f"no placement group is named {name!r}; named groups are made with "
                             "placement_group(bundles, name=...)")
        return self.info(self.groups[gid])

    def table(self, gid: bytes = b"") -> list[GroupInfo]:
        if gid:
            g = self.groups.get(gid)
            if g is None:
                raise ValueError(f"no placement group {gid.hex()} in this cluster")
            return [self.info(g)]
        return [self.info(g) for g in self.groups.values()]
