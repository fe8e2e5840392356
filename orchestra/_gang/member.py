"""Inside a gang member: join the gang, then answer ``orchestra.gang_context()``.

Data flow, in each member's actor process, in its constructor before the user's ``__init__``
(all members run this at once, each in its own process)::

    join(spec)
      CoordinatorClient(spec.address, node_id=spec.member,             barrier 1: all members up;
                        token=spec.token).connect()                     heartbeat thread starts;
                                                                        every RPC sends the token
      KeyValueSet gang/host/<member> = host identity                    for node and local ranks
      member 0 only: KeyValueSet gang/torch_master, gang/jax_coordinator  (free ports of its host)
      EnumerateDevices(this member's GPU ids as DeviceProto)           barrier 2: the topology,
                                                                        global ids in member order
      KeyValueGet gang/host/<m> for every member (all set before barrier 2, so no wait)
      layout(member, hosts) -> node_rank, local_rank, ... (pure)  -> GangContext

Ownership: the ``GangContext`` owns the ``CoordinatorClient`` (its gRPC channel and heartbeat
thread) and lives in this module's global for the life of the process, which serves this one
actor only. If the user's constructor raises, ``leave()`` closes the client: the member goes
silent and the coordinator aborts the gang, so its peers fail instead of waiting for it.

Keys: ``gang/...`` are orchestra's; ``kv_set``/``kv_get`` use ``user/<key>`` and barriers
``barrier/user/<name>/<n>/...``, so users cannot collide with the rendezvous data.
"""
from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._checks import is_number
from .._runtime import context as _context
from .coordinator_client import (  # cheap: the client imports grpc when it connects
    CoordinatorAbortedError,
    CoordinatorClient,
    CoordinatorError,
    CoordinatorTimeoutError,
)
from .errors import GangAbortedError, GangError, GangTimeoutError

if TYPE_CHECKING:
    from .._proto import xla_distributed_runtime_pb2 as xla_pb2

__all__ = ["GangContext", "GangDevice", "GangSpec", "Layout", "gang_context", "join", "layout",
           "leave", "member_info"]

_TORCH_MASTER_KEY = "gang/torch_master"
_JAX_COORDINATOR_KEY = "gang/jax_coordinator"


@dataclass(frozen=True)
class GangSpec:
    """What one member needs to join: made by ``orchestra.gang`` in the driver, pickled into
    the member's constructor arguments."""

    address: str            # the coordinator's host:port
    size: int
    member: int             # this member's index = its coordinator node id = its rank
    class_name: str
    timeout_s: float
    heartbeat_interval_s: float
    max_missing_heartbeats: int
    exit_on_abort: bool
    # The gang's secret, sent on every coordinator RPC: only members can join, read, write or
    # abort. It travels in the pickled constructor call (never argv, which /proc shows to every
    # local user) and stays out of repr, so no error message or log line carries it.
    token: str = field(repr=False)
    # The coordinator speaks TLS with a key made from the token (a cluster that speaks
    # TLS, its coordinator reached by other machines).
    tls: bool = False


@dataclass(frozen=True)
class GangDevice:
    """One device of the gang's topology: ``global_device_id`` counts devices in member
    order, then by ``local_device_ordinal`` (the index in the member's CUDA_VISIBLE_DEVICES);
    ``name`` is ``"GPU <orchestra GPU id>"``."""

    global_device_id: int
    member: int
    local_device_ordinal: int
    name: str


@dataclass(frozen=True)
class Layout:
    """Where one member sits: hosts are numbered in the order their first member appears."""

    node_rank: int
    num_nodes: int
    local_rank: int
    local_world_size: int


def layout(member: int, hosts: Sequence[str]) -> Layout:
    """The node rank, local rank and local world size of ``member``, given each member's host."""
    if not 0 <= member < len(hosts):
        raise ValueError(f"member {member} is outside [0, {len(hosts)})")
    order: dict[str, int] = {}
    for host in hosts:
        order.setdefault(host, len(order))
    mine = hosts[member]
    return Layout(node_rank=order[mine], num_nodes=len(order),
                  local_rank=sum(1 for h in hosts[:member] if h == mine),
                  local_world_size=sum(1 for h in hosts if h == mine))


def topology_from_proto(topology: xla_pb2.GlobalTopologyProto) -> tuple[GangDevice, ...]:
    """The ``GlobalTopologyProto`` as plain values, in ``global_device_id`` order."""
    devices = [GangDevice(global_device_id=d.global_device_id, member=node.node_id,
                          local_device_ordinal=d.local_device_ordinal, name=d.name)
               for node in topology.nodes for d in node.devices]
    return tuple(sorted(devices, key=lambda d: d.global_device_id))


def host_identity() -> str:
    """Names this machine for grouping members by host: hostname plus the kernel's boot id
    (two machines cloned from one image may share a hostname, never a boot id), plus the
    cluster node the member runs on (nodes in namespaces of one kernel are hosts too)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    client = _context.client_or_none()
    node = f"/node-{client.info.node_id}" if client is not None else ""
    return f"{socket.gethostname()}/{boot}{node}"


def _split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def local_address_towards(host: str) -> str:
    """This machine's address on the route to ``host``: loopback for a local coordinator, the
    address peers on other hosts can reach otherwise."""
    try:
        info = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(info[0], socket.SOCK_DGRAM) as s:
            s.connect(info[4])   # a UDP connect sends nothing: it only picks the route
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface that holds ``address`` (IPv4 or
    IPv6), None when none does (or the system will not say)."""
    if ":" in address:   # IPv6: /proc/net/if_inet6 lists each address with its interface
        try:
            want = socket.inet_pton(socket.AF_INET6, address.split("%")[0]).hex()
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) >= 6 and fields[0] == want:
                        return fields[5]
        except (OSError, ValueError):
            return None
        return None
    import fcntl
    import struct
    siocgifaddr = 0x8915
    try:
        names = [name for _, name in socket.if_nameindex()]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for name in names:
                try:
                    raw = fcntl.ioctl(s.fileno(), siocgifaddr,
                                      struct.pack("256s", name.encode()[:15]))
                except OSError:
                    continue   # no IPv4 address on it
                if socket.inet_ntoa(raw[20:24]) == address:
                    return name
    except OSError:
        return None
    return None


def free_ports(address: str, count: int) -> list[int]:
    """``count`` distinct TCP ports free on ``address`` right now.

    The sockets close before the ports are used (by torch's TCPStore, JAX's coordination
    service), so another process could take one in between; the kernel hands out ephemeral
    ports in sequence, which makes that rare, and the user's init then fails loudly.
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):   # all open at once, so the ports differ
            s = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            s.bind((address, 0))
            ports.append(int(s.getsockname()[1]))
        return ports


class GangContext:
    """This member's place in its gang, and the gang's shared key-value store.

    ``rank`` is the member index (0..world_size-1, the order of ``gang.actors``); node and
    local ranks group members by host. Blocking calls take ``timeout_s`` (default: the
    gang's ``timeout_s``) and raise ``GangTimeoutError`` past it, ``GangAbortedError`` once
    the gang is aborted.

    Made by orchestra when a member joins (``orchestra.gang_context()`` returns it):
    ``spec`` is the member's part of the gang, ``client`` its coordinator connection,
    ``where`` its node and local ranks, ``topology`` every member's devices, ``gpu_ids``
    this member's GPUs, ``host`` its host's address.
    """

    def __init__(self, spec: GangSpec, client: CoordinatorClient, where: Layout,
                 topology: tuple[GangDevice, ...], gpu_ids: Sequence[int], host: str) -> None:
        self._spec = spec
        self._client = client
        self._lock = threading.Lock()
        self._barriers: dict[str, int] = {}
        self._torch_master: str | None = None
        self._jax_coordinator: str | None = None
        self.rank = spec.member
        self.world_size = spec.size
        self.node_rank = where.node_rank
        self.num_nodes = where.num_nodes
        self.local_rank = where.local_rank
        self.local_world_size = where.local_world_size
        self.gpu_ids = tuple(gpu_ids)
        self.topology = topology
        self.host = host
        self.coordinator_address = spec.address

    def __repr__(self) -> str:
        return (f"GangContext(rank={self.rank}, world_size={self.world_size}, "
                f"local_rank={self.local_rank}, node_rank={self.node_rank}, "
                f"gpu_ids={list(self.gpu_ids)})")

    @property
    def local_devices(self) -> tuple[GangDevice, ...]:
        """This member's devices in the topology (its GPUs, in local ordinal order)."""
        return tuple(d for d in self.topology if d.member == self.rank)

    # ------------------------------------------------------------ rendezvous for frameworks

    def torch_env(self, timeout_s: float | None = None) -> dict[str, str]:
        """The environment of ``torch.distributed.init_process_group(init_method="env://")``.

        MASTER_ADDR/MASTER_PORT: a port that member 0 found free on its host when the gang
        formed. GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME: the interface of this host on
        the route to member 0 (gloo and NCCL otherwise pick one from the host name, which
        on a host with several interfaces may not reach the others, and all_reduce
        hangs); left out when this process's environment sets them, or no interface
        holds that address. Use as ``os.environ.update(ctx.torch_env())``.
        ``timeout_s``: how long to wait for member 0 to publish it (None: the gang's
        timeout).
        """
        if self._torch_master is None:
            self._torch_master = self._get(_TORCH_MASTER_KEY, timeout_s, "torch_env()")
        host, port = _split_host_port(self._torch_master)
        env = {"MASTER_ADDR": host, "MASTER_PORT": str(port), "RANK": str(self.rank),
               "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
               "LOCAL_WORLD_SIZE": str(self.local_world_size),
               "NODE_RANK": str(self.node_rank)}
        ifname = interface_of(local_address_towards(host))
        if ifname is not None:
            for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                if var not in os.environ:
                    env[var] = ifname
        return env

    def jax_kwargs(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Keyword arguments of ``jax.distributed.initialize(**ctx.jax_kwargs())``: member 0
        serves JAX's coordination service on a port it found free when the gang formed.
        ``timeout_s``: how long to wait for member 0 to publish it (None: the gang's)."""
        if self._jax_coordinator is None:
            self._jax_coordinator = self._get(_JAX_COORDINATOR_KEY, timeout_s, "jax_kwargs()")
        return {"coordinator_address": self._jax_coordinator,
                "num_processes": self.world_size, "process_id": self.rank}

    # ------------------------------------------------------------ key-value store, barriers

    def kv_set(self, key: str, value: str | bytes) -> None:
        """Store ``value`` under ``key`` for every member (overwrites), e.g. an NCCL unique id."""
        self._check_key(key)
        try:
            self._client.key_value_set(f"user/{key}", value)
        except CoordinatorError as err:
            raise self._error(err, f"kv_set({key!r})") from err

    def kv_get(self, key: str, timeout_s: float | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout_s`` for some member to set it."""
        self._check_key(key)
        return self._get_bytes(f"user/{key}", timeout_s, f"kv_get({key!r})")

    def barrier(self, name: str = "barrier", timeout_s: float | None = None) -> None:
        """Wait until every member called ``barrier(name)`` as many times as this one.

        Members must call barriers of one name in the same order; names may repeat.
        ``timeout_s``: how long to wait for the others (None: the gang's timeout).
        """
        self._check_key(name)
        with self._lock:
            n = self._barriers.get(name, 0)
            self._barriers[name] = n + 1
        timeout = self._timeout(timeout_s)
        try:
            self._client.wait_at_barrier(f"user/{name}/{n}", timeout)
        except CoordinatorError as err:
            raise self._error(err, f"barrier({name!r})") from err

    def check(self) -> None:
        """Raise ``GangAbortedError`` if the gang was aborted (a peer died or hung).

        Call it between steps of a long loop that makes no other gang call: heartbeats notice
        the abort within one heartbeat interval, whatever the user code is doing.
        """
        error = self._client.aborted_error
        if error is not None:
            raise self._error(error, "check()") from error

    # ------------------------------------------------------------ internals

    def _timeout(self, timeout_s: float | None) -> float:
        timeout = self._spec.timeout_s if timeout_s is None else timeout_s
        if not is_number(timeout) or timeout < 0:
            raise ValueError(f"timeout_s must be None or a number of seconds >= 0, got {timeout!r}")
        return float(timeout)

    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not key:
            raise TypeError(f"gang keys and barrier names are non-empty strings, got {key!r}")

    def _get_bytes(self, key: str, timeout_s: float | None, what: str) -> bytes:
        try:
            return self._client.key_value_get(key, self._timeout(timeout_s))
        except CoordinatorError as err:
            raise self._error(err, what) from err

    def _get(self, key: str, timeout_s: float | None, what: str) -> str:
        return self._get_bytes(key, timeout_s, what).decode()

    def _error(self, err: CoordinatorError, what: str) -> GangError:
        me = f"{self._spec.class_name} gang member {self.rank} of {self.world_size}: {what}"
        if isinstance(err, CoordinatorAbortedError):
            return GangAbortedError(
                f"{me}: the gang was aborted: {err}. (Coordinator node ids are gang member "
                "indices.) A gang cannot go on without a member: gang.check() in the driver "
                "names the dead member's actor; shut the gang down and start a new one")
        if isinstance(err, CoordinatorTimeoutError):
            return GangTimeoutError(
                f"{me}: {err}. A member that never makes this call is slow, hung or runs other "
                "code; raise timeout_s or make every member call it")
        return GangError(f"{me}: {err}")


# ------------------------------------------------------------------ this process's membership

_current: GangContext | None = None


def join(spec: GangSpec) -> GangContext:
    """Join the gang (see the module docstring); returns the context ``gang_context()`` gives.

    Raises ``GangError`` naming the members that never arrived when the gang does not form
    within ``spec.timeout_s``.
    """
    global _current
    from .._proto import xla_distributed_runtime_pb2 as xla_pb2

    if _current is not None:
        raise GangError(f"this process is already gang member {_current.rank}: a process joins "
                        "one gang for life")
    gpu_ids = _context.gpu_ids()
    client = CoordinatorClient(
        spec.address, spec.member, num_nodes=spec.size, connect_timeout_s=spec.timeout_s,
        rpc_timeout_s=spec.timeout_s, heartbeat_interval_s=spec.heartbeat_interval_s,
        max_missing_heartbeats=spec.max_missing_heartbeats, exit_on_abort=spec.exit_on_abort,
        token=spec.token, tls=spec.tls)
    try:
        client.connect()
        host = host_identity()
        client.key_value_set(f"gang/host/{spec.member}", host)
        if spec.member == 0:
            addr = local_address_towards(_split_host_port(spec.address)[0])
            torch_port, jax_port = free_ports(addr, 2)
            client.key_value_set(_TORCH_MASTER_KEY, _join_host_port(addr, torch_port))
            client.key_value_set(_JAX_COORDINATOR_KEY, _join_host_port(addr, jax_port))
        local = [xla_pb2.DeviceProto(local_device_ordinal=i, name=f"GPU {gpu}")
                 for i, gpu in enumerate(gpu_ids)]
        topology = topology_from_proto(client.enumerate_devices(local, spec.timeout_s))
        # Every member set its host key before EnumerateDevices, so these return at once.
        hosts = [client.key_value_get(f"gang/host/{m}", spec.timeout_s).decode()
                 for m in range(spec.size)]
    except CoordinatorError as err:
        client.close()
        raise GangError(
            f"{spec.class_name} gang member {spec.member} of {spec.size} could not join the gang "
            f"(timeout_s={spec.timeout_s:g}): {err}. Members that never arrived are waiting for "
            "resources (other actors or tasks hold the GPUs/CPUs they need) or failed while "
            "starting (see their errors); free resources, or raise timeout_s") from err
    except BaseException:
        client.close()
        raise
    _current = GangContext(spec, client, layout(spec.member, hosts), topology, gpu_ids, host)
    return _current


def leave() -> None:
    """Stop being a member: close the coordinator client (its peers will see it vanish)."""
    global _current
    ctx, _current = _current, None
    if ctx is not None:
        ctx._client.close()


def member_info() -> dict[str, Any]:
    """What the driver's ``gang.wait_ready()`` reports for this member."""
    ctx = gang_context()
    return {"member": ctx.rank, "rank": ctx.rank, "local_rank": ctx.local_rank,
            "node_rank": ctx.node_rank, "pid": os.getpid(), "host": ctx.host,
            "gpu_ids": list(ctx.gpu_ids)}


def gang_context() -> GangContext:
    """This gang member's ``GangContext``; ``GangError`` outside a gang member."""
    ctx = _current
    if ctx is None:
        raise GangError("orchestra.gang_context() was called outside a gang member: only actors "
                        "started by orchestra.gang(...) have one (in their constructor and "
                        "methods); start the actors with orchestra.gang")
    return ctx
