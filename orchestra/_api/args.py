"""Checks of what the public calls that wait are given: a timeout, and refs of this
session. Shared by _api/session.py (get, wait) and _api/progress.py (as_completed)."""
from __future__ import annotations

import math
from typing import Any

from .._checks import is_number
from .._runtime import context as _context
from .._runtime.object_ref import ObjectRef
from .._runtime.reconnect import replaced
from ..exceptions import ObjectLostError


def check_timeout(timeout: float | None) -> float | None:
    """The timeout to wait with: None (no limit) for None or infinity."""
    if timeout is None:
        return None
    if not is_number(timeout):
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
    if math.isnan(timeout) or timeout < 0:
        # NaN compares false with everything: it passed `< 0` and failed later with
        # "cannot convert float NaN to integer".
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}; "
                         "pass None to wait without a limit")
    return None if math.isinf(timeout) else timeout


def check_session(ref: ObjectRef[Any], client: _context.Client | None) -> None:
    """ObjectLostError for a ref of a session that was shut down."""
    # A ref made before shutdown() names an object the new session never had: its
    # value was never pushed here, and get() waited forever (or until its timeout).
    if ref._client is not client:
        if ref._client in replaced:   # a driver connected to its restarted head
            book = getattr(client, "book", None)
            if book is not None and ref._id not in book.lost:
                return   # carried over (_runtime/reconnect.py carry_over)
            raise ObjectLostError(
                f"{ref!r} was lost with the cluster's head ({getattr(ref._client, 'lost', '')}); "
                "the head was started again, and this driver can neither copy this value nor "
                "make it again (a value in shared memory no longer mapped here, an actor "
                "call's result; a call in flight to an actor without max_task_retries is not "
                "run again): put the value again, or make the call again")
        raise ObjectLostError(
            f"{ref!r} belongs to a session that was shut down; refs do not outlive "
            "orchestra.shutdown(). Put the value again, or re-run its task, in this session.")
