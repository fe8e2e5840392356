"""Resource requests: validation, shapes, and per-node accounting (no I/O).

A request maps resource names to amounts: "CPU", "GPU" and custom names. A node holds
totals and what is free; GPUs also have ids, handed to the task that holds them.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from ._checks import is_number
from .exceptions import InfeasibleResourcesError

CPU = "CPU"
GPU = "GPU"
MEMORY = "memory"   # bytes of RAM a task or actor holds (memory=); a node's: see _session
_EPS = 1e-9
EPS = _EPS   # the slack of every comparison of amounts (a request fits free + EPS)


def make_request(num_cpus: float | None, num_gpus: float | None,
                 resources: Mapping[str, float] | None, *, default_cpus: float = 1.0,
                 memory: float | None = None) -> dict[str, float]:
    """Validate a task's resource options into one request dict."""
    req: dict[str, float] = {}
    cpus = default_cpus if num_cpus is None else num_cpus
    for name, amount in ((CPU, cpus), (GPU, num_gpus or 0), (MEMORY, memory or 0)):
        _check_amount(name, amount)
        if amount:
            req[name] = float(amount)
    for name, amount in (resources or {}).items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"resource names must be non-empty strings, got {name!r}")
        if name in (CPU, GPU, MEMORY):
            raise ValueError(f"use num_cpus= / num_gpus= / memory= for {name}, not "
                             f"resources={{{name!r}: ...}}")
        _check_amount(name, amount)
        if amount:
            req[name] = float(amount)
    gpus = req.get(GPU, 0.0)
    if gpus > 1 and not float(gpus).is_integer():
        raise ValueError(f"num_gpus={gpus}: above 1, GPUs must be whole numbers")
    return req


def _check_amount(name: str, amount: object) -> None:
    if not is_number(amount):
        raise TypeError(f"resource {name} must be a number, got {type(amount).__name__} {amount!r}")
    if amount < 0 or not math.isfinite(amount):
        raise ValueError(f"resource {name} must be a finite number >= 0, got {amount!r}")


def shape_key(req: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(req.items()))


# The pair that a loan key adds for tasks bound to one node (a name no resource takes:
# make_request refuses none, but "@" names never reach a node's resources).
PINNED = "@node"


def pinned_key(shape: tuple[tuple[str, float], ...], pinned_node: int) -> tuple[tuple[str, float], ...]:
    """The key of lent workers for ``shape`` (pinned_node: node id + 1, 0 for none)."""
    return shape + ((PINNED, float(pinned_node)),) if pinned_node else shape


def split_pinned(req: Mapping[str, float]) -> tuple[dict[str, float], int]:
    """A loan key's resources and its pinned node (node id + 1, 0 for none)."""
    res = dict(req)
    return res, int(res.pop(PINNED, 0))


# Resources counted in bytes (as Ray's): shown in GiB, not as 1.74249e+10.
_BYTES = ("memory", "object_store_memory")


def format_resources(req: Mapping[str, float], empty: str = "nothing") -> str:
    """``CPU=2, memory=9.42 GiB, far=100``: sorted, byte counts in GiB; ``empty`` for none."""
    return ", ".join(f"{k}={v / 2**30:.3g} GiB" if k in _BYTES and v >= 2**20 else f"{k}={v:g}"
                     for k, v in sorted(req.items())) or empty


def check_feasible(req: Mapping[str, float], node_totals: list[Mapping[str, float]],
                   what: str) -> None:
    """Raise InfeasibleResourcesError when no node can ever hold ``req``."""
    for totals in node_totals:
        if all(totals.get(k, 0.0) + _EPS >= v for k, v in req.items()):
            return
    have = "; ".join(format_resources(t) for t in node_totals) or "no nodes"
    ask = format_resources(req)
    raise InfeasibleResourcesError(
        f"{what} asks for {ask}, but no node of the cluster has that much (nodes have: {have}). "
        "Lower the request in .options(...) or start the cluster with more, e.g. "
        "orchestra.init(num_cpus=..., num_gpus=..., resources={...}).")


GPU_GROUP = "GPU_group_"   # a placement group's GPUs (_sched_types.bundle_request)


def group_gpus(req: Mapping[str, float]) -> float:
    """The GPUs a request in a placement group's bundle asks for (0: none). A bundle
    reserves a count of its node's GPUs; its tasks take device ids from the node's ids
    that are left (the count reserved keeps them from others)."""
    for k, v in req.items():
        if k.startswith(GPU_GROUP):
            return v
    return 0.0


class NodeResources:
    """Totals and free amounts of one node, with GPU ids. ``works=False``: a node that runs
    no work (a head whose machine's work runs on a node beside it): nothing fits there,
    not even a request of nothing.

    Owner and rule: only these methods change ``total``, ``free`` and ``gpu_free`` (the
    scheduler's one thread calls them), and each that may let a request fit that did
    not (a node made, resources given back or added) counts ``NodeResources.grown``
    up: a reader that found no node holding a request knows the answer stands while
    that count is the same (Placer's memo, _scheduler/placement.py). The count is the
    process's, shared by every scheduler in it: one grows, all look again. Each also
    names its node in ``watch`` (its scheduler's CpuIndex looks at those again)."""

    __slots__ = ("total", "free", "gpu_free", "works", "node_id", "watch")
    grown = 0   # class-wide (see above)

    def __init__(self, total: Mapping[str, float], works: bool = True, node_id: int = -1) -> None:
        self.total = {k: float(v) for k, v in total.items() if v}
        self.free = dict(self.total)
        self.gpu_free = [1.0] * int(self.total.get(GPU, 0))
        self.works = works
        NodeResources.grown += 1
        # The placer's index of nodes by CPU free (_scheduler/placement.py, CpuIndex):
        # each method that changes ``free`` adds ``node_id`` to ``watch`` (None: none).
        self.node_id = node_id
        self.watch: set[int] | None = None

    def fits(self, req: Mapping[str, float]) -> bool:
        # (Placer's pass over the nodes checks a request of CPUs alone the same way,
        # inline: _scheduler/placement.py, fitting_nodes.)
        if not self.works:
            return False
        free = self.free
        for k, v in req.items():
            if free.get(k, 0.0) + _EPS < v:
                return False
        if GPU in req:
            return self._pick_gpus(req[GPU]) is not None
        return True   # (a group's GPUs: its bundle's count holds them, see group_gpus)

    def feasible(self, req: Mapping[str, float]) -> bool:
        return self.works and all(self.total.get(k, 0.0) + _EPS >= v for k, v in req.items())

    def _pick_gpus(self, amount: float) -> list[int] | None:
        if amount >= 1:
            ids = [i for i, f in enumerate(self.gpu_free) if f >= 1 - _EPS][: int(amount)]
            return ids if len(ids) == int(amount) else None
        for i, f in enumerate(self.gpu_free):  # a fraction shares one GPU
            if f + _EPS >= amount:
                return [i]
        return None

    def acquire(self, req: Mapping[str, float]) -> list[int]:
        """Take ``req`` (must fit); returns the GPU ids given."""
        gpus: list[int] = []
        # gpu_free is empty on a node without GPUs: a plain task there pays no more.
        amount = req.get(GPU, 0.0) or (group_gpus(req) if self.gpu_free else 0.0)
        if amount:
            gpus = self._pick_gpus(amount) or []
            share = amount if amount < 1 else 1.0
            for i in gpus:
                self.gpu_free[i] -= share
        free = self.free
        for k, v in req.items():
            free[k] = free.get(k, 0.0) - v
        if self.watch is not None:
            self.watch.add(self.node_id)
        return gpus

    def release(self, req: Mapping[str, float], gpus: list[int]) -> None:
        NodeResources.grown += 1
        free = self.free
        for k, v in req.items():
            free[k] = free.get(k, 0.0) + v
        if self.watch is not None:
            self.watch.add(self.node_id)
        if gpus:
            share = req.get(GPU, 0.0) or group_gpus(req) or 1.0
            share = share if share < 1 else 1.0
            for i in gpus:
                self.gpu_free[i] = min(1.0, self.gpu_free[i] + share)

    def overdraw(self, req: Mapping[str, float]) -> None:
        """Take ``req`` even where it does not fit (a blocked worker's lent CPU, taken
        back as it resumes: the node may run over for a moment, as in Ray)."""
        free = self.free
        for k, v in req.items():
            free[k] = free.get(k, 0.0) - v
        if self.watch is not None:
            self.watch.add(self.node_id)

    def add(self, extra: Mapping[str, float]) -> None:
        """New resources on this node (a placement group's bundle reserved here, under
        names of its own): free and total."""
        NodeResources.grown += 1
        for k, v in extra.items():
            self.total[k] = self.total.get(k, 0.0) + v
            self.free[k] = self.free.get(k, 0.0) + v
        if self.watch is not None:
            self.watch.add(self.node_id)

    def remove(self, extra: Mapping[str, float]) -> None:
        """Resources ``add`` gave, gone again (a name left with nothing is dropped)."""
        for k, v in extra.items():
            left = self.total.get(k, 0.0) - v
            if left <= _EPS:
                self.total.pop(k, None)
                self.free.pop(k, None)
            else:
                self.total[k] = left
                self.free[k] = self.free.get(k, 0.0) - v
        if self.watch is not None:
            self.watch.add(self.node_id)
