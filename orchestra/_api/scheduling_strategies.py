"""Scheduling strategies for ``scheduling_strategy=`` (as in Ray).

    @orchestra.remote(scheduling_strategy="SPREAD")
    f.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=True))

Accepted values: None or "DEFAULT" (the node holding most of the arguments' bytes, else
the one with the most free CPU share), "SPREAD" (over the nodes that fit, least loaded
first, in turn), a NodeAffinitySchedulingStrategy, or a PlacementGroupSchedulingStrategy.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from .._checks import is_int
from .._ids import node_from_hex

if TYPE_CHECKING:
    from .placement_group import PlacementGroup


class NodeAffinitySchedulingStrategy:
    """Run on the node ``node_id`` (16 hex digits, as ``orchestra.nodes()`` lists them).

    soft=False: only there; when that node is not in the cluster, or can never hold the
    request, the task fails with InfeasibleResourcesError naming the node.
    soft=True: there when it can take the task, anywhere else otherwise.
    """

    __slots__ = ("node_id", "soft")

    def __init__(self, node_id: str, soft: bool = False) -> None:
        node_from_hex(node_id)   # ValueError naming a malformed id, at once
        if not isinstance(soft, bool):
            raise TypeError(f"soft must be True or False, got {soft!r}")
        self.node_id = node_id.lower()
        self.soft = soft

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeAffinitySchedulingStrategy) \
            and (self.node_id, self.soft) == (other.node_id, other.soft)

    def __hash__(self) -> int:
        return hash((self.node_id, self.soft))

    def __repr__(self) -> str:
        return f"NodeAffinitySchedulingStrategy(node_id={self.node_id!r}, soft={self.soft})"


class PlacementGroupSchedulingStrategy:
    """Run in a bundle of ``placement_group`` (orchestra.util.placement_group), holding
    that bundle's reserved resources: bundle ``placement_group_bundle_index``, or any of
    its bundles with -1. With ``placement_group_capture_child_tasks=True`` the tasks and
    actors it starts without a strategy of their own run in the same group.

    The task waits while the group is not yet reserved; it fails with
    InfeasibleResourcesError when it asks for more than its bundle holds, and with
    TaskCancelledError when the group is removed."""

    __slots__ = ("placement_group", "placement_group_bundle_index",
                 "placement_group_capture_child_tasks")

    def __init__(self, placement_group: PlacementGroup, placement_group_bundle_index: int = -1,
                 placement_group_capture_child_tasks: bool | None = None) -> None:
        from .placement_group import PlacementGroup
        if not isinstance(placement_group, PlacementGroup):
            raise TypeError("PlacementGroupSchedulingStrategy takes the PlacementGroup that "
                            f"placement_group() returned, got {placement_group!r}")
        idx = placement_group_bundle_index
        if not is_int(idx) \
                or not -1 <= idx < placement_group.bundle_count:
            raise ValueError(f"placement_group_bundle_index={idx!r}: the group has "
                             f"{placement_group.bundle_count} bundles; use 0.."
                             f"{placement_group.bundle_count - 1}, or -1 for any")
        cap = placement_group_capture_child_tasks
        if cap is not None and not isinstance(cap, bool):
            raise TypeError(f"placement_group_capture_child_tasks must be True, False or None, got {cap!r}")
        self.placement_group = placement_group
        self.placement_group_bundle_index = idx
        self.placement_group_capture_child_tasks = cap

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementGroupSchedulingStrategy) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[Hashable, ...]:
        return (self.placement_group.id, self.placement_group_bundle_index,
                bool(self.placement_group_capture_child_tasks))

    def __repr__(self) -> str:
        return (f"PlacementGroupSchedulingStrategy({self.placement_group!r}, "
                f"placement_group_bundle_index={self.placement_group_bundle_index}, "
                f"placement_group_capture_child_tasks={self.placement_group_capture_child_tasks})")


__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy"]
