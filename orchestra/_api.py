"""The @remote decorator: functions become RemoteFunctions, classes ActorClasses."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ._actor import ActorClass
from ._remote_function import RemoteFunction


def remote(*args: Any, **options: Any) -> Any:
    """Make a function a remote function: ``@remote`` or ``@remote(num_cpus=2, ...)``."""
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
