"""Crash matrix: each way a call can fail, from a task and from an actor's method, and
the one error it raises (loky's crash tests are the model).

    failure                                   raised at   a task              an actor call
    an argument pickle refuses                .remote()   TypeError           TypeError
    an argument the worker cannot unpickle    get         DeserializationError (the call never runs)
    a result pickle refuses                   get         TaskError + TypeError
    a result the driver cannot unpickle       get         DeserializationError
    raise ValueError / MemoryError            get         TaskError + the original class
    sys.exit(3)                               get         TaskError (SystemExit stays the cause)
    os._exit(3), a segfault                   get         WorkerCrashedError  ActorDiedError

docs/semantics.md ("Crash matrix") documents the same table. Every row also checks what is
left standing: the worker that reported an error lives on, an actor whose process died
stays dead, and the cluster runs the next task. Rows use the shared cluster: a crash
costs a worker, which the pool replaces (the row waits for it, so the next test finds
the cluster whole). Callers: a task, and methods of a plain, a threaded and an async
actor. Workers import this module by name (``test_crash_matrix``), as they import
``_helpers``: what the task and the methods run, and the class whose unpickling raises,
are found there.
"""
from __future__ import annotations

import ctypes
import os
import resource
import sys
import threading
from dataclasses import dataclass
from typing import Any

import pytest

import _helpers as h
import orchestra
from _probes import pid_gone
from orchestra.exceptions import (
    ActorDiedError,
    DeserializationError,
    TaskError,
    WorkerCrashedError,
)

pytestmark = pytest.mark.timeout(60)

T = 30  # seconds: every get has a deadline, so a row that hangs fails instead
SHARED_MEMORY = 200_000   # bytes: more than the 64 KiB sent inline, so through a segment


# ------------------------------------------------------------------ values that fail

def _refuse(payload: bytes) -> Any:
    raise RuntimeError(f"RefusesToUnpickle cannot be rebuilt ({len(payload)} bytes)")


class RefusesToUnpickle:
    """Pickles fine; unpickling it raises, in any process (its __reduce__'s callable)."""

    def __init__(self, nbytes: int = 0) -> None:
        self.payload = b"x" * nbytes

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse, (self.payload,))


def _misbehave(kind: str) -> Any:
    """What a row's task or method does in its worker."""
    if kind == "unpicklable_result":
        return threading.Lock()
    if kind == "unloadable_result":
        return RefusesToUnpickle()
    if kind == "unloadable_result_in_shared_memory":
        return RefusesToUnpickle(SHARED_MEMORY)
    if kind == "raise":
        raise ValueError("raised on purpose")
    if kind == "memory_error":
        return b"x" * (1 << 62)   # more than any address space: MemoryError at once
    if kind == "sys_exit":
        sys.exit(3)
    if kind == "os_exit":
        os._exit(3)
    if kind == "segfault":
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # no core file in the cwd
        ctypes.string_at(0)
    return "ran"


@orchestra.remote(max_retries=0)   # a crash retried only slows the row down
def fail(kind: str, *args: Any, **kwargs: Any) -> Any:
    return _misbehave(kind)


@orchestra.remote
class Failer:
    def fail(self, kind: str, *args: Any, **kwargs: Any) -> Any:
        return _misbehave(kind)

    def pid(self) -> int:
        return os.getpid()


@orchestra.remote
class AsyncFailer:
    async def fail(self, kind: str, *args: Any, **kwargs: Any) -> Any:
        return _misbehave(kind)

    async def pid(self) -> int:
        return os.getpid()


# ------------------------------------------------------------------ the matrix

@dataclass(frozen=True)
class Expect:
    """The error a row raises: exactly ``error``; for a TaskError, one that is also an
    instance of ``also``; its message contains every one of ``texts``."""

    error: type[BaseException]
    texts: tuple[str, ...]
    also: type[BaseException] | None = None
    at_remote: bool = False   # raised by .remote() itself, not by get()
    crash: bool = False       # the process running the call dies


ROWS: dict[str, tuple[tuple[Any, ...], dict[str, Any], Expect, Expect]] = {
    # failure: (args, kwargs, what a task raises, what an actor call raises)
    "unpicklable_argument": (
        (threading.Lock(),), {},
        Expect(TypeError, ("could not serialize", "_thread.lock"), at_remote=True),
        Expect(TypeError, ("could not serialize", "_thread.lock"), at_remote=True)),
    "unloadable_argument": (
        (RefusesToUnpickle(),), {},
        Expect(DeserializationError, ("could not deserialize args[1] of task", "its worker",
                                      "RefusesToUnpickle cannot be rebuilt", "in _refuse",
                                      "Remote traceback", "raise RuntimeError")),
        Expect(DeserializationError, ("could not deserialize args[1] of task", ".fail()",
                                      "RefusesToUnpickle cannot be rebuilt", "in _refuse",
                                      "Remote traceback", "raise RuntimeError"))),
    "unloadable_argument_in_shared_memory": (
        (), {"payload": RefusesToUnpickle(SHARED_MEMORY)},
        Expect(DeserializationError, ("kwargs['payload']", f"({SHARED_MEMORY} bytes)",
                                      "Remote traceback")),
        Expect(DeserializationError, ("kwargs['payload']", f"({SHARED_MEMORY} bytes)",
                                      "Remote traceback"))),
    "unpicklable_result": (
        (), {},
        Expect(TaskError, ("could not serialize", "_thread.lock", "Remote traceback"),
               also=TypeError),
        Expect(TaskError, ("could not serialize", "_thread.lock", "Remote traceback"),
               also=TypeError)),
    "unloadable_result": (
        (), {},
        Expect(DeserializationError, ("could not deserialize object ",
                                      "RefusesToUnpickle cannot be rebuilt", "in _refuse")),
        Expect(DeserializationError, ("could not deserialize object ",
                                      "RefusesToUnpickle cannot be rebuilt", "in _refuse"))),
    "unloadable_result_in_shared_memory": (
        (), {},
        Expect(DeserializationError, (f"({SHARED_MEMORY} bytes)",)),
        Expect(DeserializationError, (f"({SHARED_MEMORY} bytes)",))),
    "raise": (
        (), {},
        Expect(TaskError, ("raised on purpose", 'raise ValueError("raised on purpose")'),
               also=ValueError),
        Expect(TaskError, ("raised on purpose", 'raise ValueError("raised on purpose")'),
               also=ValueError)),
    "memory_error": (
        (), {},
        Expect(TaskError, ("MemoryError", 'return b"x" * (1 << 62)'), also=MemoryError),
        Expect(TaskError, ("MemoryError", 'return b"x" * (1 << 62)'), also=MemoryError)),
    "sys_exit": (
        (), {},
        Expect(TaskError, ("SystemExit: 3", "sys.exit(3)")),
        Expect(TaskError, ("SystemExit: 3", "sys.exit(3)"))),
    "os_exit": (
        (), {},
        Expect(WorkerCrashedError, ("died of exit code 3", "fail()", "max_retries="), crash=True),
        Expect(ActorDiedError, ("died while running", ".fail()", "exit code 3"), crash=True)),
    "segfault": (
        (), {},
        Expect(WorkerCrashedError, ("died of signal SIGSEGV", "native code", "fail()"),
               crash=True),
        Expect(ActorDiedError, ("died while running", ".fail()", "SIGSEGV", "native code"),
               crash=True)),
}

CALLERS = ["task", "actor", "threaded_actor", "async_actor"]


def _start_actor(caller: str) -> Any:
    if caller == "actor":
        return Failer.remote()
    if caller == "threaded_actor":
        return Failer.options(max_concurrency=2).remote()
    return AsyncFailer.remote()


def _check(err: BaseException, expect: Expect) -> None:
    if expect.error is TaskError:
        assert isinstance(err, TaskError), repr(err)
        if expect.also is not None:
            assert isinstance(err, expect.also), type(err).__mro__
        else:
            assert type(err) is TaskError, type(err).__mro__
    else:
        assert type(err) is expect.error, f"{type(err).__name__}: {err}"
    message = str(err)
    missing = [t for t in expect.texts if t not in message]
    assert not missing, f"{missing} not in the message:\n{message}"


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("failure", list(ROWS))
def test_crash_matrix(cluster, failure, caller):
    args, kwargs, task_expect, actor_expect = ROWS[failure]
    kind = "none" if "argument" in failure else failure   # the argument is the failure
    if caller == "task":
        expect, call = task_expect, fail.remote
    else:
        actor = _start_actor(caller)
        actor_pid = orchestra.get(actor.pid.remote(), timeout=T)
        expect, call = actor_expect, actor.fail.remote

    if expect.at_remote:
        with pytest.raises(BaseException) as info:
            call(kind, *args, **kwargs)
    else:
        ref = call(kind, *args, **kwargs)
        with pytest.raises(BaseException) as info:
            orchestra.get(ref, timeout=T)
    err = info.value
    _check(err, expect)

    # What is left standing.
    if isinstance(err, TaskError):
        assert not pid_gone(err.pid), "an error in user code cost its worker"
    if failure.startswith("unloadable_result"):
        assert isinstance(err.__cause__, RuntimeError)   # the original, with its traceback
    if failure == "sys_exit":
        assert isinstance(err.cause, SystemExit) and err.cause.code == 3
    if caller != "task":
        if expect.crash:
            assert f"pid={actor_pid}" in str(err)
            with pytest.raises(ActorDiedError):
                orchestra.get(actor.pid.remote(), timeout=T)
        else:   # the actor lives on, in the same process
            assert orchestra.get(actor.pid.remote(), timeout=T) == actor_pid
    assert orchestra.get(h.identity.remote(failure), timeout=T) == failure
    if expect.crash and caller == "task":
        cluster.wait_idle_workers(2)   # the replacement is up: the next test finds 2 workers


def test_a_dependent_of_a_result_that_cannot_be_unpickled_fails_naming_its_argument(cluster):
    # The result reaches the next task's worker as an argument: a DeserializationError
    # there, not a hang and not an error without the cause.
    ref = fail.remote("unloadable_result")
    with pytest.raises(DeserializationError, match=r"args\[0\] of task .*identity\(\)"):
        orchestra.get(h.identity.remote(ref), timeout=T)


def test_an_actor_whose_constructor_argument_cannot_be_unpickled_is_dead_with_the_cause(cluster):
    a = Failer.remote(RefusesToUnpickle())
    with pytest.raises(ActorDiedError) as info:
        orchestra.get(a.pid.remote(), timeout=T)
    err = info.value
    assert "failed in its constructor: DeserializationError" in str(err)
    assert "args[0] of task" in str(err) and "RefusesToUnpickle cannot be rebuilt" in str(err)
    assert isinstance(err.__cause__, DeserializationError)
