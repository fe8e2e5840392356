"""Names Ray has in ``ray.actor``: ``exit_actor`` (and the actor classes' names).

    method body: exit_actor() -> raises ActorExitRequest (a BaseException, so that
        `except Exception` in user code lets it through) -> the worker (_worker.py,
        WorkerRuntime.failed) tells the head the actor exits on purpose (KillActor with
        no_restart and a reason) -> the head fails queued and later calls with
        ActorDiedError naming exit_actor(), never restarts it, and ends the process.
"""
from __future__ import annotations

from . import _context
from ._actor import ActorClass, ActorHandle, ActorMethod


class ActorExitRequest(BaseException):
    """Raised by exit_actor() inside an actor method; the worker ends the actor."""


def exit_actor() -> None:
    """End the current actor from one of its methods (sync or async), as Ray's does.

    The method's caller and every later call get ActorDiedError saying the actor
    exited on purpose; the actor is not restarted, whatever its max_restarts. Outside
    an actor: TypeError."""
    if not _context.in_actor():
        raise TypeError("exit_actor() is called outside an actor: call it inside an actor "
                        "method to end that actor; to stop an actor from outside, use "
                        "orchestra.kill(handle)")
    raise ActorExitRequest()


__all__ = ["exit_actor", "ActorClass", "ActorHandle", "ActorMethod"]
