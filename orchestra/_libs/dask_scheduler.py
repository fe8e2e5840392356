"""``orchestra.util.dask``: a Dask scheduler whose tasks are orchestra tasks.

    x.compute(scheduler=orchestra_dask_get)   (or enable_dask_on_orchestra())
      graph -> dask's task spec (convert_legacy_graph): each key a GraphNode naming the
               keys it depends on
      in dependency order: a DataNode -> put once; an Alias -> its target's ref; a Task
               -> _run_node.remote(node, its dependencies' keys, *their refs): the
               inputs travel as refs, from the task that made them to the one that
               reads them, never through the driver
      the keys asked for -> get, in the nested shape Dask asked for

dask is optional: importing this module without it raises ImportError naming it.
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

try:
    import dask
    from dask._task_spec import Alias, DataNode, GraphNode, convert_legacy_graph
    from dask.utils import key_split
except ImportError as exc:   # pragma: no cover - the message is the point
    raise ImportError("orchestra.util.dask needs dask: pip install 'dask[dataframe]'") from exc

_RUN: Any = None


def _run_node(node: GraphNode, keys: list[Hashable], *values: Any) -> Any:
    return node(dict(zip(keys, values, strict=True)))


def _runner() -> Any:
    global _RUN
    if _RUN is None:
        from .._api.remote import remote
        _RUN = remote(_run_node)
    return _RUN


def _order(graph: Mapping[Hashable, GraphNode], wanted: list[Hashable]) -> list[Hashable]:
    """The keys ``wanted`` depend on (themselves included), dependencies first."""
    seen: set[Hashable] = set()
    out: list[Hashable] = []
    for root in wanted:
        stack: list[tuple[Hashable, bool]] = [(root, False)]
        while stack:
            key, expanded = stack.pop()
            if expanded:
                out.append(key)
                continue
            if key in seen:
                continue
            seen.add(key)
            stack.append((key, True))
            stack.extend((d, False) for d in graph[key].dependencies if d not in seen)
    return out


def _flat(keys: Any) -> list[Hashable]:
    if isinstance(keys, list):
        return [k for sub in keys for k in _flat(sub)]
    return [keys]


def _pack(keys: Any, values: dict[Hashable, Any]) -> Any:
    if isinstance(keys, list):
        return [_pack(k, values) for k in keys]
    return values[keys]


def orchestra_dask_get(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """Run the Dask graph ``dsk`` (a mapping, or an expression that has one) on the
    cluster and return the values of ``keys`` (a key, or nested lists of keys);
    ``kwargs`` (Dask's scheduler options) are accepted
    and ignored. Use as ``x.compute(scheduler=orchestra_dask_get)``."""
    from .._api.session import get, put
    if not isinstance(dsk, Mapping):   # an expression (Dask 2025 on): its graph
        dsk = dsk.__dask_graph__()
    graph = convert_legacy_graph(dsk)
    wanted = _flat(keys)
    run = _runner()
    refs: dict[Hashable, Any] = {}
    for key in _order(graph, wanted):
        node = graph[key]
        if isinstance(node, DataNode):
            refs[key] = put(node.value)
        elif isinstance(node, Alias):
            refs[key] = refs[node.target]
        else:
            deps = list(node.dependencies)
            refs[key] = run.options(name=key_split(key)).remote(node, deps, *(refs[d] for d in deps))
    values = dict(zip(wanted, get([refs[k] for k in wanted]), strict=True))
    return _pack(keys, values)


def enable_dask_on_orchestra(shuffle: str | None = "tasks") -> Any:
    """Make orchestra_dask_get Dask's default scheduler (and ``shuffle`` the method of
    DataFrame shuffles: "tasks", as Ray's); the returned config also works as a context
    manager."""
    return dask.config.set({"scheduler": orchestra_dask_get,
                            "dataframe.shuffle.method": shuffle})


def disable_dask_on_orchestra() -> Any:
    """Give Dask back its own default scheduler."""
    return dask.config.set({"scheduler": None, "dataframe.shuffle.method": None})
