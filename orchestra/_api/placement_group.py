"""Placement groups (as in Ray): bundles of resources reserved on nodes, for tasks and
actors to run in.

    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
        --Request(create_placement_group)--> head (_scheduler/groups.py): refused at once when no
        nodes could ever hold it (a private cluster), else reserved now or when it fits
    orchestra.get(pg.ready())      # resolves once every bundle is reserved
    f.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()
        --> runs on bundle 0's node, holding bundle 0's resources (not the free pool)
    remove_placement_group(pg)     # its actors and running tasks are killed, the rest fail

A group lives until removed, or until the process that made it exits (a driver's group
ends with the driver), unless made with lifetime="detached" on a cluster started by
``orchestra start``.
"""
from __future__ import annotations

import math
from typing import Any

from .. import _ids
from .._checks import is_number
from .._objects.errors import note_private_detached
from .._runtime import context as _context
from .._runtime import verbs as _verbs
from .._runtime.object_ref import ObjectRef

_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_READY_SUFFIX = b"\xff\xff\xff\xfe"   # as _pg_state.READY_SUFFIX


class PlacementGroup:
    """A handle to a placement group: ``id``, ``bundle_specs``, ``ready()``, ``wait()``.
    Picklable: a task may schedule into a group its caller made.

    Made by ``placement_group(...)`` and ``get_placement_group(name)``: ``group_id`` is
    the group's id, ``bundles`` its bundles' resources, ``ready`` the ref that resolves
    once they are reserved."""

    def __init__(self, group_id: bytes, bundles: list[dict[str, float]],
                 ready: ObjectRef | None = None) -> None:
        self._id = group_id
        self._bundles = bundles
        self._ready = ready

    @property
    def id(self) -> bytes:
        """The group's id (bytes); ``id.hex()`` as placement_group_table() keys it."""
        return self._id

    @property
    def bundle_specs(self) -> list[dict[str, float]]:
        """Each bundle's resources, in bundle-index order (copies)."""
        return [dict(b) for b in self._bundles]

    @property
    def bundle_count(self) -> int:
        """The number of bundles."""
        return len(self._bundles)

    def ready(self) -> ObjectRef:
        """An ObjectRef that resolves (to True) once every bundle is reserved; getting it
        raises TaskCancelledError when the group was removed before."""
        if self._ready is None:
            self._ready = ObjectRef(self._id + _READY_SUFFIX, _context.current_client())
        return self._ready

    def wait(self, timeout_seconds: float = 30) -> bool:
        """Whether every bundle is reserved within ``timeout_seconds``."""
        from .session import wait
        done, _ = wait([self.ready()], timeout=timeout_seconds)
        return bool(done)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlacementGroup, (self._id, self._bundles))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementGroup) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        return f"PlacementGroup({self._id.hex()}, bundles={self._bundles})"


def _check_bundles(bundles: object) -> list[dict[str, float]]:
    if not isinstance(bundles, (list, tuple)) or not bundles:
        raise ValueError(f"bundles must be a non-empty list of dicts such as [{{'CPU': 1}}], "
                         f"got {bundles!r}")
    out = []
    for i, b in enumerate(bundles):
        if not isinstance(b, dict) or not b:
            raise ValueError(f"bundle {i} must be a non-empty dict of resource amounts such as "
                             f"{{'CPU': 1}}, got {b!r}")
        clean: dict[str, float] = {}
        for k, v in b.items():
            if not isinstance(k, str) or not k:
                raise ValueError(f"bundle {i}: resource names must be non-empty strings, got {k!r}")
            if not is_number(v) or v < 0 or not math.isfinite(v):
                raise ValueError(f"bundle {i}: {k} must be a finite number >= 0, got {v!r}")
            if v:
                clean[k] = float(v)
        if not clean:
            raise ValueError(f"bundle {i} reserves nothing ({b!r}): give it some resource > 0")
        out.append(clean)
    return out


def placement_group(bundles: list[dict[str, float]], strategy: str = "PACK", name: str = "",
                    lifetime: str | None = None) -> PlacementGroup:
    """Reserve ``bundles`` (each a dict of resources, e.g. {"CPU": 2, "GPU": 1}) on the
    cluster's nodes by ``strategy``: PACK (as few nodes as fit), SPREAD (over nodes),
    STRICT_PACK (one node), STRICT_SPREAD (one node per bundle). Returns at once; the
    reservation may wait for resources: ``pg.ready()`` / ``pg.wait(timeout)``.

    ``name``: a name for ``get_placement_group(name)`` ("" : none). ``lifetime``: None
    (the group ends with the process that made it) or "detached" (it outlives it).

    Raises InfeasibleResourcesError naming the bundle when no nodes of a private cluster
    could ever hold it (on a cluster nodes may join, it waits with a warning), ValueError
    for a taken ``name`` or bad input."""
    specs = _check_bundles(bundles)
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: use one of {', '.join(_STRATEGIES)}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {name!r}")
    if lifetime not in (None, "detached"):
        raise ValueError(f"lifetime={lifetime!r}: use None (the group ends with the process that "
                         "made it) or \"detached\"")
    client = _context.current_client()
    detached = lifetime == "detached"
    if detached and not client.info.joinable:
        note_private_detached("placement group")
    gid = _ids.next_task_id()
    _verbs.create_placement_group(client, gid, specs, strategy, name, detached)
    # The head counts it for us (on the client now: a restarted head's, if the request
    # was made again there).
    ready: ObjectRef[None] = ObjectRef(gid + _READY_SUFFIX, _context.current_client(),
                                       counted=True)
    return PlacementGroup(gid, specs, ready)


def remove_placement_group(placement_group: PlacementGroup) -> None:
    """Release the group's bundles: actors in it are killed, tasks running in it are
    killed (TaskCancelledError), tasks waiting to run in it fail the same way.

    ``placement_group``: the group's handle."""
    if not isinstance(placement_group, PlacementGroup):
        raise TypeError(f"remove_placement_group() takes a PlacementGroup, got {placement_group!r}")
    _verbs.remove_placement_group(_context.current_client(), placement_group.id)


def get_placement_group(placement_group_name: str) -> PlacementGroup:
    """The live group named ``placement_group_name``; ValueError when there is none."""
    if not isinstance(placement_group_name, str) or not placement_group_name:
        raise TypeError(f"get_placement_group() takes a group name (str), got {placement_group_name!r}")
    gid, bundles = _verbs.placement_group_named(_context.current_client(), placement_group_name)
    return PlacementGroup(gid, bundles)


def placement_group_table(placement_group: PlacementGroup | None = None) -> dict[str, Any]:
    """The record (a dict) of ``placement_group``, or (None) every group's, by id hex:
    placement_group_id, name,
    strategy, state (PENDING / CREATED / REMOVED), bundles {index: resources},
    bundles_to_node_id {index: node id hex, as orchestra.nodes() lists them}."""
    gid = placement_group.id if placement_group is not None else b""
    rows = {row["placement_group_id"]: row
            for row in _verbs.placement_group_rows(_context.current_client(), gid)}
    if placement_group is not None:
        return rows[gid.hex()]
    return rows


__all__ = ["PlacementGroup", "get_placement_group", "placement_group", "placement_group_table",
           "remove_placement_group"]
