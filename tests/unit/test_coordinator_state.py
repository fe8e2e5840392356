"""CoordinatorState: the coordinator's decisions, tested without sockets.

Concurrent nodes are threads calling the state directly; liveness uses an injected clock.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pytest

from _threads import Background
from orchestra._gang.coordinator import (
    PROTOCOL_VERSION,
    CoordinatorState,
    CoordinatorStateError,
    Status,
    build_global_topology,
    is_loopback_host,
)
from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2

pytestmark = pytest.mark.timeout(30)

SESSION = 0xC0FFEE


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_state(num_nodes: int = 2, **kwargs: Any) -> CoordinatorState:
    kwargs.setdefault("heartbeat_interval_s", 1.0)
    kwargs.setdefault("max_missing_heartbeats", 3)
    return CoordinatorState(num_nodes, session_id=SESSION, **kwargs)



def connect_all(state: CoordinatorState, timeout_s: float = 5.0) -> int:
    calls = [
        Background(partial(state.connect, n, 100 + n, PROTOCOL_VERSION, timeout_s))
        for n in range(state.num_nodes)
    ]
    sessions: set[int] = {call.join() for call in calls}
    assert len(sessions) == 1
    return sessions.pop()


def status_of(excinfo: pytest.ExceptionInfo[CoordinatorStateError]) -> Status:
    return excinfo.value.status


# ----------------------------------------------------------------------------- Connect


def test_random_session_id_is_nonzero_uint64() -> None:
    ids = {CoordinatorState(1).session_id for _ in range(20)}
    assert all(0 < i < 2**64 for i in ids)
    assert len(ids) > 1


def test_connect_barrier_gives_every_node_the_same_session() -> None:
    state = make_state(3)
    assert connect_all(state) == SESSION
    assert state.session_started


def test_connect_blocks_until_the_last_node_arrives() -> None:
    state = make_state(2)
    first = Background(lambda: state.connect(0, 1, PROTOCOL_VERSION, 5.0))
    time.sleep(0.1)
    assert first.thread.is_alive()
    assert state.connect(1, 2, PROTOCOL_VERSION, 5.0) == SESSION
    assert first.join() == SESSION


def test_connect_timeout_names_missing_nodes_and_unregisters_the_caller() -> None:
    state = make_state(3)
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.connect(0, 1, PROTOCOL_VERSION, 0.05)
    assert status_of(excinfo) is Status.DEADLINE_EXCEEDED
    assert "missing nodes 1, 2" in excinfo.value.message
    # Node 0 gave up: later arrivals of 1 and 2 alone must not complete the barrier.
    with pytest.raises(CoordinatorStateError) as excinfo:
        Background(lambda: state.connect(1, 2, PROTOCOL_VERSION, 0.2))
        state.connect(2, 3, PROTOCOL_VERSION, 0.1)
    assert "missing node 0" in excinfo.value.message


def test_connect_rejects_another_protocol_version() -> None:
    state = make_state(1)
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.connect(0, 1, PROTOCOL_VERSION + 1, 1.0)
    assert status_of(excinfo) is Status.INVALID_ARGUMENT
    assert f"version {PROTOCOL_VERSION + 1}" in excinfo.value.message


@pytest.mark.parametrize("node_id", [-1, 2, 7])
def test_connect_rejects_node_id_out_of_range(node_id: int) -> None:
    state = make_state(2)
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.connect(node_id, 1, PROTOCOL_VERSION, 1.0)
    assert status_of(excinfo) is Status.INVALID_ARGUMENT
    assert f"node id {node_id}" in excinfo.value.message


def test_second_client_of_a_node_replaces_the_first_which_gets_aborted() -> None:
    state = make_state(2)
    first = Background(lambda: state.connect(0, 111, PROTOCOL_VERSION, 5.0))
    while state.clients() != {0: 111}:
        time.sleep(0.01)
    second = Background(lambda: state.connect(0, 222, PROTOCOL_VERSION, 5.0))
    with pytest.raises(CoordinatorStateError) as excinfo:
        first.join()
    assert status_of(excinfo) is Status.ABORTED
    assert "replaced" in excinfo.value.message and "0xde" in excinfo.value.message
    assert state.connect(1, 333, PROTOCOL_VERSION, 5.0) == SESSION
    assert second.join() == SESSION


def test_connect_retry_from_same_client_after_barrier_returns_session() -> None:
    state = make_state(2)
    connect_all(state)
    assert state.connect(1, 101, PROTOCOL_VERSION, 0.0) == SESSION
    assert state.aborted_reason is None


def test_reconnect_from_new_client_after_barrier_aborts_the_group() -> None:
    state = make_state(2)
    connect_all(state)
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.connect(1, 999, PROTOCOL_VERSION, 0.0)
    assert status_of(excinfo) is Status.ABORTED
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.heartbeat(SESSION, 0)
    assert status_of(excinfo) is Status.ABORTED
    assert "node 1 connected again" in excinfo.value.message


def test_cancelled_connect_unregisters_the_node() -> None:
    state = make_state(2)
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.connect(0, 1, PROTOCOL_VERSION, 5.0, is_active=lambda: False)
    assert status_of(excinfo) is Status.CANCELLED
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.connect(1, 2, PROTOCOL_VERSION, 0.05)
    assert "missing node 0" in excinfo.value.message


# ----------------------------------------------------------------------------- sessions


def test_rpc_with_another_session_id_names_both_ids() -> None:
    state = make_state(1)
    connect_all(state)
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.key_value_set(0x1234, b"k", b"v")
    assert status_of(excinfo) is Status.FAILED_PRECONDITION
    assert "0x1234" in excinfo.value.message and hex(SESSION) in excinfo.value.message


def test_rpc_before_the_connect_barrier_is_rejected() -> None:
    state = make_state(2)
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.heartbeat(SESSION, 0)
    assert status_of(excinfo) is Status.FAILED_PRECONDITION
    assert "call Connect first" in excinfo.value.message


# ----------------------------------------------------------------------------- topology


def local(node_id: int, *ordinals: int) -> xla_pb2.LocalTopologyProto:
    return xla_pb2.LocalTopologyProto(
        node_id=node_id,
        devices=[
            xla_pb2.DeviceProto(
                local_device_ordinal=o, name=f"gpu{node_id}.{o}", vendor="v"
            )
            for o in ordinals
        ],
    )


def test_global_ids_follow_node_id_then_local_ordinal() -> None:
    topology = build_global_topology([local(2, 1, 0), local(0, 1, 0), local(1, 0)])
    assert [node.node_id for node in topology.nodes] == [0, 1, 2]
    flat = [
        (node.node_id, d.local_device_ordinal, d.global_device_id, d.name)
        for node in topology.nodes
        for d in node.devices
    ]
    assert flat == [
        (0, 0, 0, "gpu0.0"),
        (0, 1, 1, "gpu0.1"),
        (1, 0, 2, "gpu1.0"),
        (2, 0, 3, "gpu2.0"),
        (2, 1, 4, "gpu2.1"),
    ]


def test_enumerate_devices_is_a_barrier_returning_one_topology() -> None:
    state = make_state(2)
    connect_all(state)
    late = Background(lambda: state.enumerate_devices(SESSION, local(1, 0), 5.0))
    time.sleep(0.05)
    assert late.thread.is_alive()
    mine = state.enumerate_devices(SESSION, local(0, 0, 1), 5.0)
    assert late.join() == mine
    assert [d.global_device_id for n in mine.nodes for d in n.devices] == [0, 1, 2]


def test_enumerate_devices_timeout_names_missing_nodes() -> None:
    state = make_state(3)
    connect_all(state)
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.enumerate_devices(SESSION, local(1, 0), 0.05)
    assert status_of(excinfo) is Status.DEADLINE_EXCEEDED
    assert "nodes 0, 2 never called it" in excinfo.value.message


# ----------------------------------------------------------------------------- heartbeats


def test_silent_node_aborts_the_group_and_abort_is_sticky() -> None:
    clock = FakeClock()
    state = make_state(2, clock=clock)
    connect_all(state)
    clock.now += 2.0
    state.heartbeat(SESSION, 0)
    assert state.check_heartbeats() is None
    clock.now += 1.5  # node 1 silent 3.5 s > 1 s x 3; node 0 silent 1.5 s
    reason = state.check_heartbeats()
    assert reason is not None and reason.startswith("node 1 missed heartbeats")
    for call in (
        lambda: state.heartbeat(SESSION, 0),
        lambda: state.key_value_set(SESSION, b"k", b"v"),
        lambda: state.key_value_get(SESSION, b"k", 0.0),
        lambda: state.connect(0, 100, PROTOCOL_VERSION, 0.0),
        lambda: state.shutdown(SESSION, 0, 1.0),
        lambda: state.key_value_set(0xBAD, b"k", b"v"),  # aborted beats a wrong session
    ):
        with pytest.raises(CoordinatorStateError) as excinfo:
            call()
        assert status_of(excinfo) is Status.ABORTED
        assert "node 1 missed heartbeats" in excinfo.value.message


def test_the_abort_names_the_nodes_it_blames() -> None:
    clock = FakeClock()
    state = make_state(3, clock=clock)
    connect_all(state)
    assert state.failed_nodes == frozenset()
    clock.now += 2.0
    state.heartbeat(SESSION, 1)
    clock.now += 1.5  # nodes 0 and 2 silent 3.5 s > 3 s; node 1 1.5 s
    assert state.check_heartbeats() is not None
    assert state.failed_nodes == frozenset({0, 2})
    clock.now += 10.0  # the first abort stays: node 1 going silent later is not blamed
    state.check_heartbeats()
    assert state.failed_nodes == frozenset({0, 2})


def test_a_node_that_restarts_is_blamed_and_a_stop_blames_nobody() -> None:
    state = make_state(2)
    connect_all(state)
    with pytest.raises(CoordinatorStateError):
        state.connect(1, 999, PROTOCOL_VERSION, 0.0)
    assert state.failed_nodes == frozenset({1})
    stopped = make_state(2)
    stopped.abort("the coordinator was stopped")
    assert stopped.failed_nodes == frozenset()


def test_heartbeats_are_not_checked_before_the_connect_barrier() -> None:
    clock = FakeClock()
    state = make_state(2, clock=clock)
    clock.now += 1e6
    assert state.check_heartbeats() is None


def test_abort_wakes_blocked_calls() -> None:
    clock = FakeClock()
    state = make_state(2, clock=clock)
    connect_all(state)
    blocked = Background(lambda: state.key_value_get(SESSION, b"never", 10.0))
    time.sleep(0.05)
    clock.now += 10.0
    assert state.check_heartbeats() is not None
    with pytest.raises(CoordinatorStateError) as excinfo:
        blocked.join(timeout=2.0)
    assert status_of(excinfo) is Status.ABORTED
    assert "nodes 0, 1 missed heartbeats" in excinfo.value.message


def test_nodes_in_shutdown_are_not_watched() -> None:
    clock = FakeClock()
    state = make_state(2, clock=clock)
    connect_all(state)
    waiting = Background(lambda: state.shutdown(SESSION, 0, 5.0))
    time.sleep(0.05)
    clock.now += 2.5
    state.heartbeat(SESSION, 1)
    clock.now += 2.5  # node 0 silent 5 s but in Shutdown; node 1 silent 2.5 s
    assert state.check_heartbeats() is None
    state.shutdown(SESSION, 1, 5.0)
    waiting.join()


# ----------------------------------------------------------------------------- shutdown


def test_shutdown_is_a_barrier() -> None:
    state = make_state(2)
    connect_all(state)
    first = Background(lambda: state.shutdown(SESSION, 1, 5.0))
    time.sleep(0.05)
    assert first.thread.is_alive()
    state.shutdown(SESSION, 0, 5.0)
    first.join()


def test_shutdown_timeout_names_missing_nodes() -> None:
    state = make_state(3)
    connect_all(state)
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.shutdown(SESSION, 1, 0.05)
    assert status_of(excinfo) is Status.DEADLINE_EXCEEDED
    assert "nodes 0, 2 never called Shutdown" in excinfo.value.message


# ----------------------------------------------------------------------------- key-value


def test_key_value_get_blocks_until_set() -> None:
    state = make_state(1)
    connect_all(state)
    getter = Background(lambda: state.key_value_get(SESSION, b"nccl", 5.0))
    time.sleep(0.05)
    assert getter.thread.is_alive()
    state.key_value_set(SESSION, b"nccl", b"id-1")
    assert getter.join() == b"id-1"


def test_key_value_get_timeout_is_not_found() -> None:
    state = make_state(1)
    connect_all(state)
    start = time.monotonic()
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.key_value_get(SESSION, b"absent", 0.1)
    assert time.monotonic() - start >= 0.1
    assert status_of(excinfo) is Status.NOT_FOUND
    assert "b'absent'" in excinfo.value.message


def test_key_value_set_overwrites() -> None:
    state = make_state(1)
    connect_all(state)
    state.key_value_set(SESSION, b"k", b"1")
    state.key_value_set(SESSION, b"k", b"2")
    assert state.key_value_get(SESSION, b"k", 0.0) == b"2"


def test_cancelled_key_value_get_returns_cancelled() -> None:
    state = make_state(1)
    connect_all(state)
    with pytest.raises(CoordinatorStateError) as excinfo:
        state.key_value_get(SESSION, b"k", 5.0, is_active=lambda: False)
    assert status_of(excinfo) is Status.CANCELLED


# ----------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("head.example.com", False),
    ],
)
def test_loopback_detection_for_the_no_authentication_warning(
    host: str, loopback: bool
) -> None:
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_nodes": 0},
        {"num_nodes": 1, "heartbeat_interval_s": 0.0},
        {"num_nodes": 1, "max_missing_heartbeats": 0},
        {"num_nodes": 1, "session_id": 0},
        {"num_nodes": 1, "session_id": 2**64},
    ],
)
def test_invalid_construction_is_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CoordinatorState(**kwargs)
