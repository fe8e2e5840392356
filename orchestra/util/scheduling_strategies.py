"""Scheduling strategies for ``scheduling_strategy=`` (as in Ray).

    @orchestra.remote(scheduling_strategy="SPREAD")
    f.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=True))

Accepted values: None or "DEFAULT" (the node holding most of the arguments' bytes, else
the one with the most free CPU share), "SPREAD" (over the nodes that fit, least loaded
first, in turn), or a NodeAffinitySchedulingStrategy.
"""
from __future__ import annotations

from .._ids import node_from_hex


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


__all__ = ["NodeAffinitySchedulingStrategy"]
