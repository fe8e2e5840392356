"""What a worker makes of a call's arguments and results, beside running it: the error
of an argument that does not unpickle, the exception classes a task retries on, a
generator's values split into returns, and whether the code running is a finalizer
(where a blocking get() must not wait). No I/O.
"""
from __future__ import annotations

import functools
import traceback
import weakref
from types import FrameType
from typing import Any

import cloudpickle

from .._objects.serialization import deserialization_error
from .._protocol import pb
from ..exceptions import DeserializationError


def in_finalizer(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside __del__ or a weakref callback."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename == weakref.__file__:
            return True
        frame = frame.f_back
    return False


@functools.lru_cache(maxsize=64)
def retry_classes(pickled: bytes) -> tuple[type[BaseException], ...]:
    try:
        return tuple(cloudpickle.loads(pickled))
    except Exception:  # noqa: BLE001 - classes this worker cannot import: retry nothing
        return ()


class ArgumentError(Exception):
    """An argument of the task could not be deserialized in this worker."""

    def __init__(self, error: DeserializationError) -> None:
        super().__init__(str(error))
        self.error = error


def argument_error(call: pb.Call, i: int, exc: DeserializationError) -> DeserializationError:
    """The error of a task whose argument ``i`` (in the Call's order) did not unpickle:
    which argument of which task, why, and the traceback of the unpickling."""
    cause = exc.__cause__ or exc
    nk = len(call.kwarg_names)
    first_kw = len(call.args) - nk
    what = f"kwargs[{call.kwarg_names[i - first_kw]!r}]" if i >= first_kw else f"args[{i}]"
    tb = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    err = deserialization_error(cause, f"{what} of task {call.name}()", "its worker")
    return DeserializationError(f"{err}\n\nRemote traceback:\n{tb}")


def load_error(blob: bytes) -> BaseException:
    import pickle
    exc: BaseException = pickle.loads(blob)
    return exc


def split_returns(result: Any, n: int, name: str) -> list[Any]:
    try:
        values = list(result)
    except TypeError:
        raise ValueError(f"{name}() has num_returns={n} but returned a {type(result).__name__}, "
                         f"not a sequence of {n} values") from None
    if len(values) != n:
        raise ValueError(f"{name}() has num_returns={n} but returned {len(values)} values")
    return values
