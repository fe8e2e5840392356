"""Utilities beside the core API, named as in Ray: ``orchestra.util.ActorPool``,
``orchestra.util.queue.Queue``, ``orchestra.util.scheduling_strategies``, placement groups
(``orchestra.util.placement_group`` and the names below), and the cluster's state
(``orchestra.util.state``: ``list_tasks``, ``list_actors``, ..., imported when used), user
metrics (``orchestra.util.metrics``: ``Counter``, ``Gauge``, ``Histogram``) and progress
bars drawn on the driver (``orchestra.util.tqdm``).
The libraries' adapters, each imported when used: ``orchestra.util.multiprocessing.Pool``,
``orchestra.util.futures.OrchestraExecutor``, ``orchestra.util.joblib`` (needs joblib) and
``orchestra.util.dask`` (needs dask)."""
from .._api.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group_table,
    remove_placement_group,
)
from .._api.placement_group import placement_group as _placement_group
from .._libs.actor_pool import ActorPool
from . import placement_group as _placement_group_module  # noqa: F401

# The submodule is imported above so that it cannot take this name later: imported after
# the package, it replaced the function here with itself (a Ray script imports both,
# `from ray.util.placement_group import ...` and `from ray.util import placement_group`).
placement_group = _placement_group

__all__ = ["ActorPool", "PlacementGroup", "get_placement_group", "placement_group",
           "placement_group_table", "remove_placement_group"]
