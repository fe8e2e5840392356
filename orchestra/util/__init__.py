"""Utilities beside the core API, named as in Ray: ``orchestra.util.scheduling_strategies``,
placement groups (``orchestra.util.placement_group`` and the names below)."""
from .placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

__all__ = ["PlacementGroup", "get_placement_group", "placement_group", "placement_group_table",
           "remove_placement_group"]
