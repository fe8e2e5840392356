"""Gang decisions without processes or sockets: ranks from hosts, topology order, option
resolution, capacity checks, argument checks, and how a member's GangContext maps
coordinator errors and names its keys (over a fake coordinator client)."""
from __future__ import annotations

import pickle
from typing import Any

import pytest

import orchestra
from orchestra import (
    GangAbortedError,
    GangContext,
    GangDevice,
    GangError,
    GangMemberDiedError,
    GangTimeoutError,
)
from orchestra._gang.coordinator import build_global_topology
from orchestra._gang.coordinator_client import (
    CoordinatorAbortedError,
    CoordinatorError,
    CoordinatorTimeoutError,
)
from orchestra._gang.gang import _check_capacity, _member_class, _resolve_options
from orchestra._gang.member import GangSpec, Layout, layout, topology_from_proto
from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2
from orchestra.exceptions import InfeasibleResourcesError, OrchestraError

pytestmark = pytest.mark.timeout(10)


class Plain:
    def __init__(self, x: int = 0) -> None:
        self.x = x

    def value(self) -> int:
        return self.x


# ------------------------------------------------------------------ ranks

def test_one_host_gives_local_ranks_equal_to_ranks() -> None:
    hosts = ["a"] * 4
    assert [layout(m, hosts) for m in range(4)] == [Layout(0, 1, m, 4) for m in range(4)]


def test_hosts_are_numbered_by_their_first_member_and_local_ranks_count_within_a_host() -> None:
    hosts = ["b", "a", "b", "c", "a"]
    assert [layout(m, hosts) for m in range(5)] == [
        Layout(node_rank=0, num_nodes=3, local_rank=0, local_world_size=2),
        Layout(node_rank=1, num_nodes=3, local_rank=0, local_world_size=2),
        Layout(node_rank=0, num_nodes=3, local_rank=1, local_world_size=2),
        Layout(node_rank=2, num_nodes=3, local_rank=0, local_world_size=1),
        Layout(node_rank=1, num_nodes=3, local_rank=1, local_world_size=2),
    ]


def test_a_member_outside_the_gang_has_no_layout() -> None:
    with pytest.raises(ValueError, match="outside"):
        layout(2, ["a", "a"])


# ------------------------------------------------------------------ topology

def local(node: int, *gpus: int) -> Any:
    return xla_pb2.LocalTopologyProto(node_id=node, devices=[
        xla_pb2.DeviceProto(local_device_ordinal=i, name=f"GPU {g}") for i, g in enumerate(gpus)])


def test_topology_is_in_member_order_then_local_ordinal_whatever_the_arrival_order() -> None:
    proto = build_global_topology([local(2, 7), local(0, 3, 1), local(1)])
    assert topology_from_proto(proto) == (
        GangDevice(0, 0, 0, "GPU 3"), GangDevice(1, 0, 1, "GPU 1"), GangDevice(2, 2, 0, "GPU 7"))


# ------------------------------------------------------------------ options and capacity

def test_a_plain_class_gets_one_gpu_per_member_by_default() -> None:
    base, options = _resolve_options(Plain, None, None, None)
    assert base is Plain and options == {"num_gpus": 1}


def test_an_actor_class_keeps_its_options_and_explicit_arguments_win() -> None:
    cls = orchestra.remote(num_gpus=2, num_cpus=1, max_concurrency=4)(Plain)
    assert _resolve_options(cls, None, None, None)[1] == {
        "num_gpus": 2, "num_cpus": 1, "max_concurrency": 4}
    assert _resolve_options(cls, 0, 2, {"widget": 1})[1] == {
        "num_gpus": 0, "num_cpus": 2, "max_concurrency": 4, "resources": {"widget": 1}}


@pytest.mark.parametrize("options, match", [
    ({"name": "ps"}, "cannot share the actor name 'ps'"),
    ({"max_restarts": -1}, "cannot restart"),
])
def test_named_and_restartable_members_are_refused(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _resolve_options(orchestra.remote(Plain).options(**options), None, None, None)


def test_only_classes_make_gangs() -> None:
    with pytest.raises(TypeError, match="takes a class"):
        _resolve_options(lambda: None, None, None, None)


def test_capacity_counts_every_member_at_once() -> None:
    _check_capacity("Plain", 4, {"num_gpus": 1}, {"CPU": 2.0, "GPU": 4.0})
    _check_capacity("Plain", 4, {"num_gpus": 0.5}, {"GPU": 2.0})
    with pytest.raises(InfeasibleResourcesError,
                       match=r"a gang of 4 Plain members needs GPU=4 at once, but the cluster "
                             r"has CPU=2, GPU=2"):
        _check_capacity("Plain", 4, {"num_gpus": 1}, {"CPU": 2.0, "GPU": 2.0})
    with pytest.raises(InfeasibleResourcesError, match="CPU=6"):
        _check_capacity("Plain", 3, {"num_gpus": 0, "num_cpus": 2}, {"CPU": 2.0})


@pytest.mark.parametrize("kwargs, match", [
    ({"size": 0}, "size must be an int >= 1"),
    ({"size": True}, "size must be an int >= 1"),
    ({"size": 2, "timeout_s": 0}, "timeout_s must be a positive number"),
    ({"size": 2, "heartbeat_interval_s": float("nan")}, "heartbeat_interval_s"),
    ({"size": 2, "max_missing_heartbeats": 0.5}, "max_missing_heartbeats must be a positive int"),
])
def test_bad_gang_arguments_are_refused_before_anything_starts(kwargs: dict[str, Any],
                                                               match: str) -> None:
    with pytest.raises(ValueError, match=match):
        orchestra.gang(Plain, **kwargs)


def test_constructor_arguments_must_be_a_sequence() -> None:
    with pytest.raises(TypeError, match="args must be a tuple or list"):
        orchestra.gang(Plain, 2, args="abc")


# ------------------------------------------------------------------ the member class

def test_the_member_class_reads_as_the_users_class_and_adds_one_private_method() -> None:
    member = _member_class(Plain)
    assert issubclass(member, Plain)
    assert (member.__name__, member.__qualname__, member.__module__) == (
        Plain.__name__, Plain.__qualname__, Plain.__module__)
    added = set(vars(member)) - {"__init__", "__doc__", "__module__", "__qualname__",
                                 "__dict__", "__weakref__"}
    assert added == {"_orchestra_gang_info"}


# ------------------------------------------------------------------ errors

def test_gang_errors_are_orchestra_errors() -> None:
    for cls in (GangError, GangAbortedError, GangTimeoutError, GangMemberDiedError):
        assert issubclass(cls, OrchestraError) and issubclass(cls, GangError)
    assert issubclass(GangTimeoutError, TimeoutError)


def test_member_died_error_pickles_with_its_fields() -> None:
    err = GangMemberDiedError("member 1 died", members=(1,), actors=("handle-1",), reason="r")
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.members, back.actors, back.reason) == (
        "member 1 died", (1,), ("handle-1",), "r")


# ------------------------------------------------------------------ GangContext over a fake

class FakeClient:
    """The CoordinatorClient calls a GangContext makes, on a dict; ``fail`` makes them raise."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}
        self.barriers: list[tuple[str, float]] = []
        self.fail: CoordinatorError | None = None
        self.aborted_error: CoordinatorAbortedError | None = None

    def key_value_set(self, key: str, value: str | bytes) -> None:
        if self.fail:
            raise self.fail
        self.kv[key] = value.encode() if isinstance(value, str) else value

    def key_value_get(self, key: str, timeout_s: float) -> bytes:
        if self.fail:
            raise self.fail
        if key not in self.kv:
            raise CoordinatorTimeoutError(f"node 1: key {key!r} not set within {timeout_s:g} s")
        return self.kv[key]

    def wait_at_barrier(self, name: str, timeout_s: float) -> None:
        if self.fail:
            raise self.fail
        self.barriers.append((name, timeout_s))


def context(client: FakeClient, member: int = 1, size: int = 4) -> GangContext:
    spec = GangSpec(address="127.0.0.1:5000", size=size, member=member, class_name="Trainer",
                    timeout_s=7.0, heartbeat_interval_s=1.0, max_missing_heartbeats=3,
                    exit_on_abort=False, token="t0k3n")
    return GangContext(spec, client, layout(member, ["h"] * size), (), [member], "h")


def test_a_gang_spec_never_shows_its_token() -> None:
    spec = context(FakeClient())._spec
    assert spec.token == "t0k3n" and "t0k3n" not in repr(spec)


def test_torch_env_reads_member_0s_address_and_gives_strings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra._gang.member import interface_of, local_address_towards
    client = FakeClient()
    client.kv["gang/torch_master"] = b"10.1.2.3:29500"
    env = context(client).torch_env()
    ifname = interface_of(local_address_towards("10.1.2.3"))   # on the route to member 0
    assert env.pop("GLOO_SOCKET_IFNAME", None) == env.pop("NCCL_SOCKET_IFNAME", None) == ifname
    assert env == {
        "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "4",
        "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "0"}
    # Set by the user: left as they are.
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "mine")
    assert "GLOO_SOCKET_IFNAME" not in context(client).torch_env()


def test_jax_kwargs_name_member_0s_service_and_this_process() -> None:
    client = FakeClient()
    client.kv["gang/jax_coordinator"] = b"[::1]:4000"
    assert context(client, member=2).jax_kwargs() == {
        "coordinator_address": "[::1]:4000", "num_processes": 4, "process_id": 2}


def test_user_keys_and_barriers_live_apart_from_orchestras_keys() -> None:
    client = FakeClient()
    ctx = context(client)
    ctx.kv_set("gang/torch_master", "mine")
    assert client.kv == {"user/gang/torch_master": b"mine"}
    assert ctx.kv_get("gang/torch_master") == b"mine"
    ctx.barrier("step")
    ctx.barrier("step", timeout_s=2)
    ctx.barrier("other")
    assert client.barriers == [("user/step/0", 7.0), ("user/step/1", 2.0), ("user/other/0", 7.0)]


def test_an_aborted_gang_raises_gang_aborted_error_naming_the_member() -> None:
    client = FakeClient()
    client.fail = CoordinatorAbortedError("node 1: KeyValueGet: the coordinator aborted the "
                                          "group: node 0 missed heartbeats")
    ctx = context(client)
    with pytest.raises(GangAbortedError, match=r"Trainer gang member 1 of 4: kv_get\('k'\): "
                                               r"the gang was aborted: .*node 0 missed") as info:
        ctx.kv_get("k")
    assert info.value.__cause__ is client.fail
    with pytest.raises(GangAbortedError, match="shut the gang down"):
        ctx.barrier("b")


def test_check_raises_once_the_heartbeat_saw_an_abort() -> None:
    client = FakeClient()
    ctx = context(client)
    ctx.check()
    client.aborted_error = CoordinatorAbortedError("node 3 missed heartbeats")
    with pytest.raises(GangAbortedError, match="check"):
        ctx.check()


def test_a_key_nobody_sets_raises_gang_timeout_error() -> None:
    ctx = context(FakeClient())
    with pytest.raises(GangTimeoutError, match="'user/nccl_id' not set") as info:
        ctx.kv_get("nccl_id", timeout_s=0.5)
    assert isinstance(info.value, TimeoutError)


@pytest.mark.parametrize("key", ["", None, b"bytes"])
def test_keys_must_be_non_empty_strings(key: Any) -> None:
    with pytest.raises(TypeError, match="non-empty strings"):
        context(FakeClient()).kv_set(key, "v")


def test_gang_context_outside_a_member_names_the_remedy() -> None:
    with pytest.raises(GangError, match=r"outside a gang member.*orchestra\.gang"):
        orchestra.gang_context()
