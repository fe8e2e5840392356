"""Coordinator: XLA's ``DistributedRuntimeService`` (proto package ``xla``) for a gang of nodes.

Data flow::

    node k (XLA C++ client or CoordinatorClient)
        |  Connect / EnumerateDevices / Heartbeat / Shutdown / KeyValueGet / KeyValueSet
        v
    _Servicer (gRPC sync server, one pool thread per in-flight RPC)
        |  turns each RPC into one call on the state; maps CoordinatorStateError to a status
        v
    CoordinatorState (no I/O: one lock + condition, decisions and blocking waits only)
        ^
        |  check_heartbeats() every heartbeat_interval_s / 2
    heartbeat checker thread (owned by Coordinator)

Ownership: ``Coordinator`` owns the gRPC server, its thread pool and the checker thread, and
stops all three in ``stop()``. ``CoordinatorState`` owns every piece of session data: who is
connected, the session id, the topologies, the key-value store, last-heard times and the
sticky abort reason. Nothing else mutates them.

Semantics (the contract the tests pin):

* Connect is a barrier over ``num_nodes`` nodes, bounded by the request's
  ``timeout_milliseconds`` (0 or less: do not wait). Protocol version must be
  ``PROTOCOL_VERSION`` and node ids dense in ``[0, num_nodes)`` (INVALID_ARGUMENT otherwise).
  While the barrier is open the latest client of a node id wins: the earlier client's pending
  Connect fails with ABORTED. A Connect that times out or is cancelled un-registers its node, so
  the barrier never completes with a node that gave up. After the barrier, a Connect from the
  same client returns the session id again (a retry whose response was lost); one from a new
  client means a node restarted mid-session, which aborts the whole group.
* Every node gets the same random non-zero 64-bit session id; later RPCs carrying another id
  fail with FAILED_PRECONDITION naming both.
* EnumerateDevices is a second barrier (``enumerate_timeout_s``); all callers get one
  ``GlobalTopologyProto``: nodes sorted by node id, ``global_device_id`` assigned in node-id
  order, then local-ordinal order.
* Heartbeat: once the Connect barrier completes, a node silent for longer than
  ``heartbeat_interval_s * max_missing_heartbeats`` aborts the group. The abort is sticky: every
  later RPC of every node fails with ABORTED naming the missing node, and every blocked call
  wakes up with the same error. Nodes that entered Shutdown are no longer watched.
* Shutdown is a barrier bounded by ``shutdown_timeout_s`` (DEADLINE_EXCEEDED naming the nodes
  that never arrived).
* KeyValueGet blocks until the key exists or ``timeout_milliseconds`` passes; on timeout it
  fails with gRPC status NOT_FOUND (mirroring XLA's C++ service, which returns
  ``NotFound`` rather than ``found=false``). KeyValueSet overwrites.

Authentication: a coordinator started with ``token=`` serves only clients that send it as gRPC
metadata; ``orchestra._coordinator_auth.TokenInterceptor`` refuses every other call with
UNAUTHENTICATED before the servicer (and so the state) sees it. Without a token anyone who
reaches the port can join or read the store, as with XLA's own service (whose client sends no
token). It binds to loopback unless told otherwise (see ``orchestra.coordinator`` for the
standalone server).
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from types import TracebackType
from typing import TypeVar

import grpc

from orchestra._gang.coordinator_auth import TokenInterceptor
from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2
from orchestra._proto import xla_distributed_runtime_pb2_grpc as xla_pb2_grpc

T = TypeVar("T")

__all__ = [
    "PROTOCOL_VERSION",
    "Coordinator",
    "CoordinatorState",
    "CoordinatorStateError",
    "Status",
    "is_loopback_host",
]

_log = logging.getLogger(__name__)

# Version 1 is what XLA's own clients send (DistributedRuntimeProtocolVersion()); bump it when
# the meaning of a message changes so mixed releases fail fast at Connect instead of later.
PROTOCOL_VERSION = 1

DEFAULT_HEARTBEAT_INTERVAL_S = 10.0  # XLA's default
DEFAULT_MAX_MISSING_HEARTBEATS = 10  # XLA's default
# Enumeration and shutdown wait for the slowest node; 5 minutes covers slow GPU driver
# initialisation on big hosts while still ending a run whose peer hung.
DEFAULT_ENUMERATE_TIMEOUT_S = 300.0
DEFAULT_SHUTDOWN_TIMEOUT_S = 300.0

IsActive = Callable[[], bool]


class Status(enum.Enum):
    """Failure kinds of the state; names match ``grpc.StatusCode`` members one to one."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    ABORTED = "ABORTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    NOT_FOUND = "NOT_FOUND"
    CANCELLED = "CANCELLED"


class CoordinatorStateError(Exception):
    """A request the state refuses; ``status`` picks the gRPC code, ``message`` the details."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _fmt_nodes(nodes: Iterable[int]) -> str:
    ids = sorted(nodes)
    word = "node" if len(ids) == 1 else "nodes"
    return f"{word} {', '.join(str(n) for n in ids)}"


class CoordinatorState:
    """Session state and decisions of the coordinator; thread-safe, no sockets, no threads.

    Blocking methods wait on one condition variable and wake on every state change (a node
    arriving, a key set, an abort, a cancelled RPC via ``wake()``). ``is_active`` lets the
    caller end a wait early when its RPC was cancelled. Deadlines use ``time.monotonic``; the
    heartbeat clock is injectable so liveness is unit-tested without sleeping.
    """

    def __init__(
        self,
        num_nodes: int,
        *,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        max_missing_heartbeats: int = DEFAULT_MAX_MISSING_HEARTBEATS,
        session_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be at least 1, got {num_nodes}")
        if heartbeat_interval_s <= 0 or max_missing_heartbeats < 1:
            raise ValueError(
                "heartbeat_interval_s must be > 0 and max_missing_heartbeats >= 1, got "
                f"{heartbeat_interval_s} and {max_missing_heartbeats}"
            )
        if session_id is None:
            session_id = 0
            while session_id == 0:  # 0 is proto3's "unset"; never hand it out
                session_id = secrets.randbits(64)
        if not 0 < session_id < 2**64:
            raise ValueError(f"session_id must be a non-zero uint64, got {session_id}")
        self.num_nodes = num_nodes
        self.session_id = session_id
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_missing_heartbeats = max_missing_heartbeats
        self.heartbeat_timeout_s = heartbeat_interval_s * max_missing_heartbeats
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._clients: dict[int, int] = {}  # node id -> client id of its latest Connect
        self._session_started = False
        self._last_heard: dict[int, float] = {}
        self._local_topologies: dict[int, xla_pb2.LocalTopologyProto] = {}
        self._global_topology: xla_pb2.GlobalTopologyProto | None = None
        self._shutting_down: set[int] = set()
        self._shutdown_done = False
        self._kv: dict[bytes, bytes] = {}
        self._abort_reason: str | None = None
        # Nodes blamed for the abort (went silent, or restarted mid-session): lets the owner
        # of the coordinator name the dead member without parsing the reason text.
        self._failed_nodes: frozenset[int] = frozenset()

    # ----------------------------------------------------------------- introspection

    @property
    def aborted_reason(self) -> str | None:
        with self._cond:
            return self._abort_reason

    @property
    def failed_nodes(self) -> frozenset[int]:
        """Node ids blamed for the abort (missed heartbeats, restarted); empty otherwise."""
        with self._cond:
            return self._failed_nodes

    @property
    def session_started(self) -> bool:
        with self._cond:
            return self._session_started

    def clients(self) -> dict[int, int]:
        """Node id -> client id of every node registered in (or past) the Connect barrier."""
        with self._cond:
            return dict(self._clients)

    def wake(self) -> None:
        """Wake every blocked call so it re-checks its predicate (used when an RPC ends)."""
        with self._cond:
            self._cond.notify_all()

    def abort(self, reason: str) -> None:
        """Put the state in the sticky aborted state; the first reason wins."""
        with self._cond:
            self._abort_locked(reason)

    # ----------------------------------------------------------------- RPCs

    def connect(
        self,
        node_id: int,
        client_id: int,
        protocol_version: int,
        timeout_s: float,
        is_active: IsActive | None = None,
    ) -> int:
        """Barrier over all nodes; returns the session id. See the module docstring."""
        if protocol_version != PROTOCOL_VERSION:
            raise CoordinatorStateError(
                Status.INVALID_ARGUMENT,
                f"node {node_id} speaks coordinator protocol version {protocol_version}, this "
                f"coordinator speaks version {PROTOCOL_VERSION}; use the same orchestra/XLA "
                "release on every node and the coordinator",
            )
        self._check_node_id(node_id, "Connect")
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._cond:
            self._raise_if_aborted()
            if self._session_started:
                previous = self._clients[node_id]
                if previous == client_id:
                    return self.session_id  # a retry whose first response was lost
                # A new process claims a node of a running session: the node restarted and
                # its peers hold state (communicators, ranks) built with the old one.
                self._abort_locked(
                    f"node {node_id} connected again from a new client (client_id={client_id:#x}, "
                    f"was {previous:#x}) after the session started: that node restarted; "
                    "restart the whole group",
                    failed=(node_id,),
                )
                self._raise_if_aborted()
            self._clients[node_id] = client_id
            self._cond.notify_all()  # a replaced client, if any, must see that it lost
            while True:
                owner = self._clients.get(node_id)
                if owner != client_id:
                    by = "" if owner is None else f" (client_id={owner:#x})"
                    raise CoordinatorStateError(
                        Status.ABORTED,
                        f"node {node_id}: this client (client_id={client_id:#x}) was replaced by "
                        f"another client{by} with the same node id while waiting in Connect; "
                        f"two processes were given node id {node_id}, or this task was "
                        "restarted; give every process a unique node id",
                    )
                self._raise_if_aborted()
                if self._session_started:
                    return self.session_id
                if len(self._clients) == self.num_nodes:
                    self._start_session_locked()
                    return self.session_id
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (is_active is not None and not is_active()):
                    missing = set(range(self.num_nodes)) - set(self._clients)
                    # Un-register so the barrier never completes with a node that gave up.
                    del self._clients[node_id]
                    self._cond.notify_all()
                    if remaining > 0:
                        raise CoordinatorStateError(
                            Status.CANCELLED,
                            f"node {node_id}: Connect cancelled by the client",
                        )
                    raise CoordinatorStateError(
                        Status.DEADLINE_EXCEEDED,
                        f"node {node_id}: Connect timed out after {timeout_s:.3g} s waiting for "
                        f"all {self.num_nodes} nodes; missing {_fmt_nodes(missing)}; start "
                        "them with this coordinator's address, or raise the timeout",
                    )
                self._cond.wait(remaining)

    def enumerate_devices(
        self,
        session_id: int,
        local_topology: xla_pb2.LocalTopologyProto,
        timeout_s: float,
        is_active: IsActive | None = None,
    ) -> xla_pb2.GlobalTopologyProto:
        """Second barrier: every node submits its devices, all receive the global topology."""
        node_id = local_topology.node_id
        with self._cond:
            self._check_session_locked(session_id)
            self._check_node_id(node_id, "EnumerateDevices")
            self._heard_from_locked(node_id)
            if self._global_topology is None:
                copy = xla_pb2.LocalTopologyProto()
                copy.CopyFrom(local_topology)
                self._local_topologies[node_id] = copy
                if len(self._local_topologies) == self.num_nodes:
                    self._global_topology = build_global_topology(
                        self._local_topologies.values()
                    )
                    self._cond.notify_all()

            def missing() -> set[int]:
                return set(range(self.num_nodes)) - set(self._local_topologies)

            self._wait_locked(
                lambda: self._global_topology is not None,
                timeout_s,
                is_active,
                lambda: (
                    f"node {node_id}: EnumerateDevices timed out after {timeout_s:.3g} s; "
                    f"{_fmt_nodes(missing())} never called it; they may be hung initialising "
                    "their devices, or raise enumerate_timeout_s"
                ),
            )
            assert self._global_topology is not None
            return self._global_topology

    def heartbeat(self, session_id: int, node_id: int) -> None:
        with self._cond:
            self._check_session_locked(session_id)
            self._check_node_id(node_id, "Heartbeat")
            self._heard_from_locked(node_id)

    def shutdown(
        self,
        session_id: int,
        node_id: int,
        timeout_s: float,
        is_active: IsActive | None = None,
    ) -> None:
        """Barrier: returns once every node called Shutdown."""
        with self._cond:
            self._check_session_locked(session_id)
            self._check_node_id(node_id, "Shutdown")
            self._heard_from_locked(node_id)
            self._shutting_down.add(node_id)
            if len(self._shutting_down) == self.num_nodes:
                self._shutdown_done = True
                self._cond.notify_all()
            self._wait_locked(
                lambda: self._shutdown_done,
                timeout_s,
                is_active,
                lambda: (
                    f"node {node_id}: Shutdown barrier timed out after {timeout_s:.3g} s; "
                    f"{_fmt_nodes(set(range(self.num_nodes)) - self._shutting_down)} never "
                    "called Shutdown: they are still working or hung; raise shutdown_timeout_s "
                    "or find what they wait for"
                ),
            )

    def key_value_get(
        self,
        session_id: int,
        key: bytes,
        timeout_s: float,
        is_active: IsActive | None = None,
    ) -> bytes:
        """The value of ``key``, waiting up to ``timeout_s`` for it; NOT_FOUND after that."""
        with self._cond:
            self._check_session_locked(session_id)
            self._wait_locked(
                lambda: key in self._kv,
                timeout_s,
                is_active,
                lambda: (
                    f"key {key!r} not found after waiting {timeout_s:.3g} s: no node has set "
                    "it; check the key name and that the node producing it is running"
                ),
                timeout_status=Status.NOT_FOUND,
            )
            return self._kv[key]

    def key_value_set(self, session_id: int, key: bytes, value: bytes) -> None:
        with self._cond:
            self._check_session_locked(session_id)
            self._kv[key] = value
            self._cond.notify_all()

    # ----------------------------------------------------------------- liveness

    def check_heartbeats(self, now: float | None = None) -> str | None:
        """Abort if a connected node went silent; returns the abort reason when it aborts now."""
        with self._cond:
            if self._abort_reason is not None or not self._session_started:
                return None
            if self._shutdown_done:
                return None
            now = self._clock() if now is None else now
            silent = {
                node: now - heard
                for node, heard in self._last_heard.items()
                if node not in self._shutting_down
                and now - heard > self.heartbeat_timeout_s
            }
            if not silent:
                return None
            self._abort_locked(
                f"{_fmt_nodes(silent)} missed heartbeats: silent for {max(silent.values()):.3g} s, "
                f"more than {self.heartbeat_timeout_s:.3g} s (heartbeat interval "
                f"{self.heartbeat_interval_s:.3g} s x {self.max_missing_heartbeats}); the process "
                "died, hung or lost its network; the group is aborted, restart every node",
                failed=silent,
            )
            return self._abort_reason

    # ----------------------------------------------------------------- helpers (lock held)

    def _check_node_id(self, node_id: int, rpc: str) -> None:
        if not 0 <= node_id < self.num_nodes:
            raise CoordinatorStateError(
                Status.INVALID_ARGUMENT,
                f"{rpc}: node id {node_id} is outside [0, {self.num_nodes}); node ids must be "
                f"dense from 0, and this coordinator was started for {self.num_nodes} nodes",
            )

    def _raise_if_aborted(self) -> None:
        if self._abort_reason is not None:
            raise CoordinatorStateError(Status.ABORTED, self._abort_reason)

    def _abort_locked(self, reason: str, failed: Iterable[int] = ()) -> None:
        if self._abort_reason is None:
            self._abort_reason = reason
            self._failed_nodes = frozenset(failed)
        self._cond.notify_all()

    def _check_session_locked(self, session_id: int) -> None:
        # Aborted beats a wrong session: a node must learn the group is dead whatever it sends.
        self._raise_if_aborted()
        if not self._session_started:
            raise CoordinatorStateError(
                Status.FAILED_PRECONDITION,
                f"session id {session_id:#x} is not valid: the Connect barrier has not "
                "completed yet, so no session exists; call Connect first",
            )
        if session_id != self.session_id:
            raise CoordinatorStateError(
                Status.FAILED_PRECONDITION,
                f"session id {session_id:#x} does not match this coordinator's session "
                f"{self.session_id:#x}: the client connected to another (restarted?) "
                "coordinator; reconnect with Connect",
            )

    def _start_session_locked(self) -> None:
        self._session_started = True
        # Liveness is timed from the barrier, not from each Connect: a node blocked in the
        # barrier cannot beat, and the barrier may legitimately take longer than the limit.
        now = self._clock()
        self._last_heard = {node: now for node in range(self.num_nodes)}
        self._cond.notify_all()

    def _heard_from_locked(self, node_id: int) -> None:
        if self._session_started:
            self._last_heard[node_id] = self._clock()

    def _wait_locked(
        self,
        ready: Callable[[], bool],
        timeout_s: float,
        is_active: IsActive | None,
        timeout_message: Callable[[], str],
        timeout_status: Status = Status.DEADLINE_EXCEEDED,
    ) -> None:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            self._raise_if_aborted()
            if ready():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CoordinatorStateError(timeout_status, timeout_message())
            if is_active is not None and not is_active():
                raise CoordinatorStateError(
                    Status.CANCELLED, "the client cancelled the call"
                )
            self._cond.wait(remaining)


def build_global_topology(
    local_topologies: Iterable[xla_pb2.LocalTopologyProto],
) -> xla_pb2.GlobalTopologyProto:
    """Nodes sorted by node id; global ids assigned in node-id order then local ordinal."""
    result = xla_pb2.GlobalTopologyProto()
    next_id = 0
    for local in sorted(local_topologies, key=lambda topo: topo.node_id):
        node = result.nodes.add(node_id=local.node_id)
        for device in sorted(local.devices, key=lambda dev: dev.local_device_ordinal):
            out = node.devices.add()
            out.CopyFrom(device)
            out.global_device_id = next_id
            next_id += 1
    return result


# --------------------------------------------------------------------------- gRPC service


def _ms_to_s(ms: int) -> float:
    return max(ms, 0) / 1000.0


class _Servicer(xla_pb2_grpc.DistributedRuntimeServiceServicer):
    """Translates RPCs into state calls and state errors into gRPC statuses; nothing else."""

    def __init__(
        self,
        state: CoordinatorState,
        enumerate_timeout_s: float,
        shutdown_timeout_s: float,
    ) -> None:
        self._state = state
        self._enumerate_timeout_s = enumerate_timeout_s
        self._shutdown_timeout_s = shutdown_timeout_s

    def _run(
        self, context: grpc.ServicerContext, call: Callable[[IsActive], T]
    ) -> T:
        # A cancelled RPC must not pin a pool thread until its timeout: the callback fires when
        # the RPC ends for any reason and wakes the waiters, who then see is_active() False.
        context.add_callback(self._state.wake)
        try:
            return call(context.is_active)
        except CoordinatorStateError as err:
            context.abort(grpc.StatusCode[err.status.name], err.message)
            raise AssertionError("unreachable: context.abort raises") from err

    def Connect(self, request: xla_pb2.ConnectRequest,
                context: grpc.ServicerContext) -> xla_pb2.ConnectResponse:
        def call(active: IsActive) -> xla_pb2.ConnectResponse:
            session = self._state.connect(
                request.node_id,
                request.client_id,
                request.protocol_version,
                _ms_to_s(request.timeout_milliseconds),
                active,
            )
            return xla_pb2.ConnectResponse(session_id=session)

        return self._run(context, call)

    def EnumerateDevices(self, request: xla_pb2.EnumerateDevicesRequest,
                         context: grpc.ServicerContext) -> xla_pb2.EnumerateDevicesResponse:
        def call(active: IsActive) -> xla_pb2.EnumerateDevicesResponse:
            topology = self._state.enumerate_devices(
                request.session_id,
                request.local_topology,
                self._enumerate_timeout_s,
                active,
            )
            return xla_pb2.EnumerateDevicesResponse(global_topology=topology)

        return self._run(context, call)

    def Heartbeat(self, request: xla_pb2.HeartbeatRequest,
                  context: grpc.ServicerContext) -> xla_pb2.HeartbeatResponse:
        def call(active: IsActive) -> xla_pb2.HeartbeatResponse:
            self._state.heartbeat(request.session_id, request.node_id)
            return xla_pb2.HeartbeatResponse()

        return self._run(context, call)

    def Shutdown(self, request: xla_pb2.ShutdownRequest,
                 context: grpc.ServicerContext) -> xla_pb2.ShutdownResponse:
        def call(active: IsActive) -> xla_pb2.ShutdownResponse:
            self._state.shutdown(
                request.session_id, request.node_id, self._shutdown_timeout_s, active
            )
            return xla_pb2.ShutdownResponse()

        return self._run(context, call)

    def KeyValueGet(self, request: xla_pb2.KeyValueGetRequest,
                    context: grpc.ServicerContext) -> xla_pb2.KeyValueGetResponse:
        def call(active: IsActive) -> xla_pb2.KeyValueGetResponse:
            value = self._state.key_value_get(
                request.session_id,
                request.key,
                _ms_to_s(request.timeout_milliseconds),
                active,
            )
            return xla_pb2.KeyValueGetResponse(found=True, value=value)

        return self._run(context, call)

    def KeyValueSet(self, request: xla_pb2.KeyValueSetRequest,
                    context: grpc.ServicerContext) -> xla_pb2.KeyValueSetResponse:
        def call(active: IsActive) -> xla_pb2.KeyValueSetResponse:
            self._state.key_value_set(request.session_id, request.key, request.value)
            return xla_pb2.KeyValueSetResponse()

        return self._run(context, call)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals; other host names count as exposed."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Coordinator:
    """A running ``DistributedRuntimeService``: ``start()`` binds and returns ``host:port``.

    Use as ``with Coordinator(2, token=new_token()) as coord: ... coord.address``; with a
    ``token``, only clients that send it are served (see ``_coordinator_auth``). ``stop()``
    aborts every blocked call (so no pool thread outlives the server), stops the server and
    the checker thread.
    """

    def __init__(
        self,
        num_nodes: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        max_missing_heartbeats: int = DEFAULT_MAX_MISSING_HEARTBEATS,
        enumerate_timeout_s: float = DEFAULT_ENUMERATE_TIMEOUT_S,
        shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
        max_workers: int | None = None,
        token: str | None = None,
        tls: bool = False,
    ) -> None:
        # Validated here, not in start(): a bad token is the caller's mistake, reported
        # before anything binds.
        self._interceptor = TokenInterceptor(token) if token is not None else None
        self._token = token
        if tls and token is None:
            raise ValueError("a coordinator speaks TLS with a key made from its token: "
                             "pass token=... with tls=True")
        # TLS: the key made from the token (_protocol/tls.py), which its clients pin.
        self._tls = tls
        self._state = CoordinatorState(
            num_nodes,
            heartbeat_interval_s=heartbeat_interval_s,
            max_missing_heartbeats=max_missing_heartbeats,
        )
        self._host = host
        self._port = port
        self._enumerate_timeout_s = enumerate_timeout_s
        self._shutdown_timeout_s = shutdown_timeout_s
        # Every node may hold a blocking call (Connect, EnumerateDevices, Shutdown or a
        # KeyValueGet) while its heartbeats keep arriving; a pool that is too small queues
        # heartbeats behind blocked calls and aborts a healthy group.
        self._max_workers = max_workers or 16 + 4 * num_nodes
        self._server: grpc.Server | None = None
        self._address: str | None = None
        self._stop_checker = threading.Event()
        self._checker: threading.Thread | None = None
        self._stopped = False

    @property
    def state(self) -> CoordinatorState:
        return self._state

    @property
    def session_id(self) -> int:
        return self._state.session_id

    @property
    def token(self) -> str | None:
        """The secret clients must send (None: this coordinator accepts anyone)."""
        return self._token

    @property
    def refused_calls(self) -> int:
        """Calls refused for a missing or wrong token since start."""
        return 0 if self._interceptor is None else self._interceptor.refused_calls

    @property
    def address(self) -> str:
        if self._address is None:
            raise RuntimeError("the coordinator is not started; call start() first")
        return self._address

    def start(self) -> str:
        if self._server is not None or self._stopped:
            # The session (and its sticky abort after stop()) lives in the state; a restart
            # would serve a dead session, so a new group needs a new Coordinator.
            raise RuntimeError("the coordinator was already started; create a new one")
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self._max_workers,
                thread_name_prefix="orchestra-coordinator",
            ),
            # gRPC sets SO_REUSEPORT by default, so a second coordinator on a fixed port would
            # bind silently and split the nodes between two sessions; fail loudly instead.
            options=[("grpc.so_reuseport", 0)],
            interceptors=[self._interceptor] if self._interceptor is not None else None,
        )
        xla_pb2_grpc.add_DistributedRuntimeServiceServicer_to_server(
            _Servicer(self._state, self._enumerate_timeout_s, self._shutdown_timeout_s),
            server,
        )
        host = (
            f"[{self._host}]"
            if ":" in self._host and not self._host.startswith("[")
            else self._host
        )
        try:
            if self._tls:
                from orchestra._protocol import tls
                port = server.add_secure_port(f"{host}:{self._port}",
                                              tls.grpc_server_credentials(str(self._token)))
            else:
                port = server.add_insecure_port(f"{host}:{self._port}")
        except RuntimeError as err:
            raise OSError(
                f"the coordinator could not bind {host}:{self._port}: the port is in use or the "
                "host is not an address of this machine; pick another --port or --host"
            ) from err
        if port == 0:
            raise OSError(
                f"the coordinator could not bind {host}:{self._port}: the port is in use or the "
                "host is not an address of this machine; pick another --port or --host"
            )
        server.start()
        self._server = server
        self._address = f"{host}:{port}"
        self._checker = threading.Thread(
            target=self._check_heartbeats_loop,
            name="orchestra-coordinator-heartbeat-checker",
            daemon=True,
        )
        self._checker.start()
        return self._address

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving; blocked calls fail with ABORTED. Idempotent."""
        if self._server is None:
            return
        self._state.abort(
            "the coordinator was stopped; restart the group with a new one"
        )
        self._stop_checker.set()
        self._server.stop(grace_s).wait(grace_s + 5.0)
        if self._checker is not None:
            self._checker.join(timeout=5.0)
        self._server = None
        self._stopped = True

    def _check_heartbeats_loop(self) -> None:
        # Half an interval keeps detection within ~interval of the limit without busy-waiting.
        period = min(self._state.heartbeat_interval_s / 2, 1.0)
        while not self._stop_checker.wait(period):
            reason = self._state.check_heartbeats()
            if reason is not None:
                _log.error("orchestra coordinator aborted the group: %s", reason)

    # typing.Self is 3.11+ and orchestra supports 3.10; the class is not meant to be subclassed.
    def __enter__(self) -> Coordinator:  # noqa: PYI034
        if self._server is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
