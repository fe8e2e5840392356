"""Placement groups on a real cluster: bundles reserved, tasks and actors run in them,
removal, bad input; and on a cluster of joined nodes, STRICT_SPREAD over distinct
nodes and a group that waits for a node to join. (Decisions in detail:
tests/unit/test_pg_state.py.)"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

import _helpers as h
import orchestra
from _helpers import joined_cluster
from orchestra.exceptions import ActorDiedError, InfeasibleResourcesError, TaskCancelledError
from orchestra.util import (
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from orchestra.util.scheduling_strategies import PlacementGroupSchedulingStrategy

pytestmark = pytest.mark.timeout(90)

T = 30


def in_pg(pg, index: int = -1, capture: bool | None = None) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index,
                                            placement_group_capture_child_tasks=capture)


@pytest.fixture
def groups(cluster) -> Iterator[list]:
    """Groups a test makes: removed at its end, so the shared cluster is whole again."""
    made: list = []
    yield made
    for pg in made:
        remove_placement_group(pg)


@orchestra.remote
def where() -> dict:
    ctx = orchestra.get_runtime_context()
    return {"node": ctx.get_node_id(), "gpus": orchestra.get_gpu_ids()}


@orchestra.remote
def sleeper(path: str) -> str:
    h.touch(path)
    time.sleep(60)
    return "done"


@orchestra.remote(resources={"widget": 1})
def needs_widget() -> str:
    return "widget"


@orchestra.remote(num_cpus=0)
def spawn_widget_task() -> str:
    return orchestra.get(needs_widget.remote(), timeout=T)


@orchestra.remote
class Pinned:
    def ping(self) -> str:
        return "pong"


# ------------------------------------------------------------------ one node

def test_a_group_reserves_its_bundles_and_tasks_run_in_them(groups):
    before = orchestra.available_resources()["CPU"]
    pg = placement_group([{"CPU": 1}], strategy="PACK", name="one")
    groups.append(pg)
    assert orchestra.get(pg.ready(), timeout=T) is True
    assert pg.wait(5)
    assert orchestra.available_resources()["CPU"] == before - 1
    row = placement_group_table(pg)
    assert row["state"] == "CREATED" and row["bundles"] == {0: {"CPU": 1.0}}
    got = orchestra.get(where.options(scheduling_strategy=in_pg(pg, 0)).remote(), timeout=T)
    assert got["node"] == row["bundles_to_node_id"][0]
    assert get_placement_group("one") == pg
    assert pg.id.hex() in placement_group_table()


def test_ray_s_older_placement_group_option_is_accepted(groups):
    pg = placement_group([{"CPU": 1}])
    groups.append(pg)
    ref = h.add.options(placement_group=pg, placement_group_bundle_index=0).remote(1, 2)
    assert orchestra.get(ref, timeout=T) == 3


def test_removing_a_group_gives_its_resources_back(cluster):
    before = orchestra.available_resources()
    pg = placement_group([{"CPU": 1}, {"widget": 1}])
    orchestra.get(pg.ready(), timeout=T)
    remove_placement_group(pg)
    deadline = time.monotonic() + T
    while orchestra.available_resources() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert orchestra.available_resources() == before
    assert placement_group_table(pg)["state"] == "REMOVED"


def test_a_group_that_does_not_fit_now_waits_and_is_placed_once_resources_free(groups):
    big = placement_group([{"CPU": 2}])
    orchestra.get(big.ready(), timeout=T)
    small = placement_group([{"CPU": 1}])
    groups.append(small)
    assert not small.wait(0.5)
    assert placement_group_table(small)["state"] == "PENDING"
    remove_placement_group(big)
    assert small.wait(T)


def test_a_gpu_bundle_hands_its_task_gpu_ids(groups):
    pg = placement_group([{"CPU": 1, "GPU": 1}])
    groups.append(pg)
    got = orchestra.get(where.options(num_gpus=1, scheduling_strategy=in_pg(pg, 0)).remote(), timeout=T)
    assert len(got["gpus"]) == 1


def test_an_actor_in_a_group_is_killed_when_the_group_is_removed(cluster):
    pg = placement_group([{"CPU": 1}])
    a = Pinned.options(num_cpus=1, scheduling_strategy=in_pg(pg, 0)).remote()
    assert orchestra.get(a.ping.remote(), timeout=T) == "pong"
    remove_placement_group(pg)
    with pytest.raises(ActorDiedError, match="placement group"):
        for _ in range(100):
            orchestra.get(a.ping.remote(), timeout=T)
            time.sleep(0.05)


def test_a_task_running_in_a_removed_group_is_killed(cluster, tmp_path):
    pg = placement_group([{"CPU": 1}])
    started = tmp_path / "started"
    ref = sleeper.options(scheduling_strategy=in_pg(pg, 0), max_retries=3).remote(str(started))
    h.wait_for_file(started)
    remove_placement_group(pg)
    with pytest.raises(TaskCancelledError, match="placement group .* was removed"):
        orchestra.get(ref, timeout=T)


def test_children_of_a_capturing_task_run_in_its_group(groups):
    # The bundle holds the cluster's only widget: a child asking for it runs only if it
    # is captured into the bundle (outside, none is free, and it would wait).
    pg = placement_group([{"CPU": 1, "widget": 1}])
    groups.append(pg)
    ref = spawn_widget_task.options(scheduling_strategy=in_pg(pg, 0, capture=True)).remote()
    assert orchestra.get(ref, timeout=T) == "widget"


# ------------------------------------------------------------------ bad input

def test_a_bundle_no_node_can_hold_is_refused_naming_it(cluster):
    with pytest.raises(InfeasibleResourcesError, match=r"bundle 1 \(CPU=64\)"):
        placement_group([{"CPU": 1}, {"CPU": 64}])


def test_strict_spread_over_more_bundles_than_nodes_is_refused_on_a_private_cluster(cluster):
    with pytest.raises(InfeasibleResourcesError, match="distinct nodes"):
        placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")


@pytest.mark.parametrize("bundles, strategy, match", [
    ([], "PACK", "non-empty list"),
    ([{"CPU": -1}], "PACK", "finite number >= 0"),
    ([{"CPU": 0}], "PACK", "reserves nothing"),
    ([{"CPU": 1}], "TIGHT", "use one of PACK"),
])
def test_bad_groups_are_refused_at_the_call(cluster, bundles, strategy, match):
    with pytest.raises(ValueError, match=match):
        placement_group(bundles, strategy=strategy)


def test_a_bundle_index_past_the_group_is_refused_at_once(groups):
    pg = placement_group([{"CPU": 1}])
    groups.append(pg)
    with pytest.raises(ValueError, match="has 1 bundles"):
        in_pg(pg, 1)


def test_a_task_larger_than_its_bundle_fails_naming_the_bundle(groups):
    pg = placement_group([{"CPU": 1}])
    groups.append(pg)
    with pytest.raises(InfeasibleResourcesError, match="bundle 0"):
        orchestra.get(h.add.options(num_cpus=2, scheduling_strategy=in_pg(pg, 0)).remote(1, 1), timeout=T)


def test_a_detached_group_is_accepted_on_a_private_cluster(groups):
    pg = placement_group([{"CPU": 1}], lifetime="detached")
    groups.append(pg)
    assert pg.wait(T)
    assert placement_group_table(pg)["stats"]["lifetime"] == "detached"


def test_a_taken_group_name_is_refused(groups):
    groups.append(placement_group([{"CPU": 1}], name="taken"))
    with pytest.raises(ValueError, match="named 'taken' exists"):
        placement_group([{"CPU": 1}], name="taken")


# ------------------------------------------------------------------ several nodes

def test_strict_spread_on_joined_nodes_puts_each_bundle_and_its_task_on_a_node_of_its_own():
    with joined_cluster({"num_cpus": 1}, {"num_cpus": 1}, {"num_cpus": 1}) as (c, *_):
        pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
        assert pg.wait(T)
        nodes = placement_group_table(pg)["bundles_to_node_id"]
        assert len(set(nodes.values())) == 3
        refs = [where.options(scheduling_strategy=in_pg(pg, i)).remote() for i in range(3)]
        assert [r["node"] for r in orchestra.get(refs, timeout=T)] == [nodes[i] for i in range(3)]
        # STRICT_PACK of two whole nodes cannot fit one: it waits (nodes may join), warned.
        with pytest.warns(RuntimeWarning, match="bundles on one node"):
            packed = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_PACK")
            assert not packed.wait(1)
        remove_placement_group(packed)
        remove_placement_group(pg)


def test_a_group_no_node_holds_waits_until_a_node_that_holds_it_joins():
    with joined_cluster({"num_cpus": 1}) as (c,):
        with pytest.warns(RuntimeWarning, match=r"bundle 0 \(CPU=1, gadget=1\)"):
            pg = placement_group([{"CPU": 1, "gadget": 1}])
            assert not pg.wait(0.5)
        c.add_node(num_cpus=1, resources={"gadget": 1})
        assert pg.wait(T)
        got = orchestra.get(where.options(scheduling_strategy=in_pg(pg, 0)).remote(), timeout=T)
        assert got["node"] == placement_group_table(pg)["bundles_to_node_id"][0]
        assert os.getpid() > 0
