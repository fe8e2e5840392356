"""Errors of gangs (``orchestra.gang``), raised in the driver and inside members.

    inside a member:  join fails -> GangError (the actor's constructor fails: ActorDiedError
                      at the first call, with this as its cause)
                      a peer died -> GangAbortedError from every gang_context() call
                      kv_get / barrier / torch_env ran past its timeout -> GangTimeoutError
    in the driver:    gang.check() / gang.wait_ready() -> GangMemberDiedError naming the
                      member index and its actor

The classes live in orchestra.exceptions with every other public error.
"""
from __future__ import annotations

from ..exceptions import GangAbortedError, GangError, GangMemberDiedError, GangTimeoutError

__all__ = ["GangAbortedError", "GangError", "GangMemberDiedError", "GangTimeoutError"]
