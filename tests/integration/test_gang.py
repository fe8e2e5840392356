"""Gangs on a real local cluster: ranks, topology, rendezvous, the shared key-value store,
death of a member (a crash matrix of how the others learn of it), outsiders (refused by the
gang's coordinator), lifetime, and a real
torch.distributed (gloo) all_reduce between members.

The member classes live in this module: workers import it by name (``test_gang``). GPUs are
ids only (``init(num_gpus=4)``): no GPU is needed. Failure tests use a short heartbeat
(0.2 s x 5), so a dead member aborts its gang within about a second.
"""
from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import orchestra
from _outsider import outsider_attempts
from _probes import Cluster, pid_gone, wait_until
from orchestra import GangAbortedError, GangError, GangMemberDiedError
from orchestra._api import session as _session
from orchestra.exceptions import ActorDiedError, InfeasibleResourcesError

pytestmark = pytest.mark.timeout(60)

T = 30            # seconds: every get here has a deadline, so nothing hangs
ABORT_S = 15      # a dead member must abort the gang well within this (limit: ~1 s)
FAST_HEARTBEAT = {"heartbeat_interval_s": 0.2, "max_missing_heartbeats": 5}
# Where a test asserts that nothing aborts, the limit must outlast a loaded machine's pauses
# (a 2-core CI runner starved every member's heartbeat thread for ~1 s once).
CALM_HEARTBEAT = {"heartbeat_interval_s": 0.25, "max_missing_heartbeats": 16}
CALM_LIMIT_S = 0.25 * 16


def get(refs: Any, timeout: float = T) -> Any:
    return orchestra.get(refs, timeout=timeout)


# ------------------------------------------------------------------ member classes

class Member:
    """A member that reports what the gang told it and uses the gang's services."""

    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.rank_in_init = orchestra.gang_context().rank   # the context exists in __init__

    def describe(self) -> dict[str, Any]:
        ctx = orchestra.gang_context()
        return {"tag": self.tag, "rank_in_init": self.rank_in_init, "rank": ctx.rank,
                "world_size": ctx.world_size, "local_rank": ctx.local_rank,
                "local_world_size": ctx.local_world_size, "node_rank": ctx.node_rank,
                "num_nodes": ctx.num_nodes, "gpu_ids": list(ctx.gpu_ids),
                "get_gpu_ids": orchestra.get_gpu_ids(),
                "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "topology": [(d.global_device_id, d.member, d.local_device_ordinal, d.name)
                             for d in ctx.topology],
                "local_devices": [d.global_device_id for d in ctx.local_devices]}

    def rendezvous(self) -> dict[str, Any]:
        ctx = orchestra.gang_context()
        return {"torch": ctx.torch_env(), "jax": ctx.jax_kwargs()}

    def share(self, key: str) -> list[bytes]:
        """Rank 0 publishes a value; every member reads it after a barrier."""
        ctx = orchestra.gang_context()
        if ctx.rank == 0:
            ctx.kv_set(key, b"nccl-unique-id:" + os.urandom(8).hex().encode())
        ctx.kv_set(f"{key}/from/{ctx.rank}", str(ctx.rank))
        ctx.barrier("shared")
        ctx.barrier("shared")   # a barrier name may be reused
        return [ctx.kv_get(key, timeout_s=10)] + [ctx.kv_get(f"{key}/from/{r}", timeout_s=10)
                                                  for r in range(ctx.world_size)]

    def pid(self) -> int:
        return os.getpid()

    def barrier(self, name: str, timeout_s: float) -> str:
        orchestra.gang_context().barrier(name, timeout_s=timeout_s)
        return "passed"

    def kv_get(self, key: str, timeout_s: float) -> bytes:
        return orchestra.gang_context().kv_get(key, timeout_s=timeout_s)

    def sleep(self, seconds: float) -> str:
        """Makes no gang call: only exit_on_abort can end it early."""
        time.sleep(seconds)
        return "slept"


class FailsInInit:
    def __init__(self, bad_rank: int) -> None:
        if orchestra.gang_context().rank == bad_rank:
            raise ValueError(f"constructor of rank {bad_rank} failed")

    def barrier(self, name: str, timeout_s: float) -> str:
        orchestra.gang_context().barrier(name, timeout_s=timeout_s)
        return "passed"


class Blocker:
    """Holds GPU ids so that some members of a gang wait for resources: the gang stays forming."""

    def ping(self) -> str:
        return "pong"


@pytest.fixture
def gpu_cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    """A cluster of the test's own with 4 GPU ids, no real GPU needed."""
    return start_cluster(num_cpus=1, num_gpus=4)


class _Four:
    """One gang of 4 ``Member(tag="t")`` with one GPU id each, for the tests that only read
    from a healthy gang (forming one costs seconds on 2 cores). Started by the first test
    that asks, inside that test (after conftest stopped the shared cluster); started again
    if another test's cluster replaced its session."""

    gang: orchestra.Gang | None = None
    session: Any = None


@pytest.fixture
def four() -> orchestra.Gang:
    if _Four.gang is None or _Four.session is None or _session._session is not _Four.session:
        orchestra.shutdown()
        orchestra.init(num_cpus=1, num_gpus=4)
        _Four.session = _session._session
        _Four.gang = orchestra.gang(Member, 4, args=("t",), num_gpus=1)
    return _Four.gang


@pytest.fixture(scope="module", autouse=True)
def _stop_four_at_module_end() -> Iterator[None]:
    yield
    if _Four.session is not None and _session._session is _Four.session:
        orchestra.shutdown()
    _Four.gang = _Four.session = None


def refused(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


# ------------------------------------------------------------------ ranks and topology

def test_members_get_ranks_0_to_n_minus_1_and_the_world_size(four):
    got = get(four.call("describe"))
    assert [d["rank"] for d in got] == [0, 1, 2, 3]          # rank = index in gang.actors
    assert [d["rank_in_init"] for d in got] == [0, 1, 2, 3]
    assert {d["world_size"] for d in got} == {4}
    assert {d["tag"] for d in got} == {"t"}
    # One host: one node, local ranks are the ranks.
    assert [(d["node_rank"], d["num_nodes"], d["local_rank"], d["local_world_size"])
            for d in got] == [(0, 1, r, 4) for r in range(4)]


def test_each_member_reports_the_gpus_orchestra_gave_it(four):
    got = get(four.call("describe"))
    assert sorted(d["gpu_ids"][0] for d in got) == [0, 1, 2, 3]
    for d in got:
        assert d["gpu_ids"] == d["get_gpu_ids"] and len(d["gpu_ids"]) == 1
        assert d["cuda"] == str(d["gpu_ids"][0])


def test_topology_numbers_devices_in_member_order_then_local_ordinal(four):
    got = get(four.call("describe"))
    expected = [(m, m, 0, f"GPU {got[m]['gpu_ids'][0]}") for m in range(4)]
    for d in got:
        assert d["topology"] == expected                        # the same on every member
        assert d["local_devices"] == [d["rank"]]


# ------------------------------------------------------------------ rendezvous and KV

def test_torch_env_and_jax_kwargs_point_every_member_at_rank_0(four):
    got = get(four.call("rendezvous"))
    torch_envs = [r["torch"] for r in got]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in torch_envs} == {
        (torch_envs[0]["MASTER_ADDR"], torch_envs[0]["MASTER_PORT"])}
    assert torch_envs[0]["MASTER_ADDR"] == "127.0.0.1"      # the coordinator is on loopback
    assert 0 < int(torch_envs[0]["MASTER_PORT"]) < 65536
    for rank, env in enumerate(torch_envs):
        assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                    "NODE_RANK")} == {
            "RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "0"}
        assert all(isinstance(v, str) for v in env.values())
    jax = [r["jax"] for r in got]
    assert [j["process_id"] for j in jax] == [0, 1, 2, 3]
    assert {j["num_processes"] for j in jax} == {4}
    assert len({j["coordinator_address"] for j in jax}) == 1
    assert jax[0]["coordinator_address"].startswith("127.0.0.1:")
    assert jax[0]["coordinator_address"] != f"127.0.0.1:{torch_envs[0]['MASTER_PORT']}"


def test_a_value_set_by_one_member_is_read_by_all(four):
    got = get(four.call("share", "nccl_id"))
    assert len({values[0] for values in got}) == 1 and got[0][0].startswith(b"nccl-unique-id:")
    for values in got:
        assert values[1:] == [b"0", b"1", b"2", b"3"]


def test_kv_get_of_a_key_nobody_sets_times_out_naming_the_key(four):
    with pytest.raises(TimeoutError, match="no-such-key"):
        get(four[0].kv_get.remote("no-such-key", 0.2))


def test_a_gang_larger_than_the_cluster_is_refused_before_starting(four):
    with pytest.raises(InfeasibleResourcesError, match="needs GPU=5"):
        orchestra.gang(Member, 5, num_gpus=1)


def test_gang_context_outside_a_member_raises():
    with pytest.raises(GangError, match="outside a gang member"):
        orchestra.gang_context()


# ------------------------------------------------------------------ clusters of their own

def test_topology_of_multi_gpu_members_counts_local_ordinals_within_a_member(gpu_cluster):
    with orchestra.gang(Member, 2, num_gpus=2) as g:
        got = get(g.call("describe"))
    ids = [d["gpu_ids"] for d in got]
    assert got[0]["topology"] == [(0, 0, 0, f"GPU {ids[0][0]}"), (1, 0, 1, f"GPU {ids[0][1]}"),
                                  (2, 1, 0, f"GPU {ids[1][0]}"), (3, 1, 1, f"GPU {ids[1][1]}")]
    assert [d["local_devices"] for d in got] == [[0, 1], [2, 3]]


# ------------------------------------------------------------------ failures

def test_a_killed_member_aborts_the_others_naming_it(gpu_cluster):
    victim = 1
    with orchestra.gang(Member, 3, num_gpus=1, **FAST_HEARTBEAT) as g:
        pids = [info["pid"] for info in g.wait_ready(timeout_s=T)]
        waiting = [g[m].barrier.remote("never", 60) for m in range(3) if m != victim]
        os.kill(pids[victim], signal.SIGKILL)
        for ref in waiting:     # the barrier would wait 60 s: the abort ends it first
            with pytest.raises(GangAbortedError, match=f"node {victim} missed heartbeats"):
                get(ref, timeout=ABORT_S)
        assert g.dead_members() == [victim]
        with pytest.raises(GangMemberDiedError, match=f"member {victim} ") as info:
            g.check()
        assert info.value.members == (victim,)
        assert info.value.actors == (g[victim],)
        with pytest.raises(ActorDiedError):
            get(g[victim].pid.remote())


def test_with_exit_on_abort_the_other_members_exit(gpu_cluster):
    victim = 2
    with orchestra.gang(Member, 3, num_gpus=1, exit_on_abort=True, **FAST_HEARTBEAT) as g:
        pids = [info["pid"] for info in g.wait_ready(timeout_s=T)]
        sleeping = [g[m].sleep.remote(60) for m in range(3) if m != victim]
        os.kill(pids[victim], signal.SIGKILL)
        for ref in sleeping:
            with pytest.raises(ActorDiedError):
                get(ref, timeout=ABORT_S)
        assert g.dead_members() == [victim]
        for pid in pids:
            wait_until(lambda pid=pid: pid_gone(pid), 10, f"member pid {pid} gone")


def test_a_failing_constructor_aborts_the_gang(gpu_cluster):
    bad = 2
    with orchestra.gang(FailsInInit, 3, args=(bad,), num_gpus=1, **FAST_HEARTBEAT) as g:
        waiting = [g[m].barrier.remote("never", 60) for m in range(3) if m != bad]
        for ref in waiting:
            with pytest.raises(GangAbortedError, match=f"node {bad} missed heartbeats"):
                get(ref, timeout=ABORT_S)
        with pytest.raises(ActorDiedError, match=f"constructor of rank {bad} failed"):
            get(g[bad].barrier.remote("x", 1))
        with pytest.raises(GangMemberDiedError, match=f"member {bad} "):
            g.wait_ready(timeout_s=T)
        assert g.dead_members() == [bad]


@pytest.mark.parametrize("options, match", [
    ({"name": "solo"}, "actor name"), ({"max_restarts": 2}, "cannot restart")])
def test_named_or_restartable_actor_classes_are_refused(options, match):
    cls = orchestra.remote(Member).options(**options)
    with pytest.raises(ValueError, match=match):
        orchestra.gang(cls, 2)


# ------------------------------------------------------------------ outsiders

def test_an_outsider_can_neither_join_read_write_nor_abort_a_forming_or_running_gang(
        gpu_cluster):
    blocker = orchestra.remote(num_gpus=2)(Blocker).remote()
    assert get(blocker.ping.remote()) == "pong"
    with orchestra.gang(Member, 3, args=("t",), num_gpus=1, **CALM_HEARTBEAT) as g:
        state = g._coordinator.state
        # Forming: two members wait in Connect, the third waits for the blocker's GPUs.
        wait_until(lambda: len(state.clients()) == 2, T, "two members in the Connect barrier")
        waiting = state.clients()
        (missing,) = set(range(3)) - set(waiting)
        refused = outsider_attempts(g.address, g._coordinator.session_id, missing)
        assert refused == {key: "UNAUTHENTICATED" for key in refused}
        assert state.clients() == waiting and not state.session_started
        # Running: the last member starts; an outsider claiming a healthy member gets nowhere.
        orchestra.kill(blocker)
        g.wait_ready(timeout_s=T)
        refused = outsider_attempts(g.address, g._coordinator.session_id, 1)
        assert refused == {key: "UNAUTHENTICATED" for key in refused}
        time.sleep(CALM_LIMIT_S + 0.5)   # past the heartbeat limit: no delayed abort either
        torch_envs = [r["torch"] for r in get(g.call("rendezvous"))]
        assert {e["MASTER_ADDR"] for e in torch_envs} == {"127.0.0.1"}
        got = get(g.call("share", "nccl_id"))
        assert len({values[0] for values in got}) == 1
        g.check()                                   # healthy: no member is blamed
        assert g.dead_members() == [] and state.aborted_reason is None


def test_the_gang_secret_is_in_no_process_command_line(gpu_cluster):
    with orchestra.gang(Member, 2, num_gpus=1) as g:
        g.wait_ready(timeout_s=T)
        token = g._coordinator.token
        assert token
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue   # gone meanwhile
            assert token.encode() not in cmdline, f"pid {pid}"


# ------------------------------------------------------------------ lifetime

def test_shutdown_kills_the_members_and_stops_the_coordinator(gpu_cluster):
    g = orchestra.gang(Member, 2, num_gpus=1)
    pids = [info["pid"] for info in g.wait_ready(timeout_s=T)]
    g.shutdown()
    g.shutdown()   # idempotent
    for pid in pids:
        wait_until(lambda pid=pid: pid_gone(pid), 10, f"member pid {pid} gone")
    assert refused(g.address)
    with pytest.raises(GangError, match="shut down"):
        g.check()
    wait_until(lambda: orchestra.available_resources().get("GPU") == 4.0, 10, "GPUs returned")


def test_orchestra_shutdown_stops_the_coordinators_of_live_gangs(gpu_cluster):
    g = orchestra.gang(Member, 2, num_gpus=1)
    g.wait_ready(timeout_s=T)
    orchestra.shutdown()
    assert refused(g.address)
    with pytest.raises(GangError, match="shut down"):
        g.check()


def test_an_actor_class_keeps_its_options_and_gang_arguments_win(gpu_cluster):
    cls = orchestra.remote(num_gpus=2)(Member)
    with orchestra.gang(cls, 2) as g:
        assert [len(d["gpu_ids"]) for d in get(g.call("describe"))] == [2, 2]
    with orchestra.gang(cls, 2, num_gpus=1) as g:
        assert [len(d["gpu_ids"]) for d in get(g.call("describe"))] == [1, 1]


# A real client, torch.distributed over gloo between four members, is the gang example's
# test (test_examples.py::test_gang_allreduce_sums_over_four_members; three hosts:
# test_cluster_netns.py): the same all_reduce, run once.
