"""Names Ray has in ``ray.actor``: ``exit_actor`` (and the actor classes' names), and
``ActorExitRequest``, what it raises.

    method body: exit_actor() -> raises ActorExitRequest (a BaseException, so that
        `except Exception` in user code lets it through) -> the worker (_worker/worker.py,
        WorkerRuntime.failed) tells the head the actor exits on purpose (KillActor with
        no_restart and a reason) -> the head fails queued and later calls with
        ActorDiedError naming exit_actor(), never restarts it, and ends the process.
"""
from __future__ import annotations

from ._api.actor import ActorClass, ActorHandle, ActorMethod, exit_actor
from ._runtime.context import ActorExitRequest

__all__ = ["exit_actor", "ActorExitRequest", "ActorClass", "ActorHandle", "ActorMethod"]
