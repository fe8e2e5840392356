"""The cluster's state, under Ray's names (``ray.util.state``): tasks, actors, objects,
nodes, workers and jobs as lists of dicts, and a summary of tasks.

    list_tasks(...) -> Request(state_query) -> head: asks every worker for the task
    events it buffered, then answers (_head/state_query.py) -> rows (JSON) -> dicts

Each call connects to the cluster as the rest of the API does (it starts a local
cluster when none is initialized). Rows are oldest first; ``limit`` keeps the newest.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._observe.task_events import summarize
from .._runtime import verbs as _verbs
from .._runtime.context import current_client

DEFAULT_LIMIT = 100
Filter = tuple[str, str, object]


def _query(what: str, filters: Iterable[Filter] | None, limit: int, detail: bool = False,
           timeout: float = 30.0) -> Any:
    """Ask the head for the rows of ``what`` (or "summary"); ValueError for a bad filter."""
    flist = [list(f) for f in (filters or [])]
    if limit is None or limit < 0:
        raise ValueError(f"limit={limit!r}: give a count of rows (0: all of them)")
    return _verbs.state_query(current_client(), what, flist, limit, detail, timeout)


def list_tasks(filters: Iterable[Filter] | None = None, limit: int = DEFAULT_LIMIT,
               detail: bool = False, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Tasks and actor calls, direct calls included, with their state.

    Args:
        filters: ``[(key, "=" or "!=", value)]``, e.g. ``[("state", "=", "RUNNING")]``;
            any key of a row (task_id, name, state, type, actor_id, node_id, job_id, ...).
        limit: at most this many rows, the newest (0: every task the head keeps).
        detail: add each call's caller (``caller_pid``, ``caller_node_id``).
        timeout: seconds to wait for the head's answer.

    Returns: one dict per task: task_id, attempt_number, name, state
    (PENDING_ARGS_AVAIL, PENDING_NODE_ASSIGNMENT, RUNNING, FINISHED, FAILED), job_id,
    actor_id, type (NORMAL_TASK, ACTOR_TASK, ACTOR_CREATION_TASK), func_or_class_name,
    node_id, worker_id, worker_pid, error_type, creation_time_ms, start_time_ms,
    end_time_ms (None where unknown: a direct call's creation time)."""
    return _query("tasks", filters, limit, detail, timeout)


def list_actors(filters: Iterable[Filter] | None = None, limit: int = DEFAULT_LIMIT,
                detail: bool = False, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Actors, alive and dead: actor_id, class_name, state (DEPENDENCIES_UNREADY,
    PENDING_CREATION, ALIVE, RESTARTING, DEAD), name, ray_namespace, job_id, node_id,
    pid, num_restarts, is_detached.

    Args:
        filters: ``[(key, "=" or "!=", value)]``, e.g. ``[("state", "=", "ALIVE")]``.
        limit: at most this many rows (0: all).
        detail: accepted for Ray's signature; the rows are the same.
        timeout: seconds to wait for the head's answer."""
    return _query("actors", filters, limit, detail, timeout)


def list_objects(filters: Iterable[Filter] | None = None, limit: int = DEFAULT_LIMIT,
                 detail: bool = False, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Objects the cluster holds, largest first: object_id, object_size, location
    (INLINE, SHARED_MEMORY, SPILLED, PENDING, ERROR), node_id, ref_count, pid and type of
    its owner (DRIVER or WORKER), and holders: every process holding refs to it
    (``{"pid", "type", "count"}``).

    Args:
        filters: ``[(key, "=" or "!=", value)]``, e.g. ``[("location", "=", "SPILLED")]``.
        limit: at most this many rows, the smallest dropped first (0: all).
        detail: accepted for Ray's signature; the rows are the same.
        timeout: seconds to wait for the head's answer."""
    return _query("objects", filters, limit, detail, timeout)


def list_nodes(filters: Iterable[Filter] | None = None, limit: int = DEFAULT_LIMIT,
               detail: bool = False, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Nodes, alive and dead: node_id, node_ip, is_head_node, state (ALIVE, DEAD),
    state_message, resources_total, resources_available, store_used, store_capacity,
    spilled_bytes, pid.

    Args:
        filters: ``[(key, "=" or "!=", value)]``, e.g. ``[("state", "=", "ALIVE")]``.
        limit: at most this many rows (0: all).
        detail: accepted for Ray's signature; the rows are the same.
        timeout: seconds to wait for the head's answer."""
    return _query("nodes", filters, limit, detail, timeout)


def list_workers(filters: Iterable[Filter] | None = None, limit: int = DEFAULT_LIMIT,
                 detail: bool = False, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Worker processes, then drivers: worker_id, worker_type (WORKER, DRIVER),
    is_alive, state, node_id, pid, actor_id (an actor's worker), running_task_id.

    Args:
        filters: ``[(key, "=" or "!=", value)]``, e.g. ``[("worker_type", "=", "DRIVER")]``.
        limit: at most this many rows (0: all).
        detail: accepted for Ray's signature; the rows are the same.
        timeout: seconds to wait for the head's answer."""
    return _query("workers", filters, limit, detail, timeout)


def list_jobs(filters: Iterable[Filter] | None = None, limit: int = DEFAULT_LIMIT,
              detail: bool = False, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Jobs, one per program that connected (its driver's session), oldest first: kept
    across restarts of a head that has a state store (``orchestra start --head``), the
    last 1,000 that ended and every running one. Keys: job_id (as list_tasks() names
    it), type (DRIVER), status (RUNNING; SUCCEEDED: its driver called shutdown() or
    exited; FAILED: its driver was killed, or did not connect again to a restarted
    head, ``message`` says which; STOPPED: the cluster stopped under it), entrypoint
    (its command line), message, namespace, driver_pid, driver_node_id, connected
    (its driver is connected now), start_time and end_time (ms since the epoch).

    Args:
        filters: ``[(key, "=" or "!=", value)]``, e.g. ``[("status", "=", "RUNNING")]``.
        limit: at most this many rows, the newest (0: all).
        detail: accepted for Ray's signature; the rows are the same.
        timeout: seconds to wait for the head's answer."""
    return _query("jobs", filters, limit, detail, timeout)


def summarize_tasks(timeout: float = 30.0) -> dict[str, Any]:
    """Tasks counted by function or method name and state, in Ray's shape:
    ``{"cluster": {"summary": {name: {"func_or_class_name", "type", "state_counts"}},
    "total_tasks", "total_actor_tasks", "total_actor_scheduled", "summary_by"}}``.

    Args:
        timeout: seconds to wait for the head's answer."""
    return summarize(_query("tasks", None, 0, False, timeout))


def cluster_summary(timeout: float = 30.0) -> dict[str, Any]:
    """The head's cluster summary: nodes, resources, object store use and spilled bytes,
    tasks and actors by state, workers and drivers (what ``orchestra status`` shows).

    Args:
        timeout: seconds to wait for the head's answer."""
    result: dict[str, Any] = _query("summary", None, 0, False, timeout)
    return result


__all__ = ["list_tasks", "list_actors", "list_objects", "list_nodes", "list_workers",
           "summarize_tasks", "cluster_summary"]
