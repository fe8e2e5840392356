"""The object directory of a cluster of several nodes (SchedulerState, no processes):
where each object's copies are, what a task on another node is told to read, what a
node's death does to the objects it held."""
from __future__ import annotations

import pickle
from typing import Any

import pytest

from _sched_helpers import (
    DRIVER,
    NODE,
    Cluster,
    affinity,
    executed,
    executes,
    freed_segments,
    inline_data,
    make_call,
    ref,
    rid,
    worker_conn,
)
from orchestra._objects.errors import make_error
from orchestra._scheduler import data as values
from orchestra._scheduler.data import ERROR, Data, Segment
from orchestra._scheduler.events import Hello, TaskDone
from orchestra._scheduler.instructions import FreeSegment, Loan, Pull, Push
from orchestra._scheduler.model import TaskState

OTHER = 2


def two_nodes() -> tuple[Cluster, int, int]:
    """Node 0 with one worker, node 2 ("other": 1) with one; both connected."""
    c = Cluster(cpus=1)
    c.s.add_node(OTHER, {"CPU": 1.0, "other": 1.0}, num_workers=1, max_workers=4)
    (w2,) = c.started(c.take())
    c.connect(w2)
    c.take()
    (w0,) = c.pool
    return c, w0, w2


def seg_on(node: int, oid: bytes, name: str) -> Data:
    return values.at(oid, Segment(name=name, size=4 << 20, node_id=node))


def made_on_other(c: Cluster, w2: int, max_retries: int = 0) -> tuple[bytes, object]:
    call = c.submit(make_call("make", resources={"other": 1.0}, max_retries=max_retries))
    assert [w for w, _ in executes(c.take())] == [w2]
    oid = rid(call)
    c.s.task_done(worker_conn(w2), TaskDone(task_id=call.task_id,
                                               returns=[seg_on(OTHER, oid, "seg-on-2")]))
    c.take()
    return oid, call


def test_a_task_on_another_node_is_sent_the_holders_copy_and_its_node_pulls_one():
    c, w0, w2 = two_nodes()
    oid, _ = made_on_other(c, w2)
    c.submit(make_call("use", (ref(oid),), placement=affinity(NODE)))
    out = c.take()
    ((w, inv),) = executes(out)
    assert w == w0
    assert inv.resolved[0].segment.node_id == OTHER
    assert Pull(NODE, oid) in out


def test_once_a_copy_is_there_tasks_on_that_node_read_it_and_nothing_is_pulled():
    c, w0, w2 = two_nodes()
    oid, _ = made_on_other(c, w2)
    assert c.s.directory.copy_on(oid, NODE) is None
    assert c.s.directory.add_copy(oid, Segment(name="copy-on-0", size=4 << 20, node_id=NODE))
    assert c.s.directory.copy_on(oid, NODE).segment.name == "copy-on-0"
    assert c.s.directory.copy_on(oid, OTHER).segment.name == "seg-on-2"
    use = c.submit(make_call("use", (ref(oid),), placement=affinity(NODE)))
    out = c.take()
    ((w, inv),) = executes(out)
    assert inv.resolved[0].segment.name == "copy-on-0"
    assert not [i for i in out if type(i) is Pull]
    # The task is sent the copy; the object's own record still names its primary copy
    # (a record rewritten to the copy freed the copy twice and leaked the primary).
    assert c.s.directory.copy_on(oid, OTHER).segment.name == "seg-on-2"
    c.done(w, use)
    c.take()
    c.s.directory.ref_delta(DRIVER, [], [oid])
    freed = {(i.node_id, i.key) for i in c.take() if type(i) is FreeSegment}
    assert freed == {(OTHER, "seg-on-2"), (NODE, "copy-on-0")}


def test_the_last_ref_dropped_frees_every_copy_on_its_own_node():
    c, _, w2 = two_nodes()
    oid, _ = made_on_other(c, w2)
    c.s.directory.add_copy(oid, Segment(name="copy-on-0", size=4 << 20, node_id=NODE))
    c.s.directory.ref_delta(DRIVER, [], [oid])
    freed = {(i.node_id, i.key) for i in c.take() if type(i) is FreeSegment}
    assert freed == {(OTHER, "seg-on-2"), (NODE, "copy-on-0")}


def test_an_object_put_again_with_its_own_segment_keeps_it_and_a_second_copy_is_freed():
    # A driver forwarding a result the head already sealed named the same segment: it
    # was taken for a second copy and freed while the object lived (a reader on another
    # node then read the bytes of the next object written there).
    c, _, w2 = two_nodes()
    oid, _ = made_on_other(c, w2)
    c.s.directory.put(DRIVER, seg_on(OTHER, oid, "seg-on-2"))
    assert [i for i in c.take() if type(i) is FreeSegment] == []
    assert c.s.objects[oid].data.segment.name == "seg-on-2"
    c.s.directory.put(DRIVER, seg_on(OTHER, oid, "another"))
    assert [i for i in c.take() if type(i) is FreeSegment] == [FreeSegment(OTHER, "another")]
    assert c.s.objects[oid].data.segment.name == "seg-on-2"


def test_a_subscriber_of_a_result_nobody_holds_any_more_hears_it_is_gone_when_it_comes():
    # A reader with no ref of its own (the head's locate and gRPC readers subscribe
    # as GRPC_CONN) waited for a result whose last ref went while its task ran: freed
    # at its seal, the subscriber was never told and its reader waited for ever.
    c, _, w2 = two_nodes()
    c.s.client_connected(50, Hello(kind="grpc"))
    call = c.submit(make_call("make", resources={"other": 1.0}))
    c.take()
    oid = rid(call)
    c.s.directory.subscribe(50, [oid])
    c.s.directory.ref_delta(DRIVER, [], [oid])
    c.s.task_done(worker_conn(w2), TaskDone(task_id=call.task_id,
                                               returns=[seg_on(OTHER, oid, "seg-on-2")]))
    out = c.take()
    assert FreeSegment(OTHER, "seg-on-2") in out
    [told] = [i.data for i in out if type(i) is Push and i.conn == 50]
    assert told.object_id == oid and told.kind == ERROR and told.payload


@pytest.mark.parametrize("drivers_outlive_the_head", [False, True])
def test_a_driver_that_dropped_a_tasks_refs_hears_when_it_answered_if_it_outlives_the_head(
        drivers_outlive_the_head: bool):
    # A driver of a supervised head keeps each call until it answered, to submit it
    # again to a restarted head (_runtime/replay.py); a task whose refs it dropped used
    # to answer unheard, so such a call was either kept forever or forgotten unrun.
    c, _, w2 = two_nodes()
    c.s.directory.tell_owner_freed = drivers_outlive_the_head
    call = c.submit(make_call("make", resources={"other": 1.0}))
    c.take()
    oid = rid(call)
    c.s.directory.ref_delta(DRIVER, [], [oid])
    c.s.task_done(worker_conn(w2), TaskDone(task_id=call.task_id,
                                               returns=[seg_on(OTHER, oid, "seg-on-2")]))
    out = c.take()
    assert FreeSegment(OTHER, "seg-on-2") in out
    told = [i.data for i in out if type(i) is Push and i.conn == DRIVER]
    if not drivers_outlive_the_head:
        assert told == []
        return
    [data] = told
    assert data.object_id == oid and data.kind == ERROR and data.payload


def test_a_copy_of_an_object_already_freed_is_refused():
    c, _, w2 = two_nodes()
    oid, _ = made_on_other(c, w2)
    c.s.directory.ref_delta(DRIVER, [], [oid])
    assert not c.s.directory.add_copy(oid, Segment(name="late", size=1, node_id=NODE))


def test_a_spilled_copy_is_found_at_its_file():
    c, _, w2 = two_nodes()
    oid, _ = made_on_other(c, w2)
    c.s.directory.add_copy(oid, Segment(name="copy-on-0", size=4 << 20, node_id=NODE))
    assert c.s.relocate(oid, Segment(name="copy-on-0", size=4 << 20, node_id=NODE,
                                        path="/spill/x"))
    assert c.s.directory.copy_on(oid, NODE).segment.path == "/spill/x"
    assert c.s.directory.copy_on(oid, OTHER).segment.path == ""   # the primary copy did not move


def test_a_dead_nodes_object_lives_on_in_a_copy():
    c, _, w2 = two_nodes()
    oid, _ = made_on_other(c, w2)
    c.s.directory.add_copy(oid, Segment(name="copy-on-0", size=4 << 20, node_id=NODE))
    c.s.remove_node(OTHER, "killed")
    data = c.s.objects[oid].data
    assert data.segment.node_id == NODE and data.segment.name == "copy-on-0"


def test_an_object_only_a_dead_node_held_is_lost_naming_the_node():
    c, _, w2 = two_nodes()
    oid, _ = made_on_other(c, w2, max_retries=0)
    c.s.remove_node(OTHER, "no heartbeat for 10 s")
    data = c.s.objects[oid].data
    assert data.kind == ERROR
    assert b"node_lost" in data.payload and b"no heartbeat" in data.payload
    # As the head makes it (make_error): the error a reader gets.
    err = pickle.loads(make_error("node_lost", object_id=oid, node=2, reason="no heartbeat for 10 s"))
    assert type(err).__name__ == "ObjectLostError"
    assert "node 2" in str(err) and "no heartbeat" in str(err) and "max_retries" in str(err)


def test_a_lost_result_of_a_task_with_retries_is_made_again_on_a_live_node():
    c, w0, w2 = two_nodes()
    # The task lands on node 2 because node 0's worker is busy with another.
    busy = c.submit(make_call("busy"))
    assert [w for w, _ in executes(c.take())] == [w0]
    call = c.submit(make_call("make", max_retries=1))
    assert [w for w, _ in executes(c.take())] == [w2]
    oid = rid(call)
    c.s.task_done(worker_conn(w2), TaskDone(task_id=call.task_id,
                                               returns=[seg_on(OTHER, oid, "seg-on-2")]))
    c.done(w0, busy)
    c.take()
    c.s.remove_node(OTHER, "killed")
    assert c.s.objects[oid].data is None   # pending again
    out = c.take()
    assert [(w, inv.call.task_id) for w, inv in executes(out)] == [(w0, call.task_id)]
    c.s.task_done(worker_conn(w0), TaskDone(task_id=call.task_id,
                                               returns=[seg_on(NODE, oid, "again-on-0")]))
    assert c.s.objects[oid].data.segment.name == "again-on-0"
    # The rebuilt object has no retry left to be rebuilt once more.
    assert c.s.objects[oid].lineage is None


def test_a_queued_task_whose_argument_is_made_again_waits_for_it():
    # The argument was sealed and its consumer queued (its worker busy) when the node
    # holding the argument died: the consumer was dispatched with no data for it and
    # the head's loop died on a TypeError (found by the fault soak). It waits now.
    c = Cluster(cpus=1, custom={"zero": 1.0}, pipeline_depth=1)
    c.s.add_node(OTHER, {"CPU": 1.0}, num_workers=1, max_workers=4)
    (w2,) = c.started(c.take())
    c.connect(w2)
    c.take()
    (w0,) = c.pool
    busy = c.submit(make_call("busy", resources={"zero": 1.0}))
    assert executed(c.take()) == [(w0, busy.task_id)]
    make = c.submit(make_call("make", max_retries=1))
    assert executed(c.take()) == [(w2, make.task_id)]
    oid = rid(make)
    c.s.task_done(worker_conn(w2), TaskDone(task_id=make.task_id,
                                               returns=[seg_on(OTHER, oid, "seg-on-2")]))
    consumer = c.submit(make_call("consumer", (ref(oid),), resources={"zero": 1.0}))
    assert c.s.tasks[consumer.task_id].state is TaskState.READY   # behind busy
    c.take()
    c.s.remove_node(OTHER, "killed")
    assert c.s.objects[oid].data is None   # pending again: made again
    assert c.s.tasks[consumer.task_id].state is TaskState.WAITING
    c.done(w0, busy)
    assert executed(c.take()) == [(w0, make.task_id)]   # the rebuild first
    c.s.task_done(worker_conn(w0), TaskDone(task_id=make.task_id,
                                               returns=[seg_on(NODE, oid, "again-on-0")]))
    [(w, inv)] = executes(c.take())
    assert (w, inv.call.task_id) == (w0, consumer.task_id)
    assert inv.resolved[0].segment.name == "again-on-0"


def argument_on_other_node() -> tuple[Cluster, int, Any, Any, bytes]:
    """Node 0, its one worker busy with a task holding resource "zero" (node 0 also has
    "here", for an actor), and node 2 (OTHER), where a task with a retry left made
    ``oid``, a segment there: (cluster, node 0's worker, busy, that task, oid)."""
    c = Cluster(cpus=1, custom={"zero": 1.0, "here": 1.0}, pipeline_depth=2)
    c.s.add_node(OTHER, {"CPU": 1.0}, num_workers=1, max_workers=4)
    (w2,) = c.started(c.take())
    c.connect(w2)
    c.take()
    (w0,) = c.pool
    busy = c.submit(make_call("busy", resources={"zero": 1.0}))
    assert executed(c.take()) == [(w0, busy.task_id)]
    make = c.submit(make_call("make", max_retries=1))   # on node 2: node 0's CPU is busy
    assert executed(c.take()) == [(w2, make.task_id)]
    oid = rid(make)
    c.s.task_done(worker_conn(w2), TaskDone(task_id=make.task_id,
                                               returns=[seg_on(OTHER, oid, "seg-on-2")]))
    return c, w0, busy, make, oid


def made_again_then_sent(c: Cluster, w0: int, make: Any, oid: bytes,
                         sent: list[tuple[int, bytes]]) -> tuple[int, bytes]:
    """``make`` was sent to ``w0`` again (in ``sent``) to make ``oid`` again; it ends
    there: the one task then sent (worker, task id), given the new copy of ``oid``."""
    assert (w0, make.task_id) in sent   # the rebuild
    c.s.task_done(worker_conn(w0), TaskDone(task_id=make.task_id,
                                               returns=[seg_on(NODE, oid, "again-on-0")]))
    [(w, inv)] = executes(c.take())
    assert inv.resolved[0].segment.name == "again-on-0"
    return w, inv.call.task_id


def keeper(*args: Any, **spec: Any) -> Any:
    """The constructor call of an actor Keeper (max_restarts=1) held on node 0 ("here")."""
    from orchestra._proto import types_pb2
    return make_call("Keeper.__init__", args, cpus=0, num_returns=0, resources={"here": 1.0},
                     actor=types_pb2.ActorSpec(max_restarts=1, class_name="Keeper", **spec))


@pytest.mark.parametrize("how", ["its worker died", "its worker handed it back",
                                 "it raised and is retried"])
def test_a_sent_task_that_runs_again_after_its_argument_was_lost_waits_for_it(how):
    # Sent to a worker before the node holding its argument died (so wait_again left it
    # alone), then queued again: its worker died, it was handed back (STEAL), or it
    # raised with retry_exceptions. Queued as ready it was dispatched with no data for
    # the argument, and the head's loop died on a TypeError (found by the fault soak
    # with node kills every 8 s). It waits for the argument made again now.
    c, w0, busy, make, oid = argument_on_other_node()
    consumer = make_call("consumer", (ref(oid),), resources={"zero": 1.0}, max_retries=2)
    consumer.retry_exceptions = True
    c.submit(consumer)
    if how == "it raised and is retried":
        c.done(w0, busy)
    assert (w0, consumer.task_id) in executed(c.take())   # sent to w0
    c.s.remove_node(OTHER, "killed")
    assert c.s.objects[oid].data is None   # pending again: made again
    c.take()
    if how == "its worker died":
        c.s.worker_died(w0, "killed by a signal")
        (w0,) = c.started(c.take())
        c.connect(w0)
    elif how == "its worker handed it back":
        c.s.return_tasks(worker_conn(w0), [consumer.task_id])
        c.done(w0, busy)
    else:
        c.s.task_done(worker_conn(w0), TaskDone(
            task_id=consumer.task_id, user_error=True,
            returns=[values.error_value(rid(consumer), b"raised")]))
    assert c.s.tasks[consumer.task_id].state is TaskState.WAITING
    sent = executed(c.take())
    assert consumer.task_id not in [t for _, t in sent]
    assert made_again_then_sent(c, w0, make, oid, sent) == (w0, consumer.task_id)


def test_a_removed_nodes_workers_that_never_connected_fail_to_start():
    c = Cluster(cpus=1)
    c.s.add_node(OTHER, {"CPU": 1.0}, num_workers=1, max_workers=4)
    (w2,) = c.started(c.take())
    c.s.remove_node(OTHER, "killed")
    assert w2 not in c.s.workers
    assert OTHER not in c.s.nodes


def _loans(out):
    return [i for i in out if type(i) is Loan]


@pytest.mark.parametrize("tcp", [False, True])
def test_a_worker_on_another_node_is_lent_over_tcp_once_it_said_where(tcp):
    c = Cluster(cpus=1, lending=True)
    (w0,) = c.pool
    if tcp:
        c.s.worker_pool.worker_address(worker_conn(w0), "10.0.0.1:4242")
    # A second driver, on another node: the worker on node 0 is lent to it over TCP,
    # or not at all while the worker has no TCP address.
    c.s.client_connected(7, Hello(kind="driver", pid=7), OTHER)
    c.submit(make_call("f"), conn=7)
    loans = _loans(c.take())
    assert [(ln.worker_id, ln.path) for ln in loans] == ([(w0, "10.0.0.1:4242")] if tcp else [])


def test_a_driver_on_the_workers_node_is_lent_its_unix_socket():
    c = Cluster(cpus=1, lending=True)
    (w0,) = c.pool
    c.s.worker_pool.worker_address(worker_conn(w0), "10.0.0.1:4242")
    c.submit(make_call("f"))
    (loan,) = _loans(c.take())
    assert loan.path.endswith(f"w{w0}.sock") and loan.pinned_node == 0


def test_a_task_bound_to_a_node_gets_a_worker_lent_for_that_node_only():
    c, w0, w2 = two_nodes()
    c.s.lending = True
    c.s.worker_socket = lambda node_id, worker_id: f"/tmp/w{worker_id}.sock"
    c.s.worker_pool.worker_address(worker_conn(w2), "10.0.0.2:4242")
    call = c.submit(make_call("f", placement=affinity(OTHER)))
    out = c.take()
    assert [w for w, _ in executes(out)] == [w2]
    (loan,) = _loans(out)
    assert (loan.worker_id, loan.path, loan.pinned_node) == (w2, "10.0.0.2:4242", OTHER + 1)
    # A task of the driver that may run anywhere is not sent to that loan: its key
    # differs (the driver keys pinned loans apart), and a soft-bound task gets none.
    c.s.task_done(worker_conn(w2), TaskDone(task_id=call.task_id, returns=[]))
    c.take()
    c.submit(make_call("g", placement=affinity(NODE, soft=True)))
    assert _loans(c.take()) == []


@pytest.mark.parametrize("same_node", [True, False])
def test_direct_calls_are_lent_only_to_drivers_on_the_workers_node(same_node):
    c = Cluster(cpus=1, lending=True)
    # A second driver, on node 2 (or node 0), and a worker on node 0 it could borrow.
    c.s.client_connected(7, Hello(kind="driver", pid=7), 0 if same_node else OTHER)
    c.submit(make_call("f"), conn=7)
    out = c.take()
    loans = [i for i in out if type(i) is Loan]
    assert bool(loans) == same_node


def test_a_dead_nodes_workers_still_starting_do_not_count_as_a_broken_environment():
    # Three failed starts in a row fail every ready task ("worker processes fail to
    # start"); a node dying with three workers starting is not that.
    c = Cluster(cpus=1)
    (w0,) = c.pool
    busy = c.submit(make_call("busy"))
    c.take()
    c.s.add_node(OTHER, {"CPU": 3.0}, num_workers=3, max_workers=8)
    assert len(c.started(c.take())) == 3
    waiting = c.submit(make_call("waits"))
    c.take()
    c.s.remove_node(OTHER, "killed")
    assert c.s.start_failures == 0
    out = c.take()
    c.done(w0, busy)
    out += c.take()
    assert [(w, inv.call.task_id) for w, inv in executes(out)] == [(w0, waiting.task_id)]


def _drop(c: Cluster, oid: bytes) -> None:
    c.s.directory.ref_delta(DRIVER, [], [oid])


@pytest.mark.parametrize("inline_first", [False, True])
def test_a_lost_argument_whose_own_argument_was_freed_is_made_again_from_its_lineage(inline_first):
    # make -> step, the driver keeping only step's result: make's result is freed when
    # step ends. A consumer waits on step's result, which was on node 2 alone; node 2
    # dies. Running step again needs make's result: its value was freed but its
    # lineage was kept (a freed value named by a kept lineage), so make runs again
    # first (before: the rebuild failed with "freed when its last ref was dropped").
    # A small (inline) first result keeps its value instead.
    c, w0, w2 = two_nodes()
    there = affinity(OTHER, soft=True)   # may run again elsewhere
    make = c.submit(make_call("make", placement=there, max_retries=1))
    assert executed(c.take()) == [(w2, make.task_id)]
    first = rid(make)
    made = inline_data(first, "small") if inline_first else seg_on(OTHER, first, "make-on-2")
    c.s.task_done(worker_conn(w2), TaskDone(task_id=make.task_id, returns=[made]))
    step = c.submit(make_call("step", (ref(first),), placement=there, max_retries=1))
    _drop(c, first)
    assert executed(c.take()) == [(w2, step.task_id)]
    second = rid(step)
    c.s.task_done(worker_conn(w2), TaskDone(task_id=step.task_id,
                                               returns=[seg_on(OTHER, second, "step-on-2")]))
    assert first not in c.s.objects   # freed: its value is gone
    gate = c.submit(make_call("gate"))
    consumer = c.submit(make_call("consumer", (ref(second), ref(rid(gate)))))
    _drop(c, second)
    assert executed(c.take()) == [(w0, gate.task_id)]
    c.s.remove_node(OTHER, "killed")
    c.done(w0, gate)
    out = c.take()
    if inline_first:   # its value was kept: step runs again at once
        assert executed(out) == [(w0, step.task_id)]
        [(_, inv)] = executes(out)
        assert inv.resolved[0].payload == made.payload
    else:
        assert executed(out) == [(w0, make.task_id)]
        c.s.task_done(worker_conn(w0), TaskDone(task_id=make.task_id,
                                                   returns=[seg_on(NODE, first, "make-on-0")]))
        [(w, inv)] = executes(c.take())
        assert (w, inv.call.task_id) == (w0, step.task_id)
        assert inv.resolved[0].segment.name == "make-on-0"
    c.s.task_done(worker_conn(w0), TaskDone(task_id=step.task_id,
                                               returns=[seg_on(NODE, second, "step-on-0")]))
    [(w, inv)] = executes(c.take())
    assert (w, inv.call.task_id) == (w0, consumer.task_id)
    assert inv.resolved[0].segment.name == "step-on-0"
    # What only lineage kept goes with the last ref to what it could make.
    c.done(w0, consumer)
    c.take()
    assert first not in c.s.objects and second not in c.s.objects
    assert not c.s.directory.lineage_refs and not c.s.directory.tombs


def test_a_put_argument_a_kept_lineage_names_keeps_its_value_until_that_lineage_goes():
    # The first step of a chain took a value the driver put (no lineage: nothing can
    # make it again). Freed when the step ended, its segment would be gone when the
    # step's result, lost with its node, must be made again: it is kept instead, and
    # freed with the last lineage naming it.
    c, w0, w2 = two_nodes()
    put_id = bytes(12) + b"\x00\x00\x00\x09"
    c.s.directory.put(DRIVER, seg_on(NODE, put_id, "put-on-0"))
    step = c.submit(make_call("step", (ref(put_id),), placement=affinity(OTHER, soft=True),
                              max_retries=1))
    _drop(c, put_id)
    assert executed(c.take()) == [(w2, step.task_id)]
    second = rid(step)
    c.s.task_done(worker_conn(w2), TaskDone(task_id=step.task_id,
                                               returns=[seg_on(OTHER, second, "step-on-2")]))
    assert "put-on-0" not in freed_segments(c.take())   # kept for the lineage
    gate = c.submit(make_call("gate"))
    consumer = c.submit(make_call("consumer", (ref(second), ref(rid(gate)))))
    _drop(c, second)
    c.take()
    c.s.remove_node(OTHER, "killed")
    c.done(w0, gate)
    [(w, inv)] = executes(c.take())
    assert (w, inv.call.task_id) == (w0, step.task_id)
    assert inv.resolved[0].segment.name == "put-on-0"
    c.s.task_done(worker_conn(w0), TaskDone(task_id=step.task_id,
                                               returns=[seg_on(NODE, second, "step-on-0")]))
    # Made again with no retry left, the result keeps no lineage: nothing names the
    # put any more, and its segment goes.
    assert "put-on-0" in freed_segments(c.take())
    c.done(w0, consumer)
    c.take()
    assert not c.s.directory.lineage_refs and not c.s.directory.tombs


def test_an_actor_call_retried_after_its_argument_was_lost_waits_for_it():
    # The same for an actor's call in flight (max_task_retries=) when its process died:
    # run again on the restarted instance once its argument is made again.
    c, w0, busy, make, oid = argument_on_other_node()
    ctor = keeper(max_task_retries=1)
    c.s.create_actor(DRIVER, ctor)
    (wa,) = c.started(c.take())
    c.connect(wa)
    c.done(wa, ctor)
    c.take()
    call = make_call("use", (ref(oid),), cpus=0, max_retries=1)
    call.actor_id = ctor.actor.actor_id
    c.submit(call)
    assert (wa, call.task_id) in executed(c.take())
    c.s.remove_node(OTHER, "killed")
    c.take()
    c.s.worker_died(wa, "killed by a signal")   # the actor restarts; its call is retried
    (wa,) = c.started(c.take())
    c.connect(wa)
    c.done(wa, ctor)
    sent = executed(c.take())
    assert call.task_id not in [t for _, t in sent]   # not sent with no data for oid
    c.done(w0, busy)
    assert made_again_then_sent(c, w0, make, oid, executed(c.take())) == (wa, call.task_id)


def test_a_restarted_actor_whose_constructor_argument_was_lost_waits_for_it():
    c, w0, busy, make, oid = argument_on_other_node()
    ctor = keeper(ref(oid))
    c.s.create_actor(DRIVER, ctor)
    (wa,) = c.started(c.take())
    c.connect(wa)
    c.done(wa, ctor)
    c.take()
    c.s.remove_node(OTHER, "killed")
    c.take()
    c.s.worker_died(wa, "killed by a signal")   # the actor restarts
    (wa,) = c.started(c.take())
    c.connect(wa)
    assert executed(c.take()) == []   # its constructor waits for its argument
    c.done(w0, busy)
    assert made_again_then_sent(c, w0, make, oid, executed(c.take())) == (wa, ctor.task_id)
    assert len(c.s.workers) == 2   # no second process was started for it
