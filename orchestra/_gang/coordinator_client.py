"""Python client of the coordinator (XLA's ``DistributedRuntimeService``), one per node.

Data flow::

    caller thread --connect()--> Connect barrier (retried with jittered backoff while the
                                 server is UNAVAILABLE, until connect_timeout_s)
                  --enumerate_devices / key_value_get / key_value_set / wait_at_barrier /
                    shutdown--> one unary RPC each, every one with a deadline
    heartbeat thread (daemon, started by connect()) --Heartbeat every heartbeat_interval_s-->

Every RPC, heartbeats included, carries the group's token as gRPC metadata when the client has
one (``token=``); a coordinator started with a token refuses calls without it (UNAUTHENTICATED,
raised as ``CoordinatorAuthError``, never retried).

Ownership: the client owns its gRPC channel and its heartbeat thread; ``close()`` stops both.
The first ABORTED status seen by any RPC (the coordinator declared the group dead, e.g. a node
missed its heartbeats) is recorded; every later call raises ``CoordinatorAbortedError`` with
the server's message, which names the missing node. With ``exit_on_abort=True`` the heartbeat
thread instead prints the error to stderr and calls ``os._exit(1)``, as XLA's C++ client
does, so a gang member never keeps running on a dead group.

grpc and the generated protobuf modules are imported lazily, when a client is made (grpc, for
the token check) and on first connect: importing this module (e.g. for its exception classes)
stays cheap for worker start-up.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import sys
import threading
import time
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc

    from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2

__all__ = [
    "CoordinatorAbortedError",
    "CoordinatorAuthError",
    "CoordinatorClient",
    "CoordinatorError",
    "CoordinatorTimeoutError",
]

_log = logging.getLogger(__name__)

# The server-side barrier deadline is what the request carries; the gRPC deadline gets this
# much more so the server's descriptive status, not a bare client-side timeout, comes back.
_DEADLINE_MARGIN_S = 2.0
_MAX_TIMEOUT_MS = 2**31 - 1  # timeout_milliseconds is an int32
_BACKOFF_INITIAL_S = 0.05
_BACKOFF_MAX_S = 2.0


class CoordinatorError(RuntimeError):
    """A coordinator RPC failed; the message names the cause and the remedy."""


class CoordinatorAbortedError(CoordinatorError):
    """The coordinator aborted the group (a node vanished or restarted); restart every node."""


class CoordinatorAuthError(CoordinatorError):
    """The coordinator refused this client's token (none, or not the group's)."""


class CoordinatorTimeoutError(CoordinatorError):
    """A barrier, key or the coordinator itself did not arrive within the timeout."""


def _to_bytes(value: str | bytes | bytearray | memoryview, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be str or bytes, got {type(value).__name__}")


def _timeout_ms(timeout_s: float) -> int:
    return max(0, min(_MAX_TIMEOUT_MS, int(timeout_s * 1000)))


class CoordinatorClient:
    """One node's connection to the coordinator at ``address`` (``host:port``).

    ``token``: the group's secret, sent on every RPC; None for a coordinator without one.
    """

    def __init__(
        self,
        address: str,
        node_id: int,
        *,
        num_nodes: int | None = None,
        connect_timeout_s: float = 300.0,
        rpc_timeout_s: float = 30.0,
        heartbeat_interval_s: float = 10.0,
        max_missing_heartbeats: int = 10,
        exit_on_abort: bool = False,
        token: str | None = None,
        tls: bool = False,
    ) -> None:
        from orchestra._gang.coordinator_auth import token_metadata, validate_token

        if node_id < 0 or (num_nodes is not None and node_id >= num_nodes):
            raise ValueError(f"node_id {node_id} is outside [0, num_nodes={num_nodes})")
        if heartbeat_interval_s <= 0 or max_missing_heartbeats < 1:
            raise ValueError(
                "heartbeat_interval_s must be > 0 and max_missing_heartbeats >= 1"
            )
        self.address = address
        self.node_id = node_id
        self.num_nodes = num_nodes
        self.connect_timeout_s = connect_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_missing_heartbeats = max_missing_heartbeats
        self.exit_on_abort = exit_on_abort
        # Kept only as the metadata to send: no attribute holds the bare secret for a repr or
        # a log line to show.
        self._metadata = token_metadata(
            None if token is None else validate_token(token)
        )
        if tls and token is None:
            raise ValueError("a coordinator that speaks TLS is pinned by its token: pass "
                             "token=... with tls=True")
        # TLS: the channel trusts only the key made from the token (_protocol/tls.py).
        self._tls_token = token if tls else None
        self.client_id = secrets.randbits(64) or 1  # 0 reads as "unset" in proto3
        self._session_id: int | None = None
        self._channel: Any = None   # a grpc.Channel, once connected
        self._stub: Any = None
        self._lock = threading.Lock()
        self._abort_error: CoordinatorAbortedError | None = None
        self._stop_heartbeats = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._closed = False

    # ----------------------------------------------------------------- lifecycle

    @property
    def session_id(self) -> int:
        if self._session_id is None:
            raise CoordinatorError("not connected: call connect() first")
        return self._session_id

    @property
    def aborted_error(self) -> CoordinatorAbortedError | None:
        """The abort this client saw (an RPC or a heartbeat got ABORTED), else None; sticky."""
        return self._abort_error

    def connect(self) -> int:
        """Join the Connect barrier; returns the session id and starts heartbeating."""
        import grpc

        from orchestra._gang.coordinator import PROTOCOL_VERSION
        from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2
        from orchestra._proto import xla_distributed_runtime_pb2_grpc as xla_pb2_grpc

        if self._closed:
            raise CoordinatorError(
                "this client is closed; create a new CoordinatorClient"
            )
        if self._session_id is not None:
            return self._session_id
        self._raise_if_aborted()
        if self._channel is None:
            # gRPC's own reconnect backoff grows to 2 minutes; while it waits, RPCs fail fast
            # and our retries would be useless. Keep it short so a late server is seen quickly.
            options = [
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", int(_BACKOFF_MAX_S * 1000)),
            ]
            if self._tls_token is not None:
                from orchestra._protocol import tls
                self._channel = tls.grpc_channel(self.address, self._tls_token, options)
            else:
                self._channel = grpc.insecure_channel(self.address, options=options)
            self._stub = xla_pb2_grpc.DistributedRuntimeServiceStub(self._channel)
        deadline = time.monotonic() + self.connect_timeout_s
        backoff = _BACKOFF_INITIAL_S
        last_error = "no attempt made"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CoordinatorTimeoutError(
                    f"node {self.node_id}: could not reach the coordinator at {self.address} "
                    f"within {self.connect_timeout_s:.3g} s (last error: {last_error}); start "
                    "the coordinator first, check the address, or raise connect_timeout_s"
                )
            request = xla_pb2.ConnectRequest(
                protocol_version=PROTOCOL_VERSION,
                timeout_milliseconds=_timeout_ms(remaining),
                node_id=self.node_id,
                client_id=self.client_id,
            )
            try:
                response = self._stub.Connect(
                    request,
                    timeout=remaining + _DEADLINE_MARGIN_S,
                    metadata=self._metadata,
                )
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise self._translate(err, "Connect") from err
                last_error = f"UNAVAILABLE: {err.details()}"
                # Full jitter: N nodes started together do not retry in lockstep.
                time.sleep(min(random.uniform(0, backoff), max(0.0, remaining)))
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                continue
            break
        self._session_id = response.session_id
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop,
            name=f"orchestra-coordinator-heartbeat-node{self.node_id}",
            daemon=True,
        )
        self._heartbeat_thread.start()
        return self._session_id

    def shutdown(self, timeout_s: float = 300.0) -> None:
        """Join the Shutdown barrier, then stop heartbeating; ``timeout_s`` bounds the wait."""
        from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2

        request = xla_pb2.ShutdownRequest(
            session_id=self.session_id, node_id=self.node_id
        )
        self._call("Shutdown", request, timeout_s)
        self._stop_heartbeat_thread()

    def close(self) -> None:
        """Stop heartbeating and close the channel; does not tell the coordinator. Idempotent."""
        self._closed = True
        self._stop_heartbeat_thread()
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> CoordinatorClient:  # noqa: PYI034 (typing.Self is 3.11+)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ----------------------------------------------------------------- RPCs

    def enumerate_devices(
        self, local_devices: Iterable[xla_pb2.DeviceProto], timeout_s: float = 300.0
    ) -> xla_pb2.GlobalTopologyProto:
        """Submit this node's devices; returns the topology of all nodes (same on every node)."""
        from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2

        local = xla_pb2.LocalTopologyProto(
            node_id=self.node_id, devices=list(local_devices)
        )
        request = xla_pb2.EnumerateDevicesRequest(
            session_id=self.session_id, local_topology=local
        )
        response = self._call(
            "EnumerateDevices", request, timeout_s + _DEADLINE_MARGIN_S
        )
        topology: xla_pb2.GlobalTopologyProto = response.global_topology
        return topology

    def key_value_set(self, key: str | bytes, value: str | bytes) -> None:
        """Store ``value`` under ``key``, overwriting any earlier value."""
        from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2

        request = xla_pb2.KeyValueSetRequest(
            session_id=self.session_id,
            key=_to_bytes(key, "key"),
            value=_to_bytes(value, "value"),
        )
        self._call("KeyValueSet", request, self.rpc_timeout_s)

    def key_value_get(self, key: str | bytes, timeout_s: float) -> bytes:
        """The value of ``key``, waiting up to ``timeout_s`` for some node to set it.

        Raises ``CoordinatorTimeoutError`` if the key does not appear in time.
        """
        from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2

        raw_key = _to_bytes(key, "key")
        request = xla_pb2.KeyValueGetRequest(
            session_id=self.session_id,
            key=raw_key,
            timeout_milliseconds=_timeout_ms(timeout_s),
        )
        response = self._call("KeyValueGet", request, timeout_s + _DEADLINE_MARGIN_S)
        if (
            not response.found
        ):  # other servers may answer found=false instead of NOT_FOUND
            raise CoordinatorTimeoutError(
                f"node {self.node_id}: key {raw_key!r} not set within {timeout_s:.3g} s; check "
                "the key name and that the node producing it is running"
            )
        value: bytes = response.value
        return value

    def wait_at_barrier(self, name: str, timeout_s: float) -> None:
        """Block until all ``num_nodes`` nodes called ``wait_at_barrier(name)``.

        Built on the key-value store: each node sets ``barrier/<name>/<node_id>`` and waits for
        every node's key. Keys are never deleted, so each barrier name must be used once.
        """
        if self.num_nodes is None:
            raise CoordinatorError(
                "wait_at_barrier needs the group size: pass num_nodes= to CoordinatorClient"
            )
        self.key_value_set(f"barrier/{name}/{self.node_id}", b"1")
        deadline = time.monotonic() + timeout_s
        for node in range(self.num_nodes):
            try:
                self.key_value_get(
                    f"barrier/{name}/{node}", max(0.0, deadline - time.monotonic())
                )
            except CoordinatorTimeoutError as err:
                missing = [
                    n for n in range(node, self.num_nodes) if not self._has_key(name, n)
                ]
                raise CoordinatorTimeoutError(
                    f"node {self.node_id}: barrier {name!r} timed out after {timeout_s:.3g} s; "
                    f"nodes {missing} never reached it: they are hung, crashed or use another "
                    "barrier name"
                ) from err

    # ----------------------------------------------------------------- internals

    def _has_key(self, name: str, node: int) -> bool:
        try:
            self.key_value_get(f"barrier/{name}/{node}", 0.0)
        except CoordinatorTimeoutError:
            return False
        return True

    def _raise_if_aborted(self) -> None:
        error = self._abort_error
        if error is not None:
            raise CoordinatorAbortedError(str(error)) from error

    def _call(self, method: str, request: Any, timeout_s: float) -> Any:
        import grpc

        self._raise_if_aborted()
        if self._stub is None or self._session_id is None:
            raise CoordinatorError(f"{method}: not connected; call connect() first")
        try:
            return getattr(self._stub, method)(
                request, timeout=timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as err:
            raise self._translate(err, method) from err

    def _translate(self, err: grpc.RpcError, method: str) -> CoordinatorError:
        import grpc

        code, details = err.code(), err.details()
        where = f"node {self.node_id}: {method}"
        if code == grpc.StatusCode.ABORTED:
            return self._record_abort(
                f"{where}: the coordinator aborted the group: {details}"
            )
        if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.NOT_FOUND):
            return CoordinatorTimeoutError(f"{where} timed out: {details}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            sent = "a token" if self._metadata else "no token"
            return CoordinatorAuthError(
                f"{where}: the coordinator at {self.address} refused this client, which sent "
                f"{sent}: {details}"
            )
        if code == grpc.StatusCode.UNAVAILABLE:
            return CoordinatorError(
                f"{where}: the coordinator at {self.address} is unreachable ({details}); it "
                "stopped or the network failed"
            )
        return CoordinatorError(f"{where} failed with {code.name}: {details}")

    def _record_abort(self, message: str) -> CoordinatorAbortedError:
        with self._lock:
            if self._abort_error is None:
                self._abort_error = CoordinatorAbortedError(message)
            return self._abort_error

    def _heartbeat_loop(self) -> None:
        import grpc

        from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2

        request = xla_pb2.HeartbeatRequest(
            session_id=self._session_id, node_id=self.node_id
        )
        misses = 0
        while not self._stop_heartbeats.wait(self.heartbeat_interval_s):
            stub = self._stub
            if stub is None:
                return
            try:
                stub.Heartbeat(
                    request,
                    timeout=min(self.rpc_timeout_s, 10 * self.heartbeat_interval_s),
                    metadata=self._metadata,
                )
                misses = 0
                continue
            except grpc.RpcError as err:
                if self._stop_heartbeats.is_set():
                    return  # close() raced the call; not a failure of the group
                if err.code() == grpc.StatusCode.ABORTED:
                    error = self._translate(err, "Heartbeat")
                else:
                    misses += 1
                    if misses < self.max_missing_heartbeats:
                        continue
                    error = self._record_abort(
                        f"node {self.node_id}: the coordinator at {self.address} did not answer "
                        f"{misses} heartbeats in a row (last: {err.code().name}: {err.details()}); "
                        "it died or the network failed; restart the group"
                    )
            self._on_abort(error)
            return

    def _on_abort(self, error: CoordinatorError) -> None:
        if self.exit_on_abort:
            # Like XLA's client: a gang member on a dead group must not run on (it would hang
            # in its next collective), and a normal exception in a daemon thread is silent.
            print(
                f"orchestra: {error}; exiting (exit_on_abort=True)",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)
        _log.error("%s", error)

    def _stop_heartbeat_thread(self) -> None:
        self._stop_heartbeats.set()
        thread = self._heartbeat_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.rpc_timeout_s + 1.0)
