"""Placement groups (as ``ray.util.placement_group``): bundles of resources reserved on
nodes, for tasks and actors to run in. The implementation: orchestra/_api/placement_group.py."""
from .._api.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

__all__ = ["PlacementGroup", "get_placement_group", "placement_group", "placement_group_table",
           "remove_placement_group"]
