"""Coordinator authentication: a group's secret, sent as gRPC metadata on every RPC.

Data flow::

    whoever starts the coordinator: token = new_token()  (orchestra.gang, or the operator of
        ``orchestra coordinator`` via ORCHESTRA_COORDINATOR_TOKEN / --token)
        -> Coordinator(token=...)            the server keeps it, never logs or prints it
        -> each member (GangSpec in the pickled constructor call; never in a command line)
    member: CoordinatorClient(token=...) sends ``authorization: Bearer <token>`` on every RPC
    server: TokenInterceptor.intercept_service(metadata)  -- refusal() decides --
        ok      -> the servicer (the state sees only members' calls)
        refused -> UNAUTHENTICATED, request bytes never decoded, no state touched

Why metadata and not a field: the wire protocol is XLA's ``package xla`` and stays unchanged,
so XLA's own client still speaks to a coordinator started without a token. XLA's client sends
no metadata, so a coordinator with a token refuses it: such a coordinator must stay on
loopback or a private network instead.

Why a check before the servicer: an outsider's Connect that reached the state could complete a
forming barrier in place of a member, or claim a running member's node id, which aborts the
group and blames that (healthy) member; a KeyValueGet/Set could read or replace an NCCL id.
Refusing in the interceptor means none of that state is ever reached.

What this does not do by itself: encrypt. A gang of a cluster that speaks TLS asks for TLS
(``Coordinator(tls=True)``, ``CoordinatorClient(tls=True)``: a key made from the token,
which the client pins); otherwise the channel is plaintext (``insecure_channel``) and the
token protects against other local users and hosts that cannot see the traffic, not against
someone who can sniff the network between nodes.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
from collections.abc import Callable, Iterable

import grpc

__all__ = [
    "TOKEN_ENV",
    "TOKEN_METADATA_KEY",
    "TokenInterceptor",
    "new_token",
    "refusal",
    "token_metadata",
    "validate_token",
]

_log = logging.getLogger(__name__)

TOKEN_METADATA_KEY = "authorization"
_SCHEME = "Bearer "
# The standalone coordinator reads its token from here (``--token`` wins); an environment
# variable, unlike argv, is not readable by other local users through /proc.
TOKEN_ENV = "ORCHESTRA_COORDINATOR_TOKEN"
_TOKEN_BYTES = 32  # 256 bits: guessing is hopeless even at millions of tries a second

_REMEDY = (
    "this coordinator accepts only the members of its group; pass the group's token "
    "(CoordinatorClient(token=...); for `orchestra coordinator`, the value of its --token or "
    f"${TOKEN_ENV}). XLA's own client sends no token: serve it from a coordinator started "
    "without one, on loopback or a private network"
)


def new_token() -> str:
    """A fresh secret for one group: 64 hex digits from the OS's CSPRNG."""
    return secrets.token_hex(_TOKEN_BYTES)


def validate_token(token: str) -> str:
    """``token`` if it can travel as gRPC metadata; ``ValueError`` naming the fix otherwise."""
    if not isinstance(token, str):
        raise TypeError(f"the coordinator token must be a str, got {type(token).__name__}")
    if not token:
        # An empty token most often comes from an unset variable ($SECRET expanded to ""):
        # running without authentication instead would hide that mistake.
        raise ValueError(
            "the coordinator token is empty; give a secret, e.g. "
            "`python -c 'import secrets; print(secrets.token_hex(32))'`, or none at all"
        )
    # gRPC carries text metadata as printable ASCII and may trim spaces at either end, so a
    # token outside that set would be refused at the server as a wrong one.
    if not all("\x21" <= ch <= "\x7e" for ch in token):
        raise ValueError(
            "the coordinator token must be printable ASCII without spaces (it travels as "
            "gRPC metadata); use e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`"
        )
    return token


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata a client sends with every RPC: empty when there is no token."""
    if token is None:
        return ()
    return ((TOKEN_METADATA_KEY, _SCHEME + token),)


def refusal(expected: str, metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """None when ``metadata`` carries ``expected``; otherwise why the call is refused.

    Compares in constant time (``hmac.compare_digest``), so the time of a refusal tells an
    outsider nothing about how much of a guess was right.
    """
    sent = [
        value
        for key, value in metadata
        if key.lower() == TOKEN_METADATA_KEY
    ]
    if not sent:
        return f"the call carried no token (gRPC metadata '{TOKEN_METADATA_KEY}: Bearer <token>')"
    want = (_SCHEME + expected).encode()
    for value in sent:
        raw = value if isinstance(value, bytes) else value.encode("utf-8", "replace")
        if hmac.compare_digest(raw, want):
            return None
    return "the call carried a wrong token"


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every RPC whose metadata lacks the group's token, before the servicer runs.

    A refused call gets a handler without a request deserializer: the outsider's bytes are
    never decoded. ``refused_calls`` counts refusals; the first is logged as a warning (an
    outsider knocking is worth knowing), later ones at debug level so a scanner cannot flood
    the log.
    """

    def __init__(self, token: str) -> None:
        self._token = validate_token(token)
        self._lock = threading.Lock()
        self._refused = 0

    @property
    def refused_calls(self) -> int:
        with self._lock:
            return self._refused

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        reason = refusal(self._token, handler_call_details.invocation_metadata or ())
        if reason is None:
            return continuation(handler_call_details)
        method = handler_call_details.method
        message = f"{method} refused: {reason}; {_REMEDY}"
        with self._lock:
            self._refused += 1
            first = self._refused == 1

        def refuse(request: bytes, context: grpc.ServicerContext) -> None:
            level = logging.WARNING if first else logging.DEBUG
            _log.log(level, "coordinator refused %s from %s: %s", method, context.peer(), reason)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        return grpc.unary_unary_rpc_method_handler(refuse)
