"""What a worker makes of a call's arguments and results, beside running it: the error
of an argument that does not unpickle, the exception classes a task retries on, a
generator's values split into returns, and whether the code running is a finalizer
(where a blocking get() must not wait); its arguments decoded. No I/O of its own.
"""
from __future__ import annotations

import functools
import traceback
import weakref
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import cloudpickle

from .._objects.serialization import deserialization_error, deserialize
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


def decode_args(call: pb.Call, resolved: Sequence[pb.ObjectData],
                map_object: Callable[[pb.ObjectData], tuple[memoryview, Any]]) -> list[Any]:
    """A call's arguments as values: inline ones unpickled, the others from their data
    (``resolved``, in order; ``map_object`` maps one in shared memory). ArgumentError
    for one that does not unpickle; a failed dependency's error raised as it is (it may
    be a DeserializationError)."""
    out: list[Any] = []
    try:
        failed = _decode_into(out, call, resolved, map_object)
    except DeserializationError as exc:
        raise ArgumentError(argument_error(call, len(out), exc)) from exc
    if failed is not None:
        raise failed
    return out


def _decode_into(out: list[Any], call: pb.Call, resolved: Sequence[pb.ObjectData],
                 map_object: Callable[[pb.ObjectData], tuple[memoryview, Any]],
                 ) -> BaseException | None:
    """Append the decoded arguments to ``out``; the error of a failed dependency."""
    it = iter(resolved)
    for v in call.args:
        if v.WhichOneof("kind") == "inline":
            out.append(deserialize(v.inline))
        else:
            data = next(it)
            kind = data.WhichOneof("data")
            if kind == "inline":
                out.append(deserialize(data.inline))
            elif kind == "segment":
                out.append(deserialize(map_object(data)[0], f"object {data.object_id.hex()}"))
            else:
                return load_error(data.error)
    return None


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
