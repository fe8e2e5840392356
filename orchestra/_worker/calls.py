"""What a worker makes of a call's arguments and results, beside running it: the error
of an argument that does not unpickle, the exception classes a task retries on, a
generator's values split into returns, and whether the code running is a finalizer
(where a blocking get() must not wait); its arguments decoded. No I/O of its own.
"""
from __future__ import annotations

import functools
import os
import traceback
import weakref
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import cloudpickle

from .. import _ids
from .._checks import a_type
from .._objects.serialization import deserialization_error, deserialize, dumps_exception
from .._protocol import pb
from ..exceptions import ActorDiedError, DeserializationError, TaskError


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


def yielded_returns(gen: Any, n: int, name: str) -> tuple[list[Any], Exception | None]:
    """The values a generator with num_returns=n yields, and the exception it raised
    before its n-th (None when it did not): the refs of the values before it hold them,
    the rest the error, as Ray's. One raised after the n-th value is printed to stderr
    (its driver shows it) and the n values stand, as Ray does. ValueError when it yields
    another number of values."""
    values: list[Any] = []
    while True:
        try:
            value = next(gen)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 - the generator's own error, for its refs
            if len(values) < n:
                return values, exc
            import sys
            import traceback
            print(f"orchestra: {name}() raised after yielding its {n} values (num_returns="
                  f"{n}): the values stand, the error is only reported here\n"
                  + "".join(traceback.format_exception(exc)).rstrip(), file=sys.stderr,
                  flush=True)
            break
        values.append(value)
        if len(values) > n:
            raise ValueError(f"{name}() has num_returns={n} but yielded more than {n} values")
    if len(values) != n:
        raise ValueError(f"{name}() has num_returns={n} but yielded {len(values)} values")
    return values, None


def split_returns(result: Any, n: int, name: str) -> list[Any]:
    try:
        values = list(result)
    except TypeError:
        raise ValueError(f"{name}() has num_returns={n} but returned {a_type(result)}, "
                         f"not a sequence of {n} values") from None
    if len(values) != n:
        raise ValueError(f"{name}() has num_returns={n} but returned {len(values)} values")
    return values


def error_returns(call: pb.Call, error: bytes) -> list[pb.ObjectData]:
    """Each of the call's returns holding ``error`` (a pickled exception)."""
    return [pb.ObjectData(object_id=oid, error=error)
            for oid in _ids.return_ids(call.task_id, call.num_returns)]


def format_error(exc: BaseException) -> str:
    """The traceback of an exception user code raised, as Python prints it."""
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:  # noqa: BLE001 - a __str__ that raises: the type alone
        return f"{type(exc).__name__} (its message could not be formatted)\n"


def task_error(call: pb.Call, exc: BaseException) -> BaseException:
    """The TaskError ``exc``, raised by the call's code, reaches its caller as (also an
    instance of ``exc``'s class), with its traceback."""
    tb = "".join(traceback.format_exception(exc))
    try:
        return TaskError.wrap(call.name, tb, exc, os.getpid())
    except Exception:  # noqa: BLE001 - a class wrap() cannot build: keep the text
        return TaskError(call.name, tb, None, os.getpid())


def error_done(inv: pb.InvokeCallRequest, exc: BaseException) -> pb.TaskDone:
    """TaskDone carrying the error ``exc`` of a call's code (raised in the except block
    that caught it: its traceback is format_exc()'s); a constructor's as ActorDiedError."""
    call = inv.call
    tid = call.task_id
    oids = _ids.return_ids(tid, call.num_returns)
    # Called inside the except block that caught exc: format_exc() is its traceback.
    tb = traceback.format_exc()
    if isinstance(exc, TaskError):
        # A nested task's error that escaped this task: format_exc() ends with that
        # error's whole message (its remote traceback too), which the message made
        # below carries already. Twice per level, an error 16 tasks down a recursion
        # became 69 MB (and 30 down, a cluster that seemed hung).
        tb = ("Traceback (most recent call last):\n"
              + "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__)))
              + f"{type(exc).__name__}: the error of {exc.function_name}(), above\n")
    err: BaseException
    if isinstance(exc, ArgumentError):
        # The task never ran: its error is the DeserializationError itself (the
        # traceback of the unpickling is in its text), not a TaskError "raised" by
        # code that did not run.
        exc = err = exc.error
        detail = f"{type(exc).__name__}: {exc}"
    else:
        detail = f"{type(exc).__name__}: {exc}\n\nRemote traceback:\n{tb}"
        try:
            err = TaskError.wrap(call.name, tb, exc, os.getpid())
        except Exception:  # noqa: BLE001 - a class wrap() cannot build must not kill
            # the worker (it was then reported as a crash): keep the text and traceback.
            err = TaskError(call.name, tb, None, os.getpid())
    if call.HasField("actor"):
        died = ActorDiedError(f"actor {call.actor.class_name} failed in its constructor: {detail}")
        died.__cause__ = exc
        oids = [call.actor.actor_id]
        blob = dumps_exception(died)
    else:
        blob = dumps_exception(err)
    not_retryable = False
    if call.retry_exceptions:
        not_retryable = isinstance(exc, DeserializationError) or (
            bool(call.retry_on) and not isinstance(exc, retry_classes(call.retry_on)))
    return pb.TaskDone(task_id=tid, user_error=True, not_retryable=not_retryable,
                       returns=[pb.ObjectData(object_id=o, error=blob) for o in oids])
