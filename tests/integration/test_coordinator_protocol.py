"""The coordinator over real gRPC: raw xla stubs as nodes (threads), the Python client,
authentication (a coordinator with a token serves only clients that send it), and the
``python -m orchestra.coordinator`` entry point."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any

import grpc
import pytest

from _outsider import outsider_attempts
from _threads import Background
from orchestra._gang.coordinator import PROTOCOL_VERSION, Coordinator
from orchestra._gang.coordinator_auth import TOKEN_ENV
from orchestra._gang.coordinator_client import (
    CoordinatorAbortedError,
    CoordinatorAuthError,
    CoordinatorClient,
    CoordinatorError,
    CoordinatorTimeoutError,
)
from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2
from orchestra._proto import xla_distributed_runtime_pb2_grpc as xla_pb2_grpc

pytestmark = pytest.mark.timeout(30)

REPO_ROOT = Path(__file__).resolve().parents[2]
Stub = Any  # xla_pb2_grpc.DistributedRuntimeServiceStub (generated, untyped)
Metadata = tuple[tuple[str, str], ...] | None

TOKEN = "the-group-secret-" + "5" * 47
MEMBER: Metadata = (("authorization", f"Bearer {TOKEN}"),)  # what a member's client sends



@pytest.fixture
def start_coordinator() -> Iterator[Callable[..., Coordinator]]:
    started: list[Coordinator] = []

    def start(num_nodes: int, **kwargs: Any) -> Coordinator:
        coordinator = Coordinator(num_nodes, **kwargs)
        coordinator.start()
        started.append(coordinator)
        return coordinator

    yield start
    for coordinator in started:
        coordinator.stop(grace_s=0.1)


@pytest.fixture
def make_stub() -> Iterator[Callable[[str], Stub]]:
    channels: list[grpc.Channel] = []

    def make(address: str) -> Stub:
        channel = grpc.insecure_channel(address)
        channels.append(channel)
        return xla_pb2_grpc.DistributedRuntimeServiceStub(channel)

    yield make
    for channel in channels:
        channel.close()


@pytest.fixture
def make_client() -> Iterator[Callable[..., CoordinatorClient]]:
    clients: list[CoordinatorClient] = []

    def make(address: str, node_id: int, **kwargs: Any) -> CoordinatorClient:
        kwargs.setdefault("connect_timeout_s", 10.0)
        kwargs.setdefault("rpc_timeout_s", 5.0)
        client = CoordinatorClient(address, node_id, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def connect(
    stub: Stub,
    node_id: int,
    client_id: int | None = None,
    timeout_ms: int = 5000,
    metadata: Metadata = None,
) -> int:
    request = xla_pb2.ConnectRequest(
        protocol_version=PROTOCOL_VERSION,
        timeout_milliseconds=timeout_ms,
        node_id=node_id,
        client_id=100 + node_id if client_id is None else client_id,
    )
    session: int = stub.Connect(request, timeout=10, metadata=metadata).session_id
    return session


def connect_all(
    address: str,
    make_stub: Callable[[str], Stub],
    num_nodes: int,
    metadata: Metadata = None,
) -> list[Stub]:
    stubs = [make_stub(address) for _ in range(num_nodes)]
    calls = [
        Background(partial(connect, stubs[n], n, metadata=metadata))
        for n in range(num_nodes)
    ]
    sessions = {call.join() for call in calls}
    assert len(sessions) == 1
    return stubs


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def rpc_error(fn: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as excinfo:
        fn()
    return excinfo.value


# ----------------------------------------------------------------------------- Connect


def test_connect_barrier_gives_all_nodes_the_same_nonzero_session(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(3)
    stubs = [make_stub(coordinator.address) for _ in range(3)]
    calls = [Background(partial(connect, stubs[n], n)) for n in range(3)]
    sessions = {call.join() for call in calls}
    assert sessions == {coordinator.session_id}
    assert coordinator.session_id != 0


def test_connect_times_out_naming_the_missing_node(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(2)
    err = rpc_error(lambda: connect(make_stub(coordinator.address), 0, timeout_ms=200))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "missing node 1" in err.details()


def test_connect_rejects_another_protocol_version(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    stub = make_stub(start_coordinator(1).address)
    request = xla_pb2.ConnectRequest(
        protocol_version=PROTOCOL_VERSION + 1,
        timeout_milliseconds=1000,
        node_id=0,
        client_id=1,
    )
    err = rpc_error(lambda: stub.Connect(request, timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "protocol version" in err.details()


@pytest.mark.parametrize("node_id", [-1, 2])
def test_connect_rejects_node_id_out_of_range(
    start_coordinator: Callable[..., Coordinator],
    make_stub: Callable[[str], Stub],
    node_id: int,
) -> None:
    stub = make_stub(start_coordinator(2).address)
    err = rpc_error(lambda: connect(stub, node_id))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"node id {node_id}" in err.details()


def test_duplicate_node_id_replaces_the_first_client_which_gets_aborted(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(2)
    first = Background(lambda: connect(make_stub(coordinator.address), 0, client_id=1))
    wait_until(lambda: coordinator.state.clients() == {0: 1})
    second = Background(lambda: connect(make_stub(coordinator.address), 0, client_id=2))
    with pytest.raises(grpc.RpcError) as excinfo:
        first.join()
    assert excinfo.value.code() == grpc.StatusCode.ABORTED
    assert "replaced" in excinfo.value.details()
    assert connect(make_stub(coordinator.address), 1) == coordinator.session_id
    assert second.join() == coordinator.session_id


def test_rpc_with_another_session_id_is_rejected_naming_both_ids(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(1)
    (stub,) = connect_all(coordinator.address, make_stub, 1)
    wrong = coordinator.session_id ^ 0xFF
    err = rpc_error(
        lambda: stub.KeyValueSet(
            xla_pb2.KeyValueSetRequest(session_id=wrong, key=b"k", value=b"v"),
            timeout=5,
        )
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert hex(wrong) in err.details() and hex(coordinator.session_id) in err.details()


# ----------------------------------------------------------------------------- topology


def test_topology_orders_global_ids_by_node_then_local_ordinal(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(3)
    stubs = [make_stub(coordinator.address) for _ in range(3)]
    session = coordinator.session_id

    def node(n: int) -> Any:
        time.sleep(0.05 * (2 - n))  # node 2 connects and enumerates first, node 0 last
        connect(stubs[n], n)
        time.sleep(0.05 * (2 - n))
        devices = [
            xla_pb2.DeviceProto(local_device_ordinal=o, name=f"gpu{n}.{o}", vendor="nv")
            for o in (1, 0)  # reported in reverse ordinal order
        ]
        request = xla_pb2.EnumerateDevicesRequest(
            session_id=session,
            local_topology=xla_pb2.LocalTopologyProto(node_id=n, devices=devices),
        )
        return stubs[n].EnumerateDevices(request, timeout=10).global_topology

    calls = [Background(partial(node, n)) for n in (2, 1, 0)]
    topologies = [call.join() for call in calls]
    assert topologies[0] == topologies[1] == topologies[2]
    flat = [
        (n.node_id, d.local_device_ordinal, d.global_device_id, d.name)
        for n in topologies[0].nodes
        for d in n.devices
    ]
    assert flat == [
        (0, 0, 0, "gpu0.0"),
        (0, 1, 1, "gpu0.1"),
        (1, 0, 2, "gpu1.0"),
        (1, 1, 3, "gpu1.1"),
        (2, 0, 4, "gpu2.0"),
        (2, 1, 5, "gpu2.1"),
    ]


# ----------------------------------------------------------------------------- heartbeats


def test_silent_node_aborts_everyone_naming_it_and_abort_is_sticky(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(
        2, heartbeat_interval_s=0.1, max_missing_heartbeats=3
    )
    stub0, _ = connect_all(coordinator.address, make_stub, 2)
    beat = xla_pb2.HeartbeatRequest(session_id=coordinator.session_id, node_id=0)
    deadline = time.monotonic() + 5.0
    err: grpc.RpcError | None = None
    while (
        err is None and time.monotonic() < deadline
    ):  # node 0 beats, node 1 stays silent
        try:
            stub0.Heartbeat(beat, timeout=5)
        except grpc.RpcError as caught:
            err = caught
        time.sleep(0.05)
    assert err is not None, "the coordinator never noticed the silent node"
    assert err.code() == grpc.StatusCode.ABORTED
    assert "node 1 missed heartbeats" in err.details()
    later = rpc_error(
        lambda: stub0.KeyValueSet(
            xla_pb2.KeyValueSetRequest(
                session_id=coordinator.session_id, key=b"k", value=b""
            ),
            timeout=5,
        )
    )
    assert later.code() == grpc.StatusCode.ABORTED
    assert "node 1 missed heartbeats" in later.details()


# ----------------------------------------------------------------------------- key-value


def test_key_value_get_blocks_until_another_node_sets_the_key(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(2)
    stub0, stub1 = connect_all(coordinator.address, make_stub, 2)
    session = coordinator.session_id
    getter = Background(
        lambda: stub0.KeyValueGet(
            xla_pb2.KeyValueGetRequest(
                session_id=session, key=b"nccl", timeout_milliseconds=5000
            ),
            timeout=10,
        )
    )
    time.sleep(0.2)
    assert getter.thread.is_alive()
    stub1.KeyValueSet(
        xla_pb2.KeyValueSetRequest(session_id=session, key=b"nccl", value=b"id")
    )
    response = getter.join()
    assert response.found and response.value == b"id"


def test_key_value_get_timeout_is_not_found(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(1)
    (stub,) = connect_all(coordinator.address, make_stub, 1)
    request = xla_pb2.KeyValueGetRequest(
        session_id=coordinator.session_id, key=b"absent", timeout_milliseconds=200
    )
    err = rpc_error(lambda: stub.KeyValueGet(request, timeout=5))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "b'absent'" in err.details()


def test_key_value_set_overwrites(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(1)
    (stub,) = connect_all(coordinator.address, make_stub, 1)
    session = coordinator.session_id
    for value in (b"one", b"two"):
        stub.KeyValueSet(
            xla_pb2.KeyValueSetRequest(session_id=session, key=b"k", value=value),
            timeout=5,
        )
    request = xla_pb2.KeyValueGetRequest(
        session_id=session, key=b"k", timeout_milliseconds=0
    )
    assert stub.KeyValueGet(request, timeout=5).value == b"two"


# ----------------------------------------------------------------------------- shutdown


def test_shutdown_is_a_barrier(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(2)
    stubs = connect_all(coordinator.address, make_stub, 2)
    session = coordinator.session_id

    def shut(n: int) -> Any:
        request = xla_pb2.ShutdownRequest(session_id=session, node_id=n)
        return stubs[n].Shutdown(request, timeout=10)

    first = Background(lambda: shut(0))
    time.sleep(0.2)
    assert first.thread.is_alive()
    shut(1)
    first.join()


def test_shutdown_times_out_naming_the_missing_node(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(2, shutdown_timeout_s=0.2)
    stub0, _ = connect_all(coordinator.address, make_stub, 2)
    request = xla_pb2.ShutdownRequest(session_id=coordinator.session_id, node_id=0)
    err = rpc_error(lambda: stub0.Shutdown(request, timeout=5))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "node 1 never called Shutdown" in err.details()


# ----------------------------------------------------------------------------- client


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_client_retries_connect_until_a_late_server_starts(
    start_coordinator: Callable[..., Coordinator],
    make_client: Callable[..., CoordinatorClient],
) -> None:
    port = free_port()
    client = make_client(f"127.0.0.1:{port}", 0)
    connecting = Background(client.connect)
    time.sleep(0.5)
    coordinator = start_coordinator(1, port=port)
    assert connecting.join() == coordinator.session_id


def test_client_connect_gives_up_after_its_timeout(
    make_client: Callable[..., CoordinatorClient],
) -> None:
    client = make_client(f"127.0.0.1:{free_port()}", 0, connect_timeout_s=0.5)
    with pytest.raises(
        CoordinatorTimeoutError, match="could not reach the coordinator"
    ):
        client.connect()


def test_client_key_value_and_topology(
    start_coordinator: Callable[..., Coordinator],
    make_client: Callable[..., CoordinatorClient],
) -> None:
    coordinator = start_coordinator(1)
    client = make_client(coordinator.address, 0)
    client.connect()
    client.key_value_set("addr", "10.0.0.1:1234")
    assert client.key_value_get(b"addr", timeout_s=1.0) == b"10.0.0.1:1234"
    with pytest.raises(CoordinatorTimeoutError, match="absent"):
        client.key_value_get("absent", timeout_s=0.1)
    topology = client.enumerate_devices(
        [xla_pb2.DeviceProto(local_device_ordinal=0, name="gpu0")], timeout_s=5.0
    )
    assert [(n.node_id, len(n.devices)) for n in topology.nodes] == [(0, 1)]
    client.shutdown(timeout_s=5.0)


def test_client_barrier_waits_for_every_node(
    start_coordinator: Callable[..., Coordinator],
    make_client: Callable[..., CoordinatorClient],
) -> None:
    coordinator = start_coordinator(3)
    clients = [make_client(coordinator.address, n, num_nodes=3) for n in range(3)]
    for connecting in [Background(c.connect) for c in clients]:
        connecting.join()
    early = [
        Background(partial(c.wait_at_barrier, "init", timeout_s=5.0))
        for c in clients[:2]
    ]
    time.sleep(0.2)
    assert all(call.thread.is_alive() for call in early)
    clients[2].wait_at_barrier("init", timeout_s=5.0)
    for call in early:
        call.join()


def test_client_barrier_timeout_names_missing_nodes(
    start_coordinator: Callable[..., Coordinator],
    make_client: Callable[..., CoordinatorClient],
) -> None:
    coordinator = start_coordinator(2)
    clients = [make_client(coordinator.address, n, num_nodes=2) for n in range(2)]
    for connecting in [Background(c.connect) for c in clients]:
        connecting.join()
    with pytest.raises(CoordinatorTimeoutError, match=r"nodes \[1\] never reached it"):
        clients[0].wait_at_barrier("lonely", timeout_s=0.2)


def test_client_raises_aborted_in_the_caller_naming_the_missing_node(
    start_coordinator: Callable[..., Coordinator],
    make_client: Callable[..., CoordinatorClient],
) -> None:
    coordinator = start_coordinator(
        2, heartbeat_interval_s=0.1, max_missing_heartbeats=3
    )
    clients = [
        make_client(coordinator.address, n, num_nodes=2, heartbeat_interval_s=0.05)
        for n in range(2)
    ]
    for connecting in [Background(c.connect) for c in clients]:
        connecting.join()
    clients[1].close()  # node 1 goes silent
    with pytest.raises(CoordinatorAbortedError, match="node 1 missed heartbeats"):
        clients[0].key_value_get("never", timeout_s=10.0)
    with pytest.raises(CoordinatorAbortedError, match="node 1 missed heartbeats"):
        clients[0].key_value_set("k", "v")  # sticky, also on the client side


def test_client_exit_on_abort_exits_the_process(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(
        2, heartbeat_interval_s=0.1, max_missing_heartbeats=3
    )
    script = textwrap.dedent(
        f"""
        import time
        from orchestra._gang.coordinator_client import CoordinatorClient
        client = CoordinatorClient({coordinator.address!r}, 1, connect_timeout_s=10,
                                   heartbeat_interval_s=0.05, exit_on_abort=True)
        client.connect()
        time.sleep(20)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env=_env(), stderr=subprocess.PIPE, text=True
    )
    try:
        connect(make_stub(coordinator.address), 0)  # node 0 connects, then never beats
        _, stderr = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "node 0 missed heartbeats" in stderr and "exit_on_abort" in stderr


# ----------------------------------------------------------------------------- authentication


def everything_refused(codes: dict[str, str]) -> bool:
    return bool(codes) and set(codes.values()) == {"UNAUTHENTICATED"}


def test_with_a_token_every_rpc_of_an_outsider_is_refused_while_the_group_forms(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(2, token=TOKEN)
    first = Background(
        lambda: connect(make_stub(coordinator.address), 0, metadata=MEMBER)
    )
    wait_until(lambda: coordinator.state.clients() == {0: 100})
    # The outsider claims the missing node: without the token it would complete the barrier.
    codes = outsider_attempts(coordinator.address, coordinator.session_id, node=1)
    assert codes == {key: "UNAUTHENTICATED" for key in codes} and everything_refused(codes)
    assert coordinator.refused_calls == len(codes)
    assert coordinator.state.clients() == {0: 100}
    assert not coordinator.state.session_started
    second = connect(make_stub(coordinator.address), 1, metadata=MEMBER)
    assert first.join() == second == coordinator.session_id


def test_with_a_token_every_rpc_of_an_outsider_is_refused_in_a_running_group(
    start_coordinator: Callable[..., Coordinator], make_stub: Callable[[str], Stub]
) -> None:
    coordinator = start_coordinator(
        2, token=TOKEN, heartbeat_interval_s=0.1, max_missing_heartbeats=3
    )
    stubs = connect_all(coordinator.address, make_stub, 2, metadata=MEMBER)
    session = coordinator.session_id
    key = b"gang/torch_master"
    stubs[0].KeyValueSet(
        xla_pb2.KeyValueSetRequest(session_id=session, key=key, value=b"10.0.0.1:29500"),
        timeout=5,
        metadata=MEMBER,
    )
    # Node 1 is healthy: a Connect in its name would abort the group and blame it.
    codes = outsider_attempts(coordinator.address, session, node=1)
    assert codes == {key: "UNAUTHENTICATED" for key in codes} and everything_refused(codes)
    assert coordinator.state.aborted_reason is None
    assert coordinator.state.failed_nodes == frozenset()
    got = stubs[1].KeyValueGet(
        xla_pb2.KeyValueGetRequest(session_id=session, key=key, timeout_milliseconds=0),
        timeout=5,
        metadata=MEMBER,
    )
    assert got.value == b"10.0.0.1:29500"
    # Both members still complete the Shutdown barrier: the outsider's Shutdown never counted.
    shut = [
        Background(
            partial(
                stubs[n].Shutdown,
                xla_pb2.ShutdownRequest(session_id=session, node_id=n),
                timeout=10,
                metadata=MEMBER,
            )
        )
        for n in range(2)
    ]
    for call in shut:
        call.join()


def test_a_token_without_the_bearer_scheme_or_in_another_header_is_refused(
    start_coordinator: Callable[..., Coordinator],
) -> None:
    coordinator = start_coordinator(1, token=TOKEN)
    codes = outsider_attempts(
        coordinator.address,
        coordinator.session_id,
        node=0,
        credentials={
            "bare token": (("authorization", TOKEN),),
            "other header": (("x-orchestra-token", TOKEN),),
        },
    )
    assert codes == {key: "UNAUTHENTICATED" for key in codes} and everything_refused(codes)


def test_a_client_with_the_token_uses_every_rpc(
    start_coordinator: Callable[..., Coordinator],
    make_client: Callable[..., CoordinatorClient],
) -> None:
    coordinator = start_coordinator(
        1, token=TOKEN, heartbeat_interval_s=0.1, max_missing_heartbeats=3
    )
    client = make_client(
        coordinator.address, 0, num_nodes=1, token=TOKEN, heartbeat_interval_s=0.05
    )
    assert client.connect() == coordinator.session_id
    client.key_value_set("addr", "10.0.0.1:1234")
    assert client.key_value_get("addr", timeout_s=1.0) == b"10.0.0.1:1234"
    client.wait_at_barrier("init", timeout_s=5.0)
    client.enumerate_devices(
        [xla_pb2.DeviceProto(local_device_ordinal=0, name="gpu0")], timeout_s=5.0
    )
    time.sleep(0.5)  # heartbeats carry the token too, or the group would abort here
    assert coordinator.state.aborted_reason is None
    client.shutdown(timeout_s=5.0)
    assert coordinator.refused_calls == 0


def test_a_tls_coordinator_serves_its_members_and_nothing_crosses_in_the_clear(
    start_coordinator: Callable[..., Coordinator],
    make_client: Callable[..., CoordinatorClient],
) -> None:
    # A gang of a cluster that speaks TLS: the coordinator's key is made from the gang's
    # token; its members pin it; a plaintext client and one pinning another key get no
    # answer, and nothing of theirs reaches the state.
    coordinator = start_coordinator(1, token=TOKEN, tls=True)
    for outsider in (dict(token=TOKEN), dict(token="7" * 64, tls=True)):
        client = make_client(coordinator.address, 0, num_nodes=1, connect_timeout_s=2.0,
                             **outsider)
        with pytest.raises(CoordinatorError):
            client.connect()
        client.close()
    assert coordinator.state.clients() == {}
    member = make_client(coordinator.address, 0, num_nodes=1, token=TOKEN, tls=True)
    assert member.connect() == coordinator.session_id
    member.key_value_set("nccl", "secret-unique-id")
    assert member.key_value_get("nccl", timeout_s=1.0) == b"secret-unique-id"
    member.shutdown(timeout_s=5.0)
    with pytest.raises(ValueError, match="token"):
        Coordinator(1, tls=True)


@pytest.mark.parametrize("token", [None, "0" * 64], ids=["no token", "wrong token"])
def test_a_client_without_the_groups_token_fails_at_once_without_retrying(
    start_coordinator: Callable[..., Coordinator],
    make_client: Callable[..., CoordinatorClient],
    token: str | None,
) -> None:
    coordinator = start_coordinator(2, token=TOKEN)
    client = make_client(coordinator.address, 0, connect_timeout_s=20.0, token=token)
    started = time.monotonic()
    with pytest.raises(CoordinatorAuthError, match="refused this client.*token"):
        client.connect()
    assert time.monotonic() - started < 5.0
    assert coordinator.state.clients() == {}


# ----------------------------------------------------------------------------- entry point


def _env(token: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])
    )
    env.pop(TOKEN_ENV, None)
    if token is not None:
        env[TOKEN_ENV] = token
    return env


def _read_line(stream: IO[str], timeout_s: float) -> str:
    line = Background(stream.readline)
    return str(line.join(timeout_s))


def _run_entry_point(*args: str, token_env: str | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestra.coordinator", *args],
        env=_env(token_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_entry_point_prints_its_address_and_serves_until_sigterm(
    make_stub: Callable[[str], Stub],
) -> None:
    proc = _run_entry_point("--num-nodes", "1", "--port", "0")
    try:
        address = _read_line(proc.stdout, 15).strip()  # type: ignore[arg-type]
        assert address.startswith("127.0.0.1:")
        assert connect(make_stub(address), 0) != 0
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "no authentication" not in stderr


def _stderr_beyond_loopback(*args: str, **kwargs: Any) -> str:
    """What the entry point bound to 0.0.0.0 (with ``args`` more) says on stderr once it
    serves."""
    proc = _run_entry_point("--num-nodes", "1", "--port", "0", "--host", "0.0.0.0", *args,
                            **kwargs)
    try:
        _read_line(proc.stdout, 15)  # type: ignore[arg-type]
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    finally:
        proc.kill()
    return stderr


def test_entry_point_warns_when_listening_beyond_loopback() -> None:
    assert "no authentication" in _stderr_beyond_loopback()


def test_entry_point_with_a_token_in_the_environment_refuses_clients_without_it(
    make_stub: Callable[[str], Stub],
) -> None:
    proc = _run_entry_point("--num-nodes", "1", "--port", "0", token_env=TOKEN)
    try:
        address = _read_line(proc.stdout, 15).strip()  # type: ignore[arg-type]
        err = rpc_error(lambda: connect(make_stub(address), 0))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "no token" in err.details()
        assert connect(make_stub(address), 0, metadata=MEMBER) != 0
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert TOKEN not in stderr  # the secret is never logged
    assert "command line" not in stderr  # no warning about argv: the token is not in it


def test_entry_point_token_flag_wins_over_the_environment(
    make_stub: Callable[[str], Stub],
) -> None:
    proc = _run_entry_point(
        "--num-nodes", "1", "--port", "0", "--token", TOKEN, token_env="0" * 64
    )
    try:
        address = _read_line(proc.stdout, 15).strip()  # type: ignore[arg-type]
        env_token: Metadata = (("authorization", "Bearer " + "0" * 64),)
        err = rpc_error(lambda: connect(make_stub(address), 0, metadata=env_token))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert connect(make_stub(address), 0, metadata=MEMBER) != 0
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert f"pass it in ${TOKEN_ENV} instead" in stderr


def test_entry_point_refuses_an_empty_token_instead_of_serving_without_one() -> None:
    proc = _run_entry_point("--num-nodes", "1", "--port", "0", token_env="")
    try:
        stdout, stderr = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 2 and stdout == ""
    assert f"${TOKEN_ENV}" in stderr and "empty" in stderr


def test_entry_point_with_a_token_beyond_loopback_opted_out_of_tls_warns_it_is_plain() -> None:
    stderr = _stderr_beyond_loopback("--insecure-no-tls", token_env=TOKEN)
    assert "not encrypted (--insecure-no-tls)" in stderr and "no authentication" not in stderr
    assert "plain gRPC" in stderr


def test_entry_point_with_a_token_beyond_loopback_speaks_tls_keyed_by_the_token(
    make_stub: Callable[[str], Stub],
) -> None:
    """Its clients (those that send the token are orchestra's) pin the key made from the
    token: a plaintext client gets nowhere, CoordinatorClient(tls=True) connects and
    uses the key-value store; nothing is warned."""
    from orchestra._protocol import tls
    proc = _run_entry_point("--num-nodes", "1", "--port", "0", "--host", "0.0.0.0",
                            token_env=TOKEN)
    try:
        bound = _read_line(proc.stdout, 15).strip()  # type: ignore[arg-type]
        address = "127.0.0.1:" + bound.rsplit(":", 1)[1]
        err = rpc_error(lambda: connect(make_stub(address), 0, metadata=MEMBER))
        assert err.code() == grpc.StatusCode.UNAVAILABLE   # no TLS: no answer at all
        with CoordinatorClient(address, 0, num_nodes=1, token=TOKEN, tls=True,
                               connect_timeout_s=10) as client:
            client.connect()
            client.key_value_set("nccl-id", b"secret bytes")
            assert client.key_value_get("nccl-id", 5) == b"secret bytes"
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "WARNING" not in stderr, stderr
    assert f"speaking TLS with the key of the token ({tls.cluster_fingerprint(TOKEN)}" in stderr


def test_entry_point_refuses_tls_without_a_token() -> None:
    proc = _run_entry_point("--num-nodes", "1", "--port", "0", "--tls")
    stdout, stderr = proc.communicate(timeout=15)
    assert proc.returncode == 2 and stdout == ""
    assert "--tls needs a token" in stderr
