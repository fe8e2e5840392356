"""The @remote decorator: functions become RemoteFunctions, classes ActorClasses.

Typed by overloads, so a type checker keeps the function's signature for ``.remote``:
``@remote def f(x: int) -> str`` is a ``RemoteFunction[[int], str]`` whose
``f.remote(1)`` is an ``ObjectRef[str]``, and ``get`` of that a ``str``.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from .actor import ActorClass
from .remote_function import RemoteFunction

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class RemoteDecorator(Protocol):
    """What ``@remote(**options)`` returns: the decorator, for a function or a class."""

    @overload
    def __call__(self, obj: type[T], /) -> ActorClass[T]: ...  # type: ignore[overload-overlap]

    @overload
    def __call__(self, obj: Callable[P, R], /) -> RemoteFunction[P, R]: ...


# A class is callable too: it matches the first overload, a function only the second.
@overload
def remote(obj: type[T], /) -> ActorClass[T]: ...  # type: ignore[overload-overlap]


@overload
def remote(obj: Callable[P, R], /) -> RemoteFunction[P, R]: ...


@overload
def remote(**options: Any) -> RemoteDecorator: ...


def remote(*args: Any, **options: Any) -> Any:
    """Make a function a remote function (tasks), or a class an actor class:
    ``@remote`` or ``@remote(num_cpus=2, ...)``.

    ``args``: the function or class itself (the bare ``@remote``); nothing else.
    ``options``: for a function, ``num_returns`` (an int, "dynamic" or "streaming"),
    ``num_cpus``, ``num_gpus``, ``resources``, ``memory``, ``max_retries``,
    ``retry_exceptions``, ``scheduling_strategy``, ``max_calls``, ``runtime_env``,
    ``name``; for a class, ``num_cpus``, ``num_gpus``, ``resources``, ``memory``,
    ``max_restarts``, ``max_task_retries``, ``max_concurrency``, ``name``,
    ``namespace``, ``get_if_exists``, ``lifetime``, ``scheduling_strategy``,
    ``runtime_env``. An unknown option raises TypeError naming the valid ones.

    ``f.remote(*args)`` then runs ``f`` as a task and returns an ObjectRef of its result
    (a type checker sees ``f``'s own parameters and return type);
    ``Cls.remote(*args)`` starts an actor and returns its ActorHandle."""
    if len(args) == 1 and not options and callable(args[0]):
        return _make(args[0], {})
    if args:
        raise TypeError("@orchestra.remote takes keyword options only, e.g. "
                        "@orchestra.remote(num_cpus=2)")

    def decorator(fn: Callable[..., Any]) -> Any:
        return _make(fn, options)
    return decorator


def _make(obj: Any, options: dict[str, Any]) -> Any:
    if inspect.isclass(obj):
        return ActorClass(obj, options)
    return RemoteFunction(obj, options)
