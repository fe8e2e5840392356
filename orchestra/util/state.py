"""The cluster's state, under Ray's names (``ray.util.state``): tasks, actors, objects,
nodes, workers and jobs as lists of dicts, and summaries. The implementation:
orchestra/_api/state.py."""
from .._api.state import (
    cluster_summary,
    list_actors,
    list_jobs,
    list_nodes,
    list_objects,
    list_tasks,
    list_workers,
    summarize_tasks,
)

__all__ = ["list_tasks", "list_actors", "list_objects", "list_nodes", "list_workers",
           "list_jobs", "summarize_tasks", "cluster_summary"]
