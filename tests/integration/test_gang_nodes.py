"""Gangs over the nodes of a cluster on this machine (orchestra.cluster_utils.Cluster):
members fill a node before the next (or are dealt out, spread=True), node and local
ranks follow the nodes, the coordinator listens where every member reaches it, and a
node's death aborts its gang as a member's death does. A torch all_reduce over members
on three namespaced hosts: test_cluster_netns.py."""
from __future__ import annotations

import time

import pytest

import orchestra
from _helpers import joined_cluster
from orchestra.exceptions import GetTimeoutError


@pytest.fixture(scope="module")
def nodes3():
    with joined_cluster({"num_cpus": 2}, {"num_cpus": 2}, {"num_cpus": 2}) as nodes:
        yield nodes


class Member:
    def where(self) -> dict:
        ctx = orchestra.gang_context()
        return {"rank": ctx.rank, "node": orchestra.get_runtime_context().get_node_id(),
                "node_rank": ctx.node_rank, "num_nodes": ctx.num_nodes,
                "local_rank": ctx.local_rank, "local_world_size": ctx.local_world_size,
                "master": ctx.torch_env()["MASTER_ADDR"]}


def _layout(g) -> list[dict]:
    return orchestra.get(g.call("where"), timeout=60)


def _all_free(cpus: float) -> None:
    """A gang shut down gives its CPUs back once its members' processes are gone."""
    deadline = time.monotonic() + 30
    while orchestra.available_resources().get("CPU", 0) < cpus and time.monotonic() < deadline:
        time.sleep(0.05)


def test_members_fill_a_node_before_the_next_and_ranks_follow_the_nodes(nodes3):
    c, a, b = nodes3
    _all_free(6)
    head = orchestra.get_runtime_context().get_node_id()
    g = orchestra.gang(Member, 4, num_cpus=1, num_gpus=0, timeout_s=60)
    try:
        got = _layout(g)
    finally:
        g.shutdown()
    assert [m["node"] for m in got[:2]] == [head, head]
    assert got[2]["node"] == got[3]["node"] != head
    assert [m["node_rank"] for m in got] == [0, 0, 1, 1]
    assert [m["local_rank"] for m in got] == [0, 1, 0, 1]
    assert {m["num_nodes"] for m in got} == {2} and {m["local_world_size"] for m in got} == {2}


def test_spread_deals_members_out_over_the_nodes(nodes3):
    c, a, b = nodes3
    _all_free(6)
    g = orchestra.gang(Member, 3, num_cpus=1, num_gpus=0, spread=True, timeout_s=60)
    try:
        got = _layout(g)
    finally:
        g.shutdown()
    assert len({m["node"] for m in got}) == 3
    assert [m["node_rank"] for m in got] == [0, 1, 2]
    assert {m["num_nodes"] for m in got} == {3}


def test_a_nodes_death_aborts_its_gang():
    with joined_cluster({"num_cpus": 1}, {"num_cpus": 1}) as (c, victim):
        g = orchestra.gang(Member, 2, num_cpus=1, num_gpus=0, spread=True, timeout_s=60,
                           heartbeat_interval_s=0.5, max_missing_heartbeats=4)
        got = _layout(g)
        assert got[1]["node"] == victim.node_id
        c.remove_node(victim, allow_graceful=False)
        deadline = time.monotonic() + 30
        while not g.dead_members() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert g.dead_members() == [1]
        with pytest.raises(orchestra.GangMemberDiedError, match="member 1"):
            g.check()
        with pytest.raises((orchestra.exceptions.ActorDiedError, GetTimeoutError)):
            orchestra.get(g[1].where.remote(), timeout=30)
        g.shutdown()
