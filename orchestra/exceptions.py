"""Public errors of orchestra.

Every error names its cause and what to do about it. ``TaskError`` is raised at ``get``
for an exception in user code; it is also an instance of the original exception class
(``except ValueError`` catches a ``ValueError`` raised remotely), carries the original
message and the remote traceback, and keeps the original exception as ``cause``.
"""
from __future__ import annotations

from typing import Any, cast


class OrchestraError(Exception):
    """Base class of every orchestra error."""


class TaskError(OrchestraError):
    """User code in a task raised; the remote traceback is in the message.

    Instances made by ``TaskError.wrap`` are also instances of the original exception
    class, so callers can catch the type they expect.

    ``function_name``: the task's function; ``traceback_str``: the remote traceback;
    ``cause``: the exception the task raised; ``pid``: the worker's process id.
    """

    def __init__(self, function_name: str = "", traceback_str: str = "",
                 cause: BaseException | None = None, pid: int = 0) -> None:
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.cause = cause
        self.pid = pid
        # Not super(): in a TaskError(CustomError) class made by wrap(), the next
        # __init__ in the MRO is the user's, and one that takes other arguments raised
        # TypeError here, in the worker's error path (the worker died of it).
        Exception.__init__(self, self._message())

    def _message(self) -> str:
        cause = self.cause
        what = f"{type(cause).__name__}: {cause}" if cause is not None else "an exception"
        return (f"task {self.function_name}() raised {what} (worker pid={self.pid})\n\n"
                f"Remote traceback:\n{self.traceback_str}")

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_task_error, (self.function_name, self.traceback_str, self.cause, self.pid))

    @classmethod
    def wrap(cls, function_name: str, traceback_str: str, cause: BaseException,
             pid: int) -> TaskError:
        """A TaskError that is also an instance of ``type(cause)`` (parameters as for
        TaskError: ``function_name``, ``traceback_str``, ``cause``, ``pid``)."""
        return _rebuild_task_error(function_name, traceback_str, cause, pid)


_dual_classes: dict[type, type[TaskError]] = {}


def _rebuild_task_error(function_name: str, traceback_str: str,
                        cause: BaseException | None, pid: int) -> TaskError:
    # A task that let a nested task's TaskError escape: the class to keep is that of the
    # innermost cause, or `except ValueError` missed a ValueError raised two tasks down.
    root = cause
    while isinstance(root, TaskError) and root.cause is not None:
        root = root.cause
    base = type(root) if root is not None else None
    if base is None or isinstance(root, TaskError) or not _can_subclass(base):
        return TaskError(function_name, traceback_str, cause, pid)
    dual = _dual_classes.get(base)
    if dual is None:
        # Multiple inheritance from the user's class: `except ValueError` keeps working.
        # __init__/__str__ come from TaskError, so exception classes whose constructor
        # takes other arguments still build.
        dual = cast("type[TaskError]", type(
            f"TaskError({base.__name__})", (TaskError, base),
            {"__init__": TaskError.__init__, "__str__": TaskError.__str__,
             "__reduce__": TaskError.__reduce__, "__module__": __name__}))
        _dual_classes[base] = dual
    try:
        err = dual.__new__(dual)
    except TypeError:
        # MemoryError (so ObjectStoreFullError too) has a __new__ of its own that refuses
        # this class: "MemoryError.__new__(TaskError(MemoryError)) is not safe". The
        # wrap then failed in the worker and the task's error was lost.
        err = Exception.__new__(dual)
    TaskError.__init__(err, function_name, traceback_str, cause, pid)
    if cause is not None:
        err.args = (str(err),)
    return err


def _can_subclass(base: type) -> bool:
    if not issubclass(base, Exception):
        return False  # KeyboardInterrupt / SystemExit are not wrapped as their own type
    try:
        type("_probe", (TaskError, base), {})
    except TypeError:  # layout conflicts (some C extension exceptions)
        return False
    return True


class ClusterLostError(OrchestraError, ConnectionError):
    """The cluster's head process is gone (it crashed, or was killed).

    Raised at once by every call blocked on the cluster and by every later one. The
    session is over: ``is_initialized()`` is False, and ``init()`` starts a new cluster
    (no ``shutdown()`` needed first). Refs of the lost session cannot be read again.
    """


class AuthenticationError(OrchestraError, PermissionError):
    """A cluster refused this connection (wrong or missing token, another orchestra
    version), or the server reached is not the cluster (it does not know the token)."""


class TLSConfigError(OrchestraError, ValueError):
    """Certificates given with --tls-cert/--tls-key/--tls-ca (or ORCHESTRA_TLS_*) do not
    hold up: a file unreadable, the key not the certificate's, a certificate expired or
    not signed by the CA. Raised before anything starts; the message names the file."""


class GetTimeoutError(OrchestraError, TimeoutError):
    """``get`` or ``wait`` ran past its timeout; the task keeps running."""


class WorkerCrashedError(OrchestraError):
    """The worker process running the task died (exit, signal, OOM killer)."""


class OutOfMemoryError(WorkerCrashedError, MemoryError):
    """The memory monitor of the task's node killed its worker: the node's memory was
    past the threshold (ORCHESTRA_MEMORY_USAGE_THRESHOLD, 0.95 of its cgroup's limit or
    of the machine's). The message names the node's usage, the limit and what the
    task's process held. The task is retried per its ``max_retries``."""


class TaskCancelledError(OrchestraError):
    """The task was cancelled with ``orchestra.cancel`` before it finished. A call of an
    async actor cancelled while it ran raises one that is also a TaskError whose
    ``cause`` is the ``asyncio.CancelledError`` its coroutine got (Ray raises a
    RayTaskError there): ``except TaskError`` and ``except TaskCancelledError`` both
    catch it."""


class CancelledWhileRunningError(TaskCancelledError, TaskError):
    """A call of an async actor cancelled while it ran: a TaskCancelledError and a
    TaskError at once (``function_name``, ``traceback_str`` where the coroutine was,
    ``cause`` the ``asyncio.CancelledError``, ``pid`` as TaskError's)."""

    def __init__(self, function_name: str = "", traceback_str: str = "",
                 cause: BaseException | None = None, pid: int = 0) -> None:
        TaskError.__init__(self, function_name, traceback_str, cause, pid)

    def _message(self) -> str:
        return (f"call {self.function_name}() was cancelled by orchestra.cancel() while it ran "
                f"(its coroutine got asyncio.CancelledError; worker pid={self.pid})\n\n"
                f"Remote traceback:\n{self.traceback_str}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (CancelledWhileRunningError,
                (self.function_name, self.traceback_str, self.cause, self.pid))


class ObjectLostError(OrchestraError):
    """The object's data is gone (its store died, or it was freed) and cannot be rebuilt."""


class ObjectStoreFullError(OrchestraError, MemoryError):
    """The object store cannot hold the object; the message gives the sizes."""


class ObjectStoreError(OrchestraError):
    """A shared-memory segment could not be created, opened or mapped safely.

    The message names the file and the cause: a name taken already, a file that is not
    the session's own (another owner, a mode other than 0600, a symbolic link), or the
    system's error. The store has given back the room it counted for the segment.
    """


class ActorDiedError(OrchestraError):
    """The actor is dead: killed, its process died, or its constructor raised.

    When the constructor raised, that exception is ``__cause__`` and its message and
    remote traceback are in this error's text.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle their args only; keep the cause across processes.
        return (_rebuild_actor_died, (str(self), self.__cause__))


def _rebuild_actor_died(message: str, cause: BaseException | None) -> ActorDiedError:
    err = ActorDiedError(message)
    err.__cause__ = cause
    return err


class DeserializationError(OrchestraError):
    """A value could not be rebuilt (unpickled) in the process that read it.

    Raised at ``get`` for a result this process cannot unpickle, and for a task whose
    worker cannot unpickle one of its arguments (the task does not run). The message
    names the value, the process and the original error, with its traceback; where the
    error happened in this process it is also ``__cause__``.
    """


class InfeasibleResourcesError(OrchestraError, ValueError):
    """The task asks for resources that no node of the cluster has."""


class GangError(OrchestraError):
    """A gang could not form, or a gang call failed; the message names cause and remedy."""


class GangAbortedError(GangError):
    """Raised inside a member: the gang's coordinator aborted the gang (a member died or hung).

    The gang cannot continue (its ranks and communicators include the dead member): shut it
    down and start a new one.
    """


class GangTimeoutError(GangError, TimeoutError):
    """A gang key, barrier or rendezvous value did not arrive within its timeout."""


class GangMemberDiedError(GangError):
    """Raised in the driver: members of the gang died; ``members`` are their indices.

    ``actors`` holds their ``ActorHandle`` s, in the same order, and ``reason`` the
    coordinator's account of the abort; ``message`` is the error's text.
    """

    def __init__(self, message: str, members: tuple[int, ...] = (), actors: tuple[Any, ...] = (),
                 reason: str = "") -> None:
        super().__init__(message)
        self.members = members
        self.actors = actors
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle their args only; keep the fields across processes.
        return (type(self), (str(self), self.members, self.actors, self.reason))


__all__ = [
    "OrchestraError", "TaskError", "ClusterLostError", "AuthenticationError", "GetTimeoutError",
    "TLSConfigError", "WorkerCrashedError", "OutOfMemoryError",
    "TaskCancelledError", "ObjectLostError", "ObjectStoreFullError", "ObjectStoreError",
    "InfeasibleResourcesError", "ActorDiedError", "DeserializationError", "GangError",
    "GangAbortedError", "GangTimeoutError", "GangMemberDiedError",
]
