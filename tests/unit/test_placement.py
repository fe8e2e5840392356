"""Placement over several nodes: which node each task and actor goes to. No processes.

A SchedulerState with two or three nodes (tests/unit/_sched_helpers.Nodes), driven by
its events; where a task ran is read from the Execute sent to a worker of that node,
where a worker was started from StartWorker(node_id, ...). Node 0 is the head's own
node, joined nodes are 2, 3, ... as the head numbers them.
"""
from __future__ import annotations

import pickle
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _sched_helpers import (
    DRIVER,
    Nodes,
    affinity,
    error_of,
    executed,
    executes,
    inline_data,
    make_call,
    new_id,
    ref,
    rid,
    segment_data,
    sent,
    socket_path,
    spread,
    worker_conn,
)
from orchestra._ids import node_hex
from orchestra._objects.errors import make_error
from orchestra._proto import types_pb2
from orchestra._resources import NodeResources
from orchestra._scheduler import placement
from orchestra._scheduler.events import TaskDone
from orchestra._scheduler.groups import GroupSpec
from orchestra._scheduler.instructions import Execute, Loan, Warn
from orchestra._scheduler.model import Obj, Task, TaskState
from orchestra.exceptions import InfeasibleResourcesError

pytestmark = pytest.mark.timeout(10)

MiB = 1 << 20


def two(cpus: float = 2, **kw: Any) -> Nodes:
    return Nodes({0: {"CPU": cpus}, 2: {"CPU": cpus}}, **kw)


def three(cpus: float = 2, **kw: Any) -> Nodes:
    return Nodes({0: {"CPU": cpus}, 2: {"CPU": cpus}, 3: {"CPU": cpus}}, **kw)


def put_segment(c: Nodes, node_id: int, size: int, copies: tuple[int, ...] = ()) -> bytes:
    """An object of ``size`` bytes in a segment on ``node_id`` (with pulled copies on
    ``copies``), held by the driver: its id."""
    oid = new_id() + bytes(4)
    c.s.directory.put(DRIVER, segment_data(oid, f"seg-{oid.hex()}", node_id=node_id, size=size))
    if copies:
        # The object directory's pulled copies (Obj.copies: node id -> its segment).
        o = c.s.objects[oid] = _WithCopies.of(c.s.objects[oid])
        o.copies = {nid: segment_data(oid, "copy", node_id=nid, size=size).segment for nid in copies}
    return oid


class _WithCopies(Obj):
    __slots__ = ("copies",)

    @classmethod
    def of(cls, o: Obj) -> _WithCopies:
        new = cls(o.owner)
        for k in Obj.__slots__:
            setattr(new, k, getattr(o, k))
        return new


def error_text(out: list[Any], oid: bytes) -> str:
    return str(pickle.loads(error_of(out, oid)))


# ------------------------------------------------------------------ where it fits

def test_a_gpu_task_goes_only_to_the_node_with_a_gpu():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 2, "GPU": 1}})
    t = c.submit(make_call("g", resources={"GPU": 1}))
    out = c.take()
    assert c.ran_on(out) == [2]
    assert [inv.gpu_ids for _, inv in executes(out)] == [[0]]
    assert c.s.nodes[2].resources.free["GPU"] == 0
    assert t.task_id in {tid for _, tid in executed(out)}


def test_a_custom_resource_task_goes_only_to_the_node_that_has_it():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 2}, 3: {"CPU": 2, "widget": 2}})
    c.submit(make_call("w", resources={"widget": 1}))
    c.submit(make_call("w", resources={"widget": 1}))
    assert c.ran_on(c.take()) == [3, 3]


def test_a_task_asking_for_more_cpus_than_one_node_has_goes_to_the_bigger_node():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 4}})
    c.submit(make_call("big", cpus=3))
    assert c.ran_on(c.take()) == [2]


def test_a_task_that_fits_only_a_busy_node_waits_for_it_and_not_elsewhere():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 2, "widget": 1}}, pipeline_depth=1)
    first = c.submit(make_call("first", resources={"widget": 1}))
    second = c.submit(make_call("second", resources={"widget": 1}))
    out = c.take()
    [(wid, tid)] = executed(out)
    assert tid == first.task_id and c.ran_on(out) == [2]
    c.done(wid, first)
    out = c.take()
    assert executed(out) and executed(out)[0][1] == second.task_id and c.ran_on(out) == [2]


# ------------------------------------------------------------------ default: spread when idle

def test_two_tasks_on_an_idle_two_node_cluster_land_on_different_nodes():
    c = two()
    c.submit(make_call("a"))
    c.submit(make_call("b"))
    assert sorted(c.ran_on(c.take())) == [0, 2]


def test_tasks_go_to_the_node_with_the_most_free_cpu_share():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 4}})
    for i in range(6):
        c.submit(make_call(f"t{i}"))
    # 0 and 2 at 100%: 0 (lower id); then 2 (100% vs 50%); 2 (75% vs 50%); then
    # 0 (50% vs 50%: lower id), 2, 2: every CPU used, each node filled.
    assert c.ran_on(c.take()) == [0, 2, 2, 0, 2, 2]
    assert c.available()["CPU"] == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0, 8.0]), st.integers(0, 8)),
                min_size=1, max_size=12), st.permutations(range(12)))
def test_the_first_node_offered_has_the_most_cpu_share_free_then_the_lowest_id(shapes, ids):
    """The inline pass (placement.most_cpu_free) picks what the key's minimum picks,
    whatever the nodes' sizes, use and order in the table."""
    nodes: list[Any] = []
    for (total, used), nid in zip(shapes, ids[:len(shapes)], strict=True):
        res = NodeResources({"CPU": total})
        res.acquire({"CPU": min(used, total)})
        nodes.append(types.SimpleNamespace(node_id=nid, resources=res))
    expect = min(nodes, key=lambda n: (-placement.cpu_share_free(n), n.node_id))
    assert placement.most_cpu_free(nodes) is expect


_STEPS = st.lists(st.tuples(st.sampled_from(["take", "give", "over", "join", "leave", "add"]),
                            st.integers(0, 40), st.sampled_from([0.1, 0.25, 0.5, 1.0, 3.0])),
                  max_size=120)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0, 2.0, 4.0, 16.0]), min_size=1, max_size=8), _STEPS,
       st.sampled_from([0, 64]))
def test_the_cpu_index_finds_what_a_pass_over_the_nodes_finds(totals, steps, slack):
    """CpuIndex.first() is the working node the key's minimum picks, whatever the nodes'
    resources went through (taken, given back, overdrawn, added; nodes joining and
    leaving, some that run no work; the heap made again often: ``slack`` 0)."""
    from orchestra._scheduler.model import Node
    nodes: dict[int, Node] = {}
    index = placement.CpuIndex(nodes, slack)
    held: list[tuple[int, dict[str, float]]] = []

    def join(nid: int, total: float) -> None:
        nodes[nid] = Node(nid, {"CPU": total}, max_workers=4, works=nid % 5 != 4)
        index.added(nodes[nid])
    for nid, total in enumerate(totals):
        join(nid, total)
    for op, i, amount in steps:
        live = sorted(nodes)
        n = nodes[live[i % len(live)]] if live else None
        if op == "take" and n is not None and n.resources.fits({"CPU": amount}):
            n.resources.acquire({"CPU": amount})
            held.append((n.node_id, {"CPU": amount}))
        elif op == "give" and held:
            nid, req = held.pop(i % len(held))
            if nid in nodes:
                nodes[nid].resources.release(req, [])
        elif op == "over" and n is not None:
            n.resources.overdraw({"CPU": amount})
            held.append((n.node_id, {"CPU": amount}))
        elif op == "add" and n is not None:
            n.resources.add({"CPU": amount})
        elif op == "join":
            join(max(nodes, default=-1) + 1, amount * 4)
        elif op == "leave" and n is not None:
            index.removed(nodes.pop(n.node_id))
        working = [m for m in nodes.values() if m.resources.works]
        expect = min(working, key=lambda m: (-placement.cpu_share_free(m), m.node_id),
                     default=None)
        assert index.first() is expect


# ------------------------------------------------------------------ default: data locality

def test_a_task_goes_to_the_node_holding_its_argument():
    c = three()
    oid = put_segment(c, 3, 8 * MiB)
    c.submit(make_call("reader", (ref(oid),)))
    assert c.ran_on(c.take()) == [3]


def test_the_node_holding_most_argument_bytes_wins():
    c = three()
    small = put_segment(c, 2, 1 * MiB)
    big = put_segment(c, 3, 4 * MiB)
    c.submit(make_call("reader", (ref(small), ref(big))))
    assert c.ran_on(c.take()) == [3]


def test_pulled_copies_count_for_the_nodes_that_hold_them():
    c = three()
    a = put_segment(c, 0, 2 * MiB, copies=(2,))   # node 0: 2 MiB, node 2: 2 MiB
    b = put_segment(c, 3, 3 * MiB, copies=(2,))   # node 3: 3 MiB, node 2: 3 MiB more
    c.submit(make_call("reader", (ref(a), ref(b))))
    assert c.ran_on(c.take()) == [2]


def test_an_argument_that_becomes_ready_later_draws_its_consumer_to_its_node():
    c = two()
    producer = c.submit(make_call("producer", resources={}, cpus=1))
    out = c.take()
    [(wid, _)] = executed(out)
    consumer = c.submit(make_call("consumer", (ref(rid(producer)),)))
    assert executed(c.take()) == []   # waits for its argument
    # The producer's worker writes the result into a segment of node 2.
    c.s.task_done(worker_conn(wid), TaskDone(task_id=producer.task_id, returns=[
        segment_data(rid(producer), "result", node_id=2, size=16 * MiB)]))
    out = c.take()
    assert [tid for _, tid in executed(out)] == [consumer.task_id] and c.ran_on(out) == [2]


def test_inline_arguments_do_not_count_for_locality():
    c = two()
    oid = new_id() + bytes(4)
    c.s.directory.put(DRIVER, inline_data(oid, "small"))
    c.submit(make_call("a"))   # node 0 (lower id at equal share)
    c.submit(make_call("b", (ref(oid),)))
    assert c.ran_on(c.take()) == [0, 2]


def test_when_the_node_holding_the_data_is_full_the_task_runs_elsewhere():
    c = two(cpus=1)
    oid = put_segment(c, 2, 8 * MiB)
    c.submit(make_call("busy", resources={}, cpus=1, placement=affinity(2)))
    reader = c.submit(make_call("reader", (ref(oid),)))
    out = c.take()
    assert c.ran_on(out) == [2, 0]
    assert executed(out)[1][1] == reader.task_id


def test_an_argument_on_a_node_gone_from_the_cluster_counts_for_nothing():
    c = two()
    oid = put_segment(c, 7, 8 * MiB)   # node 7 is not (any more) in the cluster
    c.submit(make_call("reader", (ref(oid),)))
    assert c.ran_on(c.take()) == [0]


# ------------------------------------------------------------------ SPREAD

def test_spread_tasks_go_to_each_node_in_turn():
    c = three(cpus=4)
    for i in range(6):
        c.submit(make_call(f"s{i}", placement=spread()))
    assert c.ran_on(c.take()) == [0, 2, 3, 0, 2, 3]


def test_spread_prefers_the_least_loaded_node():
    c = three(cpus=2)
    c.submit(make_call("x", placement=affinity(0)))
    c.submit(make_call("y", placement=affinity(0)))
    c.submit(make_call("z", placement=affinity(2)))
    c.take()
    c.submit(make_call("s1", placement=spread()))
    c.submit(make_call("s2", placement=spread()))
    assert c.ran_on(c.take()) == [3, 2]   # node 3 idle, then node 2 (half free), never 0


def test_spread_tasks_without_resources_still_take_turns():
    c = three(cpus=2)
    for i in range(3):
        c.submit(make_call(f"s{i}", cpus=0, placement=spread()))
    assert c.ran_on(c.take()) == [0, 2, 3]


def test_spread_skips_nodes_where_the_request_does_not_fit():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 2, "widget": 4}, 3: {"CPU": 2, "widget": 4}})
    for i in range(4):
        c.submit(make_call(f"s{i}", resources={"widget": 1}, placement=spread()))
    assert c.ran_on(c.take()) == [2, 3, 2, 3]


# ------------------------------------------------------------------ node affinity

def test_hard_affinity_runs_on_that_node_only():
    c = three()
    for i in range(2):
        c.submit(make_call(f"a{i}", placement=affinity(3)))
    assert c.ran_on(c.take()) == [3, 3]


def test_hard_affinity_waits_for_its_busy_node_while_others_are_idle():
    c = two(cpus=1, pipeline_depth=1)
    first = c.submit(make_call("first", placement=affinity(2)))
    second = c.submit(make_call("second", placement=affinity(2)))
    out = c.take()
    [(wid, tid)] = executed(out)
    assert tid == first.task_id and c.node_of(wid) == 2
    assert c.s.tasks[second.task_id].state is TaskState.READY
    c.done(wid, first)
    assert executed(c.take()) == [(wid, second.task_id)]


def test_hard_affinity_pipelines_only_behind_workers_of_its_node():
    c = two(cpus=1, pipeline_depth=4)
    c.submit(make_call("on0"))                              # node 0's only CPU
    c.submit(make_call("on2", placement=affinity(2)))       # node 2's only CPU
    out = c.take()
    assert sorted(c.ran_on(out)) == [0, 2]
    # Same resource shape as both running tasks: pipelined, but only on node 2.
    later = [c.submit(make_call(f"later{i}", placement=affinity(2))) for i in range(3)]
    out = c.take()
    assert [tid for _, tid in executed(out)] == [t.task_id for t in later]
    assert c.ran_on(out) == [2, 2, 2]


def test_a_task_behind_a_waiting_affinity_task_is_not_held_up_by_it():
    c = two(cpus=1, pipeline_depth=1)
    c.submit(make_call("busy", placement=affinity(2)))
    waiting = c.submit(make_call("waits", placement=affinity(2)))
    free = c.submit(make_call("free"))
    out = c.take()
    ran = [tid for _, tid in executed(out)]
    assert waiting.task_id not in ran and free.task_id in ran
    assert c.ran_on(out)[ran.index(free.task_id)] == 0


def test_hard_affinity_to_a_node_not_in_the_cluster_fails_naming_it():
    c = two(error_factory=make_error)
    call = c.submit(make_call("f", placement=affinity(9)))
    out = c.take()
    assert executed(out) == []
    err = pickle.loads(error_of(out, rid(call)))
    assert isinstance(err, InfeasibleResourcesError)
    assert node_hex(9) in str(err) and "no such node" in str(err) and "soft=True" in str(err)


def test_hard_affinity_to_a_node_that_can_never_hold_the_request_fails():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 2, "GPU": 1}}, error_factory=make_error)
    call = c.submit(make_call("f", resources={"GPU": 1}, placement=affinity(0)))
    text = error_text(c.take(), rid(call))
    assert node_hex(0) in text and "GPU=1" in text and "has only CPU=2" in text


def test_hard_affinity_fails_even_on_a_joinable_cluster():
    c = two(joinable=True)
    call = c.submit(make_call("f", placement=affinity(9)))
    out = c.take()
    assert b"infeasible" in error_of(out, rid(call)) and sent(out, Warn) == []


def test_a_queued_hard_affinity_task_fails_when_its_node_leaves():
    c = two(cpus=1, pipeline_depth=1)
    c.submit(make_call("busy", placement=affinity(2)))
    queued = c.submit(make_call("queued", placement=affinity(2)))
    c.take()
    del c.s.nodes[2]   # the node left (remove_node's bookkeeping is not placement's)
    c.s.schedule()
    out = c.take()
    assert b"no such node" in error_of(out, rid(queued)) and executed(out) == []


def test_every_queued_task_bound_to_a_node_that_left_fails_in_one_pass():
    c = two(cpus=1, pipeline_depth=1)
    c.submit(make_call("busy", placement=affinity(2)))
    queued = [c.submit(make_call(f"q{i}", placement=affinity(2))) for i in range(3)]
    c.take()
    del c.s.nodes[2]
    c.s.schedule()
    out = c.take()
    assert all(b"no such node" in error_of(out, rid(t)) for t in queued)
    assert not c.s.has_ready()


def test_soft_affinity_prefers_its_node():
    c = three()
    c.submit(make_call("f", placement=affinity(3, soft=True)))
    assert c.ran_on(c.take()) == [3]


def test_soft_affinity_runs_elsewhere_when_its_node_is_full():
    c = two(cpus=1)
    c.submit(make_call("busy", placement=affinity(2)))
    c.submit(make_call("soft", placement=affinity(2, soft=True)))
    assert c.ran_on(c.take()) == [2, 0]


def test_soft_affinity_to_a_node_not_in_the_cluster_runs_anywhere():
    c = two()
    call = c.submit(make_call("soft", placement=affinity(9, soft=True)))
    out = c.take()
    assert [tid for _, tid in executed(out)] == [call.task_id]


# ------------------------------------------------------------------ workers start where chosen

def test_a_worker_starts_on_the_chosen_node_not_the_first_that_fits():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 2}}, workers={0: 2, 2: 0})
    call = c.submit(make_call("f", placement=affinity(2)))
    out = c.take()
    assert executed(out) == [] and c.started_on(out) == [2]
    [wid] = c.started(out)
    c.connect(wid)
    assert executed(c.take()) == [(wid, call.task_id)]


def test_the_default_placement_starts_a_worker_on_the_data_node():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 2}}, workers={0: 2, 2: 0})
    oid = put_segment(c, 2, 8 * MiB)
    c.submit(make_call("reader", (ref(oid),)))
    out = c.take()
    assert executed(out) == [] and c.started_on(out) == [2]


def test_a_node_at_its_worker_limit_gives_way_to_one_with_an_idle_worker():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 2}}, workers={0: 0, 2: 1}, max_workers=0)
    call = c.submit(make_call("f"))   # node 0 is preferred, but can have no worker
    out = c.take()
    assert [tid for _, tid in executed(out)] == [call.task_id] and c.ran_on(out) == [2]


# ------------------------------------------------------------------ requests no node holds

def test_on_a_private_cluster_a_request_no_node_holds_fails_at_once():
    c = two()
    call = c.submit(make_call("huge", cpus=16))
    out = c.take()
    assert b"infeasible" in error_of(out, rid(call)) and sent(out, Warn) == []


def test_on_a_joinable_cluster_it_waits_and_its_owner_is_warned_once():
    c = two(joinable=True)
    calls = [c.submit(make_call("huge", cpus=16)) for _ in range(2)]
    out = c.take()
    assert executed(out) == []
    [warning] = sent(out, Warn, DRIVER)
    assert "CPU=16" in warning.text and "huge" in warning.text and "joins" in warning.text
    assert all(c.s.tasks[t.task_id].state is TaskState.READY for t in calls)


def test_a_waiting_request_runs_once_a_node_that_holds_it_joins():
    c = two(joinable=True)
    call = c.submit(make_call("huge", cpus=16))
    c.take()
    c.s.add_node(5, {"CPU": 16}, num_workers=1, max_workers=4)
    out = c.take()
    assert c.started_on(out) == [5]
    [wid] = c.started(out)
    c.connect(wid)
    out = c.take()
    assert executed(out) == [(wid, call.task_id)] and c.node_of(wid) == 5


def test_a_waiting_request_holds_up_no_other_task():
    c = two(joinable=True)
    c.submit(make_call("huge", cpus=16))
    small = c.submit(make_call("small"))
    assert [tid for _, tid in executed(c.take())] == [small.task_id]


# ------------------------------------------------------------------ actors

def actor_call(class_name: str = "A", *, cpus: float = 0.0, resources: dict[str, float] | None = None,
               placement: Any = None) -> Any:
    return make_call(f"{class_name}.__init__", cpus=cpus, resources=resources, num_returns=0,
                     placement=placement,
                     actor=types_pb2.ActorSpec(max_concurrency=1, class_name=class_name))


def test_an_actor_starts_on_the_node_that_has_its_resources():
    c = Nodes({0: {"CPU": 2}, 2: {"CPU": 2, "GPU": 2}})
    c.s.create_actor(DRIVER, actor_call(resources={"GPU": 1}))
    assert c.started_on(c.take()) == [2]


def test_actors_spread_over_idle_nodes_by_free_cpu_share():
    c = two()
    c.s.create_actor(DRIVER, actor_call("A", cpus=1))
    c.s.create_actor(DRIVER, actor_call("B", cpus=1))
    assert c.started_on(c.take()) == [0, 2]


def test_an_actor_with_hard_affinity_starts_on_that_node():
    c = three()
    c.s.create_actor(DRIVER, actor_call(placement=affinity(3)))
    assert c.started_on(c.take()) == [3]


def test_an_actor_with_spread_takes_turns():
    c = three()
    for name in "ABC":
        c.s.create_actor(DRIVER, actor_call(name, placement=spread()))
    assert c.started_on(c.take()) == [0, 2, 3]


_WORK = st.tuples(st.sampled_from(["task", "actor", "group"]), st.sampled_from([0.0, 1.0]),
                 st.sampled_from(["default", "spread", "soft0", "none"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(_WORK, min_size=1, max_size=12), st.integers(0, 2))
def test_a_head_that_runs_no_work_is_given_none(work: list[Any], busy: int) -> None:
    """The head's own node beside a node that runs its machine's work (orchestra start
    --head): whatever comes (tasks, actors and placement groups of no CPU or one, any
    strategy, a soft wish for the head), while the node's CPUs are taken or not,
    nothing starts or runs on the head; a hard affinity to it fails, naming it."""
    c = Nodes({0: {"CPU": 0}, 2: {"CPU": 2}}, no_work=(0,), error_factory=make_error)
    for _ in range(busy):   # the node's CPUs taken: the head's share ties with it
        c.submit(make_call("busy", cpus=1))
    out = c.take()
    for kind, cpus, how in work:
        placement = {"default": None, "spread": spread(), "soft0": affinity(0, soft=True),
                     "none": None}[how]
        if kind == "task":
            c.submit(make_call("t", cpus=cpus, placement=placement))
        elif kind == "actor":
            c.s.create_actor(DRIVER, actor_call(cpus=cpus, placement=placement))
        else:
            c.s.groups.create(DRIVER, GroupSpec(new_id(), ({"CPU": 1.0},), "PACK"))
            c.s.schedule()
        out += c.take()
    assert 0 not in c.started_on(out) and 0 not in c.ran_on(out)
    assert all(w.node_id != 0 for w in c.s.workers.values())
    assert all(0 not in g.nodes for g in c.s.groups.groups.values())
    hard = c.submit(make_call("pinned", cpus=0, placement=affinity(0)))
    assert "runs no work" in error_text(c.take(), rid(hard))


def test_an_actor_with_hard_affinity_to_a_missing_node_is_dead_with_the_reason():
    c = two(error_factory=make_error)
    ctor = actor_call(placement=affinity(9))
    c.s.create_actor(DRIVER, ctor)
    assert c.started_on(c.take()) == []
    call = make_call("m", cpus=0)
    call.actor_id = ctor.actor.actor_id
    c.submit(call)
    text = error_text(c.take(), rid(call))
    assert node_hex(9) in text and "no such node" in text


def test_an_actor_no_node_holds_waits_on_a_joinable_cluster_until_one_joins():
    c = two(joinable=True)
    c.s.create_actor(DRIVER, actor_call(resources={"GPU": 1}))
    out = c.take()
    assert c.started_on(out) == [] and len(sent(out, Warn, DRIVER)) == 1
    c.s.add_node(4, {"CPU": 1, "GPU": 1}, num_workers=0, max_workers=4)
    c.s.schedule()
    assert c.started_on(c.take()) == [4]


def test_an_actor_no_node_holds_is_dead_at_once_on_a_private_cluster():
    c = two(error_factory=make_error)
    ctor = actor_call(resources={"GPU": 1})
    c.s.create_actor(DRIVER, ctor)
    assert c.started_on(c.take()) == []
    call = make_call("m", cpus=0)
    call.actor_id = ctor.actor.actor_id
    c.submit(call)
    assert isinstance(pickle.loads(error_of(c.take(), rid(call))), InfeasibleResourcesError)


# ------------------------------------------------------------------ one node

def test_with_one_node_strategies_run_as_the_default_does():
    c = Nodes({0: {"CPU": 2}})
    a = c.submit(make_call("a", placement=spread()))
    b = c.submit(make_call("b", placement=affinity(0)))
    assert [tid for _, tid in executed(c.take())] == [a.task_id, b.task_id]


def test_with_one_node_affinity_to_another_fails_at_submit():
    c = Nodes({0: {"CPU": 2}})
    call = c.submit(make_call("f", placement=affinity(2)))
    assert b"no such node" in error_of(c.take(), rid(call))


def test_a_hard_affinity_task_is_not_run_inline_by_a_blocked_worker_of_another_node():
    c = two(cpus=1, pipeline_depth=1)
    parent = c.submit(make_call("parent"))
    busy = c.submit(make_call("busy", placement=affinity(2)))
    out = c.take()
    wid, busy_wid = (w for w, _ in executed(out))
    assert (c.node_of(wid), c.node_of(busy_wid)) == (0, 2)
    child = make_call("child", placement=affinity(2))
    c.s.submit(worker_conn(wid), child)
    c.s.blocked(worker_conn(wid), True, [rid(child)], parent.task_id, "parent")
    out = c.take()
    assert executed(out) == [] and [i for i in out if type(i) is Execute and i.nested] == []
    c.done(busy_wid, busy)
    assert executed(c.take()) == [(busy_wid, child.task_id)]


# ------------------------------------------------------------------ loans

def test_a_worker_lent_on_request_comes_from_the_drivers_own_node():
    # Direct calls stay on one machine: node 2 has more CPU free, but the driver's
    # node is 0.
    c = two()
    c.s.lending = True
    c.s.worker_socket = socket_path
    c.submit(make_call("busy", placement=affinity(0)))   # node 0: half its CPUs held
    c.take()
    c.s.loans.lend_idle(DRIVER, {"CPU": 1.0})
    [loan] = sent(c.take(), Loan, DRIVER)
    assert c.node_of(loan.worker_id) == 0


def test_resources_counted_in_bytes_read_in_gib_in_messages() -> None:
    """A node's memory in an infeasible task's warning read `memory=1.74249e+10`, and in
    the head's log of a node joining, and in a placement group's or gang's error."""
    from orchestra._resources import format_resources as fmt
    assert fmt({"CPU": 2, "memory": 17424900000.0, "node:10.0.0.5": 1}) == \
        "CPU=2, memory=16.2 GiB, node:10.0.0.5=1"
    assert fmt({"object_store_memory": 2 ** 31}) == "object_store_memory=2 GiB"
    assert fmt({"memory": 512.0}) == "memory=512"   # a few bytes stay as they are
    assert fmt({}) == "nothing"


def test_after_a_restart_of_the_head_the_warning_names_the_nodes_not_back_yet():
    # A restarted head waits a few seconds for the nodes joined before it (kept.expect):
    # a request that only such a node may hold waits for them, and the warning says so
    # rather than only asking for a node to be started.
    import time

    from orchestra._scheduler.kept import NODE_WAIT_S
    c = two(joinable=True)
    c.s.kept.expect({5, 6}, time.monotonic())
    c.submit(make_call("huge", cpus=16))
    [warning] = sent(c.take(), Warn, DRIVER)
    assert "CPU=16" in warning.text
    assert (f"2 nodes that were in the cluster before its head restarted have not joined "
            f"again yet (each is waited for up to {NODE_WAIT_S:g} s)") in warning.text
    c.s.kept.node_joined(5, [], time.monotonic())
    c.s.kept.node_joined(6, [], time.monotonic())
    c.submit(make_call("huger", cpus=32))
    [warning] = sent(c.take(), Warn, DRIVER)
    assert "before its head restarted" not in warning.text and "joins" in warning.text


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=6),
       st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.5, 1.0, 2.0])), max_size=10),
       st.lists(st.tuples(st.integers(0, 5), st.integers(1, 8)), max_size=3),
       st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from(["default", "spread", "soft"]))
def test_the_lazy_order_is_the_order(cpus: list[int], busy: list[tuple[int, float]],
                                     held: list[tuple[int, int]], probe_cpus: float,
                                     how: str) -> None:
    """Placer.ordered (what a placement walks, its first node found without a sort)
    yields the nodes of Placer.order, in its order, whatever the nodes' free CPUs and
    the bytes of the task's arguments they hold."""
    c = Nodes({n: {"CPU": float(k)} for n, k in enumerate(cpus)}, max_workers=2)
    for n, k in busy:                         # some CPUs taken, on nodes the task names
        c.submit(make_call("busy", cpus=k, placement=affinity(n % len(cpus), soft=True)))
    args = tuple(ref(put_segment(c, n % len(cpus), mib * MiB)) for n, mib in held)
    placement = {"default": None, "spread": spread(), "soft": affinity(1, soft=True)}[how]
    probe = Task(make_call("probe", args, cpus=probe_cpus, placement=placement), DRIVER)
    probe.arg_ids = [a.ref for a in args]
    assert list(c.s.placer.ordered(probe)) == c.s.placer.order(probe)


def test_a_worker_whose_queue_shortens_takes_a_pipelined_task_again():
    """Every queue full, a task waits (the pipelining index drops the full workers as it
    looks); one task ending frees a slot on its worker, which takes the waiting task
    behind its next one (model.WorkerTable: the worker is indexed again)."""
    c = two(cpus=1, pipeline_depth=2)
    calls = {call.task_id: call for call in (c.submit(make_call(f"t{i}")) for i in range(4))}
    ran = executed(c.take())
    assert sorted(c.node_of(w) for w, _ in ran) == [0, 0, 2, 2]   # one running, one behind
    waiting = c.submit(make_call("waits"))
    assert executed(c.take()) == []
    w, first = ran[0]
    c.done(w, calls[first])
    assert executed(c.take()) == [(w, waiting.task_id)]
