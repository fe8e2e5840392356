"""The cluster's state, under Ray's names (``ray.util.state``): tasks, actors, objects,
nodes and workers as lists of dicts, and summaries. The implementation:
orchestra/_api/state.py."""
from .._api.state import (
    cluster_summary,
    list_actors,
    list_nodes,
    list_objects,
    list_tasks,
    list_workers,
    summarize_tasks,
)

__all__ = ["list_tasks", "list_actors", "list_objects", "list_nodes", "list_workers",
           "summarize_tasks", "cluster_summary"]
