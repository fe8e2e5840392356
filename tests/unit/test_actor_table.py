"""ActorTable: placement, call order, death, restarts, names, handles. No processes.

Driven through SchedulerState's events (create_actor, submit, client_connected,
task_done, worker_died, kill, ref_delta), read from the instructions it emits.
"""
from __future__ import annotations

from typing import Any

import pytest

from _sched_helpers import (
    DRIVER,
    NODE,
    Cluster,
    error_of,
    executed,
    inline_data,
    make_call,
    new_id,
    pushes,
    ref,
    rid,
    sent,
    socket_path,
    worker_conn,
)
from orchestra._proto import types_pb2
from orchestra._scheduler import data as values
from orchestra._scheduler.actors import ActorState
from orchestra._scheduler.events import TaskDone
from orchestra._scheduler.instructions import ActorAddress, KillWorker, StartWorker

pytestmark = pytest.mark.timeout(10)


def actor_call(class_name: str = "Counter", *, name: str = "", max_restarts: int = 0,
               max_concurrency: int = 1, cpus: float = 1.0, args: tuple[Any, ...] = ()) -> Any:
    """The constructor call of a new actor (as the client's ActorClass.remote builds it)."""
    return make_call(f"{class_name}.__init__", args, cpus=cpus, num_returns=0,
                     actor=types_pb2.ActorSpec(name=name, max_restarts=max_restarts,
                                               max_concurrency=max_concurrency,
                                               class_name=class_name))


def method(ctor: Any, name: str = "inc", args: tuple[Any, ...] = ()) -> Any:
    return make_call(name, args, cpus=0, actor_id=ctor.actor.actor_id)


def create(c: Cluster, ctor: Any, conn: int = DRIVER) -> list[int]:
    """Create the actor; the ids of the workers started for it."""
    c.s.create_actor(conn, ctor)
    return c.started(c.take())


def alive(c: Cluster, ctor: Any) -> int:
    """Create the actor, connect its worker and finish its constructor (the instructions
    of all that taken): its worker id."""
    [wid] = create(c, ctor)
    c.connect(wid)
    c.done(wid, ctor)
    c.take()
    return wid


def state_of(c: Cluster, ctor: Any) -> ActorState:
    return c.s.actor_table.actors[ctor.actor.actor_id].state


def empty() -> Cluster:
    """A one-CPU node with no task worker: the worker ids seen are the actors'."""
    return Cluster(cpus=1, workers=0)


# ------------------------------------------------------------------ placement

def test_an_actor_gets_a_dedicated_worker_on_a_node_that_fits_it():
    c = empty()
    ctor = actor_call()
    c.s.create_actor(DRIVER, ctor)
    assert c.take() == [StartWorker(NODE, 1)]
    w = c.worker(1)
    assert w.actor is c.s.actor_table.actors[ctor.actor.actor_id]
    assert w.grant == {"CPU": 1.0} and c.available()["CPU"] == 0.0
    assert state_of(c, ctor) is ActorState.STARTING


def test_the_constructor_runs_once_the_dedicated_worker_connects():
    c = empty()
    ctor = actor_call()
    [wid] = create(c, ctor)
    c.connect(wid)
    assert executed(c.take()) == [(wid, ctor.task_id)]
    c.done(wid, ctor)
    assert state_of(c, ctor) is ActorState.ALIVE


def test_an_actor_that_does_not_fit_waits_and_is_placed_when_resources_free():
    c = empty()
    first, second = actor_call("First"), actor_call("Second")
    w1 = alive(c, first)
    assert create(c, second) == []
    assert state_of(c, second) is ActorState.PENDING
    c.s.actor_table.kill(first.actor.actor_id, no_restart=True)
    assert c.take() == [KillWorker(NODE, w1, "killed by orchestra.kill()")]
    c.s.worker_died(w1, "killed")
    assert c.started(c.take()) == [w1 + 1]
    assert state_of(c, second) is ActorState.STARTING


# ------------------------------------------------------------------ calls

def test_calls_wait_for_the_constructor_then_go_in_the_order_received():
    c = empty()
    ctor = actor_call()
    [wid] = create(c, ctor)
    calls = [c.submit(method(ctor, f"m{i}")) for i in range(3)]
    c.connect(wid)
    assert executed(c.take()) == [(wid, ctor.task_id)]
    c.done(wid, ctor)
    assert executed(c.take()) == [(wid, call.task_id) for call in calls]


def test_a_call_waiting_for_its_argument_holds_back_the_calls_behind_it():
    c = empty()
    ctor = actor_call()
    wid = alive(c, ctor)
    producer = make_call("producer", cpus=0)
    c.s.directory.new_object(DRIVER, rid(producer))   # a result some other task will seal
    first = c.submit(method(ctor, "first", (ref(rid(producer)),)))
    second = c.submit(method(ctor, "second"))
    assert executed(c.take()) == []
    c.s.directory.put(DRIVER, inline_data(rid(producer)))
    assert executed(c.take()) == [(wid, first.task_id), (wid, second.task_id)]


def test_every_queued_call_goes_to_the_actor_process_which_runs_max_concurrency_at_once():
    # The head does not hold calls back for max_concurrency: the actor's process runs
    # that many at once (threads or coroutines) and queues the rest itself.
    c = empty()
    ctor = actor_call(max_concurrency=2)
    wid = alive(c, ctor)
    calls = [c.submit(method(ctor, f"m{i}")) for i in range(5)]
    assert executed(c.take()) == [(wid, call.task_id) for call in calls]


def test_callers_learn_the_actor_address_with_the_count_of_their_calls_sent():
    c = Cluster(cpus=1, workers=0, worker_socket=True)
    ctor = actor_call()
    [wid] = create(c, ctor)
    for i in range(2):
        c.submit(method(ctor, f"m{i}"))
    c.connect(wid)
    c.done(wid, ctor)
    assert sent(c.take(), ActorAddress, DRIVER) == [ActorAddress(
        DRIVER, ctor.actor.actor_id, wid, socket_path(0, wid), dispatched=2)]


def test_a_caller_learns_the_address_only_once_its_queued_calls_are_all_sent():
    c = Cluster(cpus=1, workers=0, worker_socket=True)
    ctor = actor_call()
    wid = alive(c, ctor)
    producer = make_call("producer", cpus=0)
    c.s.directory.new_object(DRIVER, rid(producer))
    c.submit(method(ctor, "waits", (ref(rid(producer)),)))
    assert sent(c.take(), ActorAddress) == []
    c.s.directory.put(DRIVER, inline_data(rid(producer)))
    [address] = sent(c.take(), ActorAddress, DRIVER)
    assert address.worker_id == wid and address.dispatched == 1


def test_a_call_to_an_unknown_actor_fails():
    c = empty()
    call = make_call("inc", cpus=0)
    call.actor_id = new_id() + b"\xff\xff\xff\xff"
    c.submit(call)
    assert b"no such actor" in error_of(c.take(), rid(call))


# ------------------------------------------------------------------ failures

def test_a_constructor_that_raises_fails_every_queued_call_with_its_error():
    c = empty()
    ctor = actor_call()
    [wid] = create(c, ctor)
    calls = [c.submit(method(ctor, f"m{i}")) for i in range(2)]
    c.connect(wid)
    c.take()
    c.s.task_done(worker_conn(wid), TaskDone(
        task_id=ctor.task_id, user_error=True,
        returns=[values.error_value(rid(ctor), b"ValueError in __init__")]))
    out = c.take()
    assert [error_of(out, rid(call)) for call in calls] == [b"ValueError in __init__"] * 2
    assert KillWorker(NODE, wid, "the actor's constructor raised") in out
    assert state_of(c, ctor) is ActorState.DEAD


def test_a_dead_process_fails_the_calls_in_flight_and_restarts_the_actor():
    c = empty()
    ctor = actor_call(max_restarts=1)
    wid = alive(c, ctor)
    running = c.submit(method(ctor, "running"))
    c.take()
    c.s.worker_died(wid, "SIGKILL")
    out = c.take()
    err = error_of(out, rid(running))
    assert b"actor_dead" in err and b"died while running running()" in err and b"pid=" in err
    assert c.started(out) == [wid + 1]
    assert state_of(c, ctor) is ActorState.RESTARTING


def test_calls_made_during_a_restart_reach_the_new_instance():
    c = empty()
    ctor = actor_call(max_restarts=1)
    wid = alive(c, ctor)
    c.s.worker_died(wid, "SIGKILL")
    [new] = c.started(c.take())
    later = c.submit(method(ctor, "later"))
    c.connect(new)
    assert executed(c.take()) == [(new, ctor.task_id)]   # the constructor runs again first
    c.done(new, ctor)
    assert executed(c.take()) == [(new, later.task_id)]


def test_an_actor_whose_restarts_are_spent_dies_naming_the_count():
    c = empty()
    ctor = actor_call(max_restarts=1)
    wid = alive(c, ctor)
    c.s.worker_died(wid, "SIGKILL")
    [new] = c.started(c.take())
    c.connect(new)
    c.done(new, ctor)
    c.s.worker_died(new, "SIGSEGV")
    assert c.started(c.take()) == []
    assert state_of(c, ctor) is ActorState.DEAD
    call = c.submit(method(ctor))
    err = error_of(c.take(), rid(call))
    assert b"('restarts', 1)" in err and b"('max_restarts', 1)" in err and b"SIGSEGV" in err


def test_max_restarts_minus_one_restarts_for_ever():
    c = empty()
    ctor = actor_call(max_restarts=-1)
    wid = alive(c, ctor)
    for _ in range(5):
        c.s.worker_died(wid, "SIGKILL")
        [wid] = c.started(c.take())
        c.connect(wid)
        c.done(wid, ctor)
    assert state_of(c, ctor) is ActorState.ALIVE


# ------------------------------------------------------------------ kill

def test_kill_with_no_restart_kills_its_worker_and_fails_the_calls_that_follow():
    c = empty()
    ctor = actor_call(max_restarts=3)
    wid = alive(c, ctor)
    c.s.actor_table.kill(ctor.actor.actor_id, no_restart=True)
    assert c.take() == [KillWorker(NODE, wid, "killed by orchestra.kill()")]
    held = c.submit(method(ctor, "held"))   # waits for the death to be seen
    assert executed(c.take()) == []
    c.s.worker_died(wid, "killed by orchestra.kill()")
    out = c.take()
    assert b"actor_dead" in error_of(out, rid(held)) and c.started(out) == []


def test_kill_without_no_restart_restarts_it_and_holds_calls_for_the_new_instance():
    c = empty()
    ctor = actor_call(max_restarts=1)
    wid = alive(c, ctor)
    c.s.actor_table.kill(ctor.actor.actor_id, no_restart=False)
    c.take()
    held = c.submit(method(ctor, "held"))
    assert executed(c.take()) == []
    c.s.worker_died(wid, "killed by orchestra.kill()")
    [new] = c.started(c.take())
    c.connect(new)
    assert executed(c.take()) == [(new, ctor.task_id)]
    c.done(new, ctor)
    assert executed(c.take()) == [(new, held.task_id)]


def test_killing_an_actor_that_waits_for_resources_ends_it():
    c = empty()
    alive(c, actor_call("First"))
    second = actor_call("Second")
    create(c, second)
    c.s.actor_table.kill(second.actor.actor_id, no_restart=False)
    assert state_of(c, second) is ActorState.DEAD and c.s.actor_table.pending == []


# ------------------------------------------------------------------ names

def test_a_taken_name_is_refused_with_value_error():
    c = Cluster(cpus=2, workers=0)
    create(c, actor_call(name="counter"))
    with pytest.raises(ValueError, match="already taken"):
        c.s.create_actor(DRIVER, actor_call(name="counter"))


def test_an_actor_is_found_by_its_name_and_an_unknown_name_raises():
    c = empty()
    ctor = actor_call(name="counter")
    create(c, ctor)
    assert c.s.actor_table.get("counter").actor_id == ctor.actor.actor_id
    with pytest.raises(ValueError, match="no live actor is named 'other'"):
        c.s.actor_table.get("other")


def test_a_name_is_free_again_once_its_actor_died():
    c = empty()
    ctor = actor_call(name="counter")
    wid = alive(c, ctor)
    c.s.worker_died(wid, "SIGKILL")
    with pytest.raises(ValueError):
        c.s.actor_table.get("counter")
    create(c, actor_call(name="counter"))   # no ValueError


def test_kill_with_no_restart_frees_the_name_before_the_death_is_seen():
    c = empty()
    ctor = actor_call(name="counter")
    alive(c, ctor)
    c.s.actor_table.kill(ctor.actor.actor_id, no_restart=True)
    with pytest.raises(ValueError):
        c.s.actor_table.get("counter")


# ------------------------------------------------------------------ handles

def test_the_last_handle_gone_stops_an_idle_actor():
    c = empty()
    ctor = actor_call()
    wid = alive(c, ctor)
    c.s.directory.ref_delta(DRIVER, (), (ctor.actor.actor_id,))
    assert c.take() == [KillWorker(NODE, wid, "no handle to it is left")]
    assert state_of(c, ctor) is ActorState.DEAD


def test_the_last_handle_gone_lets_the_calls_in_flight_finish_first():
    c = empty()
    ctor = actor_call()
    wid = alive(c, ctor)
    running = c.submit(method(ctor, "running"))
    c.take()
    c.s.directory.ref_delta(DRIVER, (), (ctor.actor.actor_id,))
    assert c.take() == []
    c.done(wid, running, "result")
    out = c.take()
    assert rid(running) in pushes(out)
    assert KillWorker(NODE, wid, "no handle to it is left") in out


def test_a_named_actor_outlives_its_handles():
    c = empty()
    ctor = actor_call(name="service")
    alive(c, ctor)
    c.s.directory.ref_delta(DRIVER, (), (ctor.actor.actor_id,))
    assert c.take() == []
    assert state_of(c, ctor) is ActorState.ALIVE
