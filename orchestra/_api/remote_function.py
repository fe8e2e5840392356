"""@orchestra.remote on functions: RemoteFunction, its options, and .remote().

The function is pickled once per process and registered with the scheduler once
(RegisterFunction); each call then sends a Call that names it by id. The per-function
fields of the Call are serialized once into a template, and each call appends only its
task id and arguments (protobuf messages concatenate).
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

import cloudpickle

from .. import _ids
from .._checks import is_int
from .._ids import node_from_hex
from .._objects.serialization import dumps_function
from .._resources import check_feasible, make_request, pinned_key, shape_key
from .._runtime import context as _context
from .._runtime import runtime_env as _runtime_env
from .._runtime import verbs as _verbs
from .._runtime.generators import (
    STREAMING,
    ObjectRefGenerator,
    check_backpressure,
    close_stream,
    generator_mode,
    is_generator_function,
    open_stream,
)
from .scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

if TYPE_CHECKING:
    from .._runtime.object_ref import ObjectRef

P = ParamSpec("P")
R = TypeVar("R")
Y = TypeVar("Y")

DEFAULT_MAX_RETRIES = 3

TASK_OPTIONS = frozenset({"num_returns", "num_cpus", "num_gpus", "resources", "max_retries",
                          "retry_exceptions", "name", "scheduling_strategy", "memory", "max_calls",
                          "runtime_env", "placement_group",
                          "placement_group_bundle_index", "placement_group_capture_child_tasks",
                          "_generator_backpressure_num_objects"})
# Ray's older way to name a placement group: folded into scheduling_strategy= (legacy_group).
GROUP_OPTIONS = ("placement_group", "placement_group_bundle_index",
                 "placement_group_capture_child_tasks")


def legacy_group(opts: dict[str, Any]) -> dict[str, Any]:
    """placement_group=pg (with placement_group_bundle_index=, ..._capture_child_tasks=)
    as scheduling_strategy=PlacementGroupSchedulingStrategy(...), as Ray reads them."""
    if not any(k in opts for k in GROUP_OPTIONS):
        return opts
    opts = dict(opts)
    pg = opts.pop("placement_group", None)
    idx = opts.pop("placement_group_bundle_index", -1)
    cap = opts.pop("placement_group_capture_child_tasks", None)
    if pg is None or pg == "default":
        return opts
    if opts.get("scheduling_strategy") is not None:
        raise ValueError("give either scheduling_strategy= or placement_group=, not both")
    opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, idx, cap)
    return opts


def unknown_options(unknown: set[str], allowed: frozenset[str], what: str) -> TypeError:
    """The error for options ``what`` does not take: each with the valid one it is
    likely a typo of (num_cpu: num_cpus), then all the valid ones."""
    import difflib
    named = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.75)
        named.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return TypeError(f"unknown option(s) {', '.join(named)} for {what}; "
                     f"valid options: {', '.join(sorted(allowed))}")


def validate_options(opts: dict[str, Any], allowed: frozenset[str], what: str) -> dict[str, Any]:
    unknown = set(opts) - allowed
    if unknown:
        raise unknown_options(unknown, allowed, what)
    nr = opts.get("num_returns", 1)
    if isinstance(nr, str):
        generator_mode(nr, True, what)   # "dynamic" or "streaming"; checked against the function later
    elif not is_int(nr, 0):
        raise ValueError(f"num_returns must be an int >= 0, \"dynamic\" or \"streaming\"; got {nr!r}")
    check_backpressure(opts.get("_generator_backpressure_num_objects"))
    mr = opts.get("max_retries", DEFAULT_MAX_RETRIES)
    if not is_int(mr, -1):
        raise ValueError(f"max_retries must be an int >= 0, or -1 for no limit; got {mr!r}")
    retry_on(opts.get("retry_exceptions", False))
    make_request(opts.get("num_cpus"), opts.get("num_gpus"), opts.get("resources"),
                 memory=opts.get("memory"))
    placement_of(opts.get("scheduling_strategy"))
    mc = opts.get("max_calls", 0)
    if not is_int(mc, 0):
        raise ValueError(f"max_calls must be an int >= 0 (0: no limit), got {mc!r}")
    _runtime_env.check(opts.get("runtime_env"))
    name = opts.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be a string (the task's name in list_tasks, the "
                         f"dashboard and its errors), got {name!r}")
    return opts


def placement_of(strategy: Any) -> Any:
    """scheduling_strategy= as the Call's Placement; None for the default placement (the
    field stays unset and costs nothing on the wire)."""
    if strategy is None or isinstance(strategy, str) and strategy == "DEFAULT":
        return None
    if isinstance(strategy, str) and strategy == "SPREAD":
        return _verbs.placement(strategy="SPREAD")
    if isinstance(strategy, NodeAffinitySchedulingStrategy):
        return _verbs.placement(strategy="NODE_AFFINITY", node_id=node_from_hex(strategy.node_id),
                                   soft=strategy.soft)
    if isinstance(strategy, PlacementGroupSchedulingStrategy):
        return _verbs.placement(
            strategy="PLACEMENT_GROUP", group_id=strategy.placement_group.id,
            bundle_index=strategy.placement_group_bundle_index,
            capture_child_tasks=bool(strategy.placement_group_capture_child_tasks))
    msg = (f"scheduling_strategy={strategy!r} is not one orchestra knows; accepted: None or "
           "\"DEFAULT\", \"SPREAD\", or orchestra.util.scheduling_strategies."
           "NodeAffinitySchedulingStrategy(node_id, soft=False) or "
           "PlacementGroupSchedulingStrategy(pg, bundle_index)")
    if isinstance(strategy, str):
        raise ValueError(msg)
    raise TypeError(msg)


def retry_on(value: object) -> bytes:
    """retry_exceptions: True / False, or a list of exception classes to re-run on.
    Returns those classes pickled for the worker (b"" for a bool)."""
    if isinstance(value, bool):
        return b""
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(c, type) and issubclass(c, BaseException) for c in value):
        return cloudpickle.dumps(tuple(value), protocol=5)
    raise ValueError(f"retry_exceptions must be True, False or a list of exception classes, "
                     f"got {value!r}")


class RemoteFunction(Generic[P, R]):
    """A function that runs as a task: ``f.remote(*args)`` returns ObjectRef(s).

    Made by ``@orchestra.remote``; ``RemoteFunction[P, R]`` to a type checker, where
    ``P`` is the function's parameters and ``R`` its return type.
    ``fn``: the function. ``options``: the task options (see ``orchestra.remote``).
    ``function_id``: the id it is registered under (``options()`` keeps it)."""

    def __init__(self, fn: Callable[P, R], options: dict[str, Any],
                 function_id: bytes | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"@orchestra.remote needs a function or class, got {fn!r}")
        self._fn = fn
        self._options = validate_options(legacy_group(options), TASK_OPTIONS, f"{_name(fn)}()")
        self._function_id = function_id or os.urandom(16)
        self._name = _name(fn)
        # name=: what the task is called in list_tasks, timelines, logs and errors.
        self._task_name = self._options.get("name") or self._name
        # A generator function streams its items unless num_returns says otherwise; its
        # one return is the stream's end (_runtime/generators.py).
        self._generator = generator_mode(self._options.get("num_returns"), is_generator_function(fn),
                                         f"{self._name}()")
        self._num_returns = 1 if self._generator else int(self._options.get("num_returns", 1))
        self._resources = make_request(self._options.get("num_cpus"), self._options.get("num_gpus"),
                                       self._options.get("resources"), memory=self._options.get("memory"))
        self._client: _context.Client | None = None
        self._template = b""
        self._direct_shape: tuple[tuple[str, float], ...] | None = None
        self._register_frame = b""
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"remote function {self._name}() cannot be called directly: use "
                        f"{self._fn.__name__}.remote(...) to run it as a task, and "
                        "orchestra.get() on the ref it returns")

    def options(self, **options: Any) -> RemoteFunction[P, R]:
        """A copy with some options changed (same function, registered once).

        ``options``: task options, as ``orchestra.remote`` takes them, over this one's."""
        merged = {**self._options, **options}
        return RemoteFunction(self._fn, merged, self._function_id)

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A node of a lazy graph that calls this function when the graph executes
        (``orchestra.dag``); nothing runs now.

        ``args``, ``kwargs``: the function's arguments; they may hold other nodes and
        the graph's ``InputNode``."""
        from .dag import FunctionNode
        return FunctionNode(self, args, kwargs)

    def _bind(self, client: _context.Client) -> None:
        if not (client.info.joinable or client.info.infeasible_waits):
            check_feasible(self._resources, [dict(client.info.node_resources)], f"task {self._name}()")
        opts = self._options
        generator: dict[str, Any] = {}
        if self._generator:
            generator = {"generator": self._generator, "generator_backpressure": check_backpressure(
                opts.get("_generator_backpressure_num_objects"))}
        placement = placement_of(opts.get("scheduling_strategy"))
        env = _runtime_env.merge(client.runtime_env, _runtime_env.check(opts.get("runtime_env")))
        self._template = _verbs.task_template(
            placement, env, function_id=self._function_id, num_returns=self._num_returns,
            resources=self._resources, max_retries=opts.get("max_retries", DEFAULT_MAX_RETRIES),
            name=self._task_name, retry_exceptions=bool(opts.get("retry_exceptions", False)),
            retry_on=retry_on(opts.get("retry_exceptions", False)),
            max_calls=opts.get("max_calls", 0), **generator)
        # Tasks that may go straight to a worker lent to the driver: not those retried on
        # exceptions (the head decides that), nor GPU ones (no GPU worker is lent), nor
        # those placed by a strategy (a lent worker is on whatever node it is).
        # A task bound to a node (hard affinity) may go to a worker lent on that node.
        pinned = placement.node_id + 1 if placement is not None and \
            placement.strategy == "NODE_AFFINITY" and not placement.soft else 0
        # Nor those with max_calls= (the head counts calls to replace the worker).
        self._direct_shape = None if opts.get("retry_exceptions") or self._resources.get("GPU") \
            or (placement is not None and not pinned) or self._generator == STREAMING \
            or opts.get("max_calls") \
            else pinned_key(shape_key(self._resources), pinned)
        self._register_frame = _verbs.function_frame(
            self._function_id, self._name, dumps_function(self._fn), self._num_returns)
        self._client = client

    # A generator function streams: its calls give an ObjectRefGenerator of its items.
    @overload
    def remote(self: RemoteFunction[P, Generator[Y, Any, Any]], *args: P.args,  # type: ignore[overload-overlap]
               **kwargs: P.kwargs) -> ObjectRefGenerator[Y]: ...

    @overload
    def remote(self: RemoteFunction[P, Iterator[Y]], *args: P.args,  # type: ignore[overload-overlap]
               **kwargs: P.kwargs) -> ObjectRefGenerator[Y]: ...

    @overload
    def remote(self, *args: P.args, **kwargs: P.kwargs) -> ObjectRef[R]: ...

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function as a task with these arguments; returns the ObjectRef of its
        result at once (a list of refs for ``num_returns=N``, None for 0, an
        ObjectRefGenerator for a generator function).

        ``args``, ``kwargs``: the function's arguments; an ObjectRef among the top-level
        ones arrives as its value, once it exists."""
        return _context.once_more_on_a_new_head(
            _context.current_client(), lambda client: self._remote(client, args, kwargs))

    def _remote(self, client: _context.Client, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
        if client is not self._client:
            self._bind(client)
        client.submitter.register_function(self._function_id, self._register_frame)
        if self._generator == STREAMING:
            return self._stream(client, args, kwargs)
        refs = client.submitter.submit(self._template, self._num_returns, args, kwargs,
                                       self._direct_shape, self._task_name, self._function_id)
        if self._num_returns == 1:
            return refs[0]
        if self._num_returns == 0:
            return None
        return refs

    def _stream(self, client: _context.Client, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> ObjectRefGenerator[Any]:
        """Submit a streaming generator task (through the head: its items go there)."""
        tid = _ids.next_task_id()
        stream = open_stream(client, tid)
        try:
            end = client.submitter.submit(self._template, 1, args, kwargs, None, self._task_name,
                                          self._function_id, tid)
        except BaseException:
            close_stream(client, tid)
            raise
        return ObjectRefGenerator(client, stream, end[0], check_backpressure(
            self._options.get("_generator_backpressure_num_objects")))

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteFunction, (self._fn, self._options, self._function_id))

    def orchestra_wrapped(self) -> Callable[P, R]:
        """The function this wraps (_serialization finds it by name on the other side)."""
        return self._fn

    def __repr__(self) -> str:
        return f"<RemoteFunction {self._name}>"


def _name(fn: Any) -> str:
    mod = getattr(fn, "__module__", None) or "?"
    return f"{mod}.{getattr(fn, '__qualname__', repr(fn))}"
