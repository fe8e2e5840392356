"""Scheduling strategies for ``scheduling_strategy=`` (as ``ray.util.scheduling_strategies``):
None or "DEFAULT", "SPREAD", a NodeAffinitySchedulingStrategy or a
PlacementGroupSchedulingStrategy. The implementation: orchestra/_api/scheduling_strategies.py."""
from .._api.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy"]
