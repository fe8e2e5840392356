"""``orchestra.util.dask`` (as ``ray.util.dask``): ``orchestra_dask_get``, a Dask scheduler
running each Dask task as an orchestra task, and ``enable_dask_on_orchestra()`` /
``disable_dask_on_orchestra()``. Needs dask. The implementation:
orchestra/_libs/dask_scheduler.py."""
from .._libs.dask_scheduler import (
    disable_dask_on_orchestra,
    enable_dask_on_orchestra,
    orchestra_dask_get,
)

__all__ = ["orchestra_dask_get", "enable_dask_on_orchestra", "disable_dask_on_orchestra"]
