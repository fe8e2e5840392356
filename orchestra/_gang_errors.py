"""Errors of gangs (``orchestra.gang``), raised in the driver and inside members.

    inside a member:  join fails -> GangError (the actor's constructor fails: ActorDiedError
                      at the first call, with this as its cause)
                      a peer died -> GangAbortedError from every gang_context() call
                      kv_get / barrier / torch_env ran past its timeout -> GangTimeoutError
    in the driver:    gang.check() / gang.wait_ready() -> GangMemberDiedError naming the
                      member index and its actor
"""
from __future__ import annotations

from typing import Any

from .exceptions import OrchestraError

__all__ = ["GangAbortedError", "GangError", "GangMemberDiedError", "GangTimeoutError"]


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
    coordinator's account of the abort.
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
