"""Placement groups in the scheduler: bundles reserved on nodes, tasks and actors in them.
No processes: a SchedulerState with one or more nodes (tests/unit/_sched_helpers), driven
by its events."""
from __future__ import annotations

import pickle
from typing import Any

import pytest

from _sched_helpers import DRIVER, Nodes, executed, executes, make_call, pushes, rid, sent, worker_conn
from orchestra._objects.errors import make_error
from orchestra._proto import types_pb2
from orchestra._scheduler.data import ERROR, INLINE
from orchestra._scheduler.events import Hello
from orchestra._scheduler.groups import READY_SUFFIX, GroupSpec, place_bundles
from orchestra._scheduler.instructions import KillWorker, Warn
from orchestra.exceptions import InfeasibleResourcesError, TaskCancelledError

pytestmark = pytest.mark.timeout(10)

_gids = iter(range(1, 10**6))


def cluster(nodes: dict[int, dict[str, float]], **kw: Any) -> Nodes:
    return Nodes(nodes, error_factory=make_error, **kw)


def group(c: Nodes, bundles: list[dict[str, float]], strategy: str = "PACK", *, name: str = "",
          conn: int = DRIVER, detached: bool = False) -> bytes:
    """Create a group (raises as the head's request would); its id."""
    gid = next(_gids).to_bytes(12, "big")
    spec = GroupSpec(gid, tuple(bundles), strategy, name, detached)
    c.s.groups.create(conn, spec)
    c.s.schedule()
    return gid


def in_group(gid: bytes, index: int = -1, capture: bool = False) -> Any:
    return types_pb2.Placement(strategy="PLACEMENT_GROUP", group_id=gid, bundle_index=index,
                               capture_child_tasks=capture)


def bundle_nodes(c: Nodes, gid: bytes) -> list[int | None]:
    return c.s.groups.groups[gid].nodes


def error(out: list[Any], oid: bytes) -> BaseException:
    data = pushes(out)[oid]
    assert data.kind == ERROR
    return pickle.loads(data.payload)


# ------------------------------------------------------------------ strategies (pure)

def test_pack_puts_every_bundle_on_one_node_when_one_holds_them():
    assert place_bundles("PACK", [{"CPU": 1}, {"CPU": 1}], {0: {"CPU": 2}, 2: {"CPU": 4}}) == {0: 0, 1: 0}


def test_pack_uses_more_nodes_when_no_single_one_holds_them():
    where = place_bundles("PACK", [{"CPU": 2}, {"CPU": 2}], {0: {"CPU": 2}, 2: {"CPU": 2}})
    assert where is not None and sorted(where.values()) == [0, 2]


def test_strict_pack_waits_rather_than_split():
    assert place_bundles("STRICT_PACK", [{"CPU": 2}, {"CPU": 2}], {0: {"CPU": 2}, 2: {"CPU": 2}}) is None


def test_spread_puts_bundles_on_different_nodes_when_they_fit():
    where = place_bundles("SPREAD", [{"CPU": 1}] * 2, {0: {"CPU": 4}, 2: {"CPU": 4}})
    assert where is not None and sorted(where.values()) == [0, 2]


def test_spread_doubles_up_when_nodes_run_out():
    where = place_bundles("SPREAD", [{"CPU": 1}] * 3, {0: {"CPU": 4}, 2: {"CPU": 4}})
    assert where is not None and sorted(where.values()) == [0, 0, 2]


def test_strict_spread_needs_a_node_per_bundle():
    assert place_bundles("STRICT_SPREAD", [{"CPU": 1}] * 3, {0: {"CPU": 4}, 2: {"CPU": 4}}) is None
    where = place_bundles("STRICT_SPREAD", [{"CPU": 1}] * 2, {0: {"CPU": 4}, 2: {"CPU": 4}})
    assert where is not None and sorted(where.values()) == [0, 2]


def test_strict_spread_searches_past_a_first_choice_that_strands_a_big_bundle():
    where = place_bundles("STRICT_SPREAD", [{"CPU": 1}, {"CPU": 4}], {0: {"CPU": 4}, 2: {"CPU": 1}})
    assert where == {0: 2, 1: 0}


# ------------------------------------------------------------------ reservation

def test_a_group_takes_its_bundles_from_the_free_pool_and_its_ready_object_resolves():
    c = cluster({0: {"CPU": 4}})
    gid = group(c, [{"CPU": 1}, {"CPU": 2}])
    assert bundle_nodes(c, gid) == [0, 0]
    assert c.s.nodes[0].resources.free["CPU"] == 1
    ready = pushes(c.take())[gid + READY_SUFFIX]
    assert ready.kind == INLINE
    assert c.available()["CPU"] == 1


def test_a_creation_made_again_reserves_nothing_more_and_its_caller_holds_the_ready_object():
    """The same request again (a driver that did not hear the answer of a head that
    died, _runtime/verbs.py): the group is not made twice, another spec under its id
    is refused, and the caller holds its ready object once."""
    c = cluster({0: {"CPU": 4}})
    c.s.client_connected(7, Hello(kind="driver", pid=7))
    gid = group(c, [{"CPU": 1}], name="g", detached=True)
    c.take()
    spec = c.s.groups.groups[gid].spec
    for _ in range(2):
        c.s.groups.create(7, GroupSpec(*spec))
    assert c.s.nodes[0].resources.free["CPU"] == 3 and len(c.s.groups.groups) == 1
    assert c.s.clients[7].holds[gid + READY_SUFFIX] == 1
    with pytest.raises(ValueError, match="exists already"):
        c.s.groups.create(7, spec._replace(bundles=({"CPU": 2},)))


def test_a_task_in_a_bundle_runs_on_its_node_and_holds_the_bundle_not_the_free_pool():
    c = cluster({0: {"CPU": 2}, 2: {"CPU": 2}})
    gid = group(c, [{"CPU": 1}], "PACK")
    node = bundle_nodes(c, gid)[0]
    c.take()
    free_cpu = c.s.nodes[node].resources.free["CPU"]
    c.submit(make_call("f", placement=in_group(gid, 0)))
    out = c.take()
    assert c.ran_on(out) == [node]
    assert c.s.nodes[node].resources.free["CPU"] == free_cpu   # the free pool is untouched


def test_a_second_task_waits_for_its_full_bundle_though_the_node_has_free_cpus():
    c = cluster({0: {"CPU": 4}}, pipeline_depth=1)
    gid = group(c, [{"CPU": 1}])
    c.take()
    first = c.submit(make_call("f", placement=in_group(gid, 0)))
    c.submit(make_call("f", placement=in_group(gid, 0)))
    out = c.take()
    [(wid, tid)] = executed(out)
    assert tid == first.task_id
    c.done(wid, first)
    assert len(executed(c.take())) == 1


def test_a_task_without_resources_runs_in_its_bundle():
    c = cluster({0: {"CPU": 2}, 2: {"CPU": 2}})
    gid = group(c, [{"CPU": 2}], "STRICT_PACK")
    node = bundle_nodes(c, gid)[0]
    c.take()
    c.submit(make_call("f", cpus=0, placement=in_group(gid, 0)))
    assert c.ran_on(c.take()) == [node]


def test_strict_spread_bundles_land_on_distinct_nodes_and_tasks_follow_them():
    c = cluster({0: {"CPU": 2}, 2: {"CPU": 2}})
    gid = group(c, [{"CPU": 1}, {"CPU": 1}], "STRICT_SPREAD")
    nodes = bundle_nodes(c, gid)
    assert sorted(nodes) == [0, 2]   # type: ignore[type-var]
    c.take()
    c.submit(make_call("a", placement=in_group(gid, 0)))
    c.submit(make_call("b", placement=in_group(gid, 1)))
    assert c.ran_on(c.take()) == nodes


def test_a_group_waits_for_resources_tasks_hold_and_is_placed_when_they_end():
    c = cluster({0: {"CPU": 2}})
    t = c.submit(make_call("busy", cpus=2))
    [(wid, _)] = executed(c.take())
    gid = group(c, [{"CPU": 2}])
    assert bundle_nodes(c, gid) == [None]
    assert gid + READY_SUFFIX not in pushes(c.take())
    c.done(wid, t)
    assert bundle_nodes(c, gid) == [0]
    assert gid + READY_SUFFIX in pushes(c.take())


# ------------------------------------------------------------------ bad input

def test_a_bundle_no_node_can_hold_is_refused_at_once_naming_it():
    c = cluster({0: {"CPU": 2}})
    with pytest.raises(InfeasibleResourcesError, match=r"bundle 1 \(CPU=8\)"):
        group(c, [{"CPU": 1}, {"CPU": 8}])
    assert c.s.groups.groups == {} and c.s.nodes[0].resources.free["CPU"] == 2


def test_strict_spread_over_more_bundles_than_nodes_is_refused_on_a_private_cluster():
    c = cluster({0: {"CPU": 4}})
    with pytest.raises(InfeasibleResourcesError, match="2 distinct nodes"):
        group(c, [{"CPU": 1}, {"CPU": 1}], "STRICT_SPREAD")


def test_on_a_joinable_cluster_an_infeasible_group_waits_with_a_warning_until_a_node_joins():
    c = cluster({0: {"CPU": 2}}, joinable=True)
    gid = group(c, [{"CPU": 8}])
    [warning] = sent(c.take(), Warn, DRIVER)
    assert "bundle 0 (CPU=8)" in warning.text
    c.s.add_node(2, {"CPU": 8}, num_workers=0, max_workers=8)
    c.s.schedule()
    assert bundle_nodes(c, gid) == [2]


def test_a_taken_group_name_is_refused():
    c = cluster({0: {"CPU": 4}})
    group(c, [{"CPU": 1}], name="g")
    with pytest.raises(ValueError, match="named 'g' exists"):
        group(c, [{"CPU": 1}], name="g")


def test_a_task_asking_more_than_its_bundle_holds_fails_naming_the_bundle():
    c = cluster({0: {"CPU": 4}})
    gid = group(c, [{"CPU": 1}])
    t = c.submit(make_call("big", cpus=2, placement=in_group(gid, 0)))
    exc = error(c.take(), rid(t))
    assert isinstance(exc, InfeasibleResourcesError) and "bundle 0" in str(exc)


# ------------------------------------------------------------------ removal

def test_removing_a_group_kills_its_running_tasks_fails_queued_ones_and_frees_the_bundles():
    c = cluster({0: {"CPU": 4}}, pipeline_depth=1)
    gid = group(c, [{"CPU": 1}])
    c.take()
    running = c.submit(make_call("run", placement=in_group(gid, 0), max_retries=3))
    queued = c.submit(make_call("queued", placement=in_group(gid, 0)))
    [(wid, _)] = executed(c.take())
    c.s.groups.remove(gid)
    out = c.take()
    assert [k for k in out if type(k) is KillWorker and k.worker_id == wid]
    assert isinstance(error(out, rid(queued)), TaskCancelledError)
    assert c.s.nodes[0].resources.free["CPU"] == 4
    assert not [k for k in c.s.nodes[0].resources.total if "_group_" in k]
    c.s.client_disconnected(worker_conn(wid), "killed")
    exc = error(c.take(), rid(running))
    assert isinstance(exc, TaskCancelledError) and "removed" in str(exc)   # not retried


def test_a_removed_groups_record_outlives_other_connections_closing_and_is_bounded(
        monkeypatch: pytest.MonkeyPatch):
    import orchestra._scheduler.groups as groups_mod
    monkeypatch.setattr(groups_mod, "_REMOVED_KEPT", 3)
    c = cluster({0: {"CPU": 4}})
    gids = [group(c, [{"CPU": 1}]) for _ in range(5)]
    c.take()
    c.s.groups.remove(gids[0])
    c.s.client_disconnected(worker_conn(99), "exited")   # another connection goes
    [info] = c.s.groups.table(gids[0])
    assert info.state == "REMOVED"   # Ray's placement_group_table after remove
    for gid in gids[1:]:
        c.s.groups.remove(gid)
    assert [i.state for i in c.s.groups.table()] == ["REMOVED"] * 3   # the newest three
    with pytest.raises(ValueError, match="no placement group"):
        c.s.groups.table(gids[0])


def test_removing_a_group_kills_its_actors():
    c = cluster({0: {"CPU": 4}})
    gid = group(c, [{"CPU": 1}])
    spec = types_pb2.ActorSpec(actor_id=b"A" * 16, class_name="Act", max_restarts=5)
    call = make_call("Act.__init__", placement=in_group(gid, 0), actor=spec)
    c.s.create_actor(DRIVER, call)
    assert c.s.actor_table.actors[spec.actor_id].worker is not None
    c.s.groups.remove(gid)
    a = c.s.actor_table.actors[spec.actor_id]
    assert a.no_restart and a.killing
    assert c.s.nodes[0].resources.free["CPU"] == 4


def test_a_task_submitted_to_a_removed_group_fails():
    c = cluster({0: {"CPU": 4}})
    gid = group(c, [{"CPU": 1}])
    c.s.groups.remove(gid)
    t = c.submit(make_call("late", placement=in_group(gid, 0)))
    assert "was removed" in str(error(c.take(), rid(t)))


def test_a_group_ends_with_the_connection_that_made_it_unless_detached():
    c = cluster({0: {"CPU": 4}})
    c.s.client_connected(7, Hello(kind="driver", pid=7))
    gone = group(c, [{"CPU": 1}], conn=7)
    kept = group(c, [{"CPU": 1}], conn=7, detached=True)
    c.s.client_disconnected(7)
    assert c.s.groups.groups[gone].state.value == "REMOVED"   # its record stays, as Ray's
    assert c.s.groups.groups[kept].state.value == "CREATED"
    assert c.s.nodes[0].resources.free["CPU"] == 3


def test_a_removed_pending_group_fails_its_ready_object():
    c = cluster({0: {"CPU": 2}})
    c.submit(make_call("busy", cpus=2))
    gid = group(c, [{"CPU": 2}])
    c.take()
    c.s.groups.remove(gid)
    assert isinstance(error(c.take(), gid + READY_SUFFIX), TaskCancelledError)


# ------------------------------------------------------------------ children, nodes

def test_children_of_a_capturing_task_run_in_its_group():
    c = cluster({0: {"CPU": 2}, 2: {"CPU": 2}})
    gid = group(c, [{"CPU": 2}], "STRICT_PACK")
    node = bundle_nodes(c, gid)[0]
    c.take()
    c.submit(make_call("parent", placement=in_group(gid, 0, capture=True)))
    [(wid, _)] = executed(c.take())
    child = c.submit(make_call("child"), conn=worker_conn(wid))
    assert c.s.tasks[child.task_id].placement is not None
    assert c.ran_on(c.take()) == [node]


def test_bundles_on_a_node_that_died_are_placed_again():
    c = cluster({0: {"CPU": 2}, 2: {"CPU": 2}, 3: {"CPU": 2}})
    gid = group(c, [{"CPU": 1}, {"CPU": 1}], "STRICT_SPREAD")
    victim = max(n for n in bundle_nodes(c, gid) if n is not None)   # not the head's node
    c.s.remove_node(victim, "test")
    nodes = bundle_nodes(c, gid)
    assert None not in nodes and victim not in nodes and len(set(nodes)) == 2
    assert executes(c.take()) == []
