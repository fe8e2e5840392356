"""The scheduler's side of actor and task options: names per namespace, get_if_exists,
actors ending with their driver unless detached, max_task_retries across a restart,
max_calls retiring a worker. No processes (tests/unit/_sched_helpers)."""
from __future__ import annotations

from typing import Any

import pytest

from _sched_helpers import DRIVER, Cluster, error_of, executed, make_call, rid, sent, worker_conn
from orchestra._head.inbound import call_in
from orchestra._proto import types_pb2
from orchestra._scheduler.actors import ActorState
from orchestra._scheduler.events import Hello
from orchestra._scheduler.instructions import Loan, ReturnTasks, StartWorker, StopWorker

pytestmark = pytest.mark.timeout(10)

OTHER = 2   # a second driver's connection


def actor_call(name: str = "", *, namespace: str = "", get_if_exists: bool = False,
               detached: bool = False, max_restarts: int = 0, max_task_retries: int = 0) -> Any:
    return make_call("Counter.__init__", cpus=0, num_returns=0, actor=types_pb2.ActorSpec(
        name=name, class_name="Counter", namespace=namespace, get_if_exists=get_if_exists,
        detached=detached, max_restarts=max_restarts, max_task_retries=max_task_retries,
        max_concurrency=1))


def method(ctor: Any, retries: int = 0) -> Any:
    return make_call("inc", cpus=0, max_retries=retries, actor_id=ctor.actor.actor_id)


def cluster_with(*drivers: tuple[int, str]) -> Cluster:
    c = Cluster(cpus=1, workers=0)
    c.s.clients[DRIVER].namespace = "ns-driver"
    for conn, ns in drivers:
        c.s.client_connected(conn, Hello(kind="driver", pid=conn, namespace=ns))
    return c


def alive(c: Cluster, ctor: Any, conn: int = DRIVER) -> int:
    assert c.s.create_actor(conn, ctor) is None
    [wid] = [i.worker_id for i in c.take() if type(i) is StartWorker]
    c.connect(wid)
    c.done(wid, ctor)
    c.take()
    return wid


# ------------------------------------------------------------------ namespaces

def test_an_actor_s_name_lives_in_its_creator_s_namespace():
    c = cluster_with()
    ctor = actor_call("svc")
    c.s.create_actor(DRIVER, ctor)
    assert c.s.actor_table.get("svc", conn=DRIVER).actor_id == ctor.actor.actor_id
    assert c.s.actor_table.get("svc", "ns-driver").namespace == "ns-driver"


def test_the_same_name_in_two_namespaces_is_two_actors():
    c = cluster_with((OTHER, "ns-other"))
    c.s.create_actor(DRIVER, actor_call("svc"))
    c.s.create_actor(OTHER, actor_call("svc"))
    assert c.s.actor_table.get("svc", conn=DRIVER) != c.s.actor_table.get("svc", conn=OTHER)


def test_a_lookup_in_the_wrong_namespace_names_where_the_actor_is():
    c = cluster_with((OTHER, "ns-other"))
    c.s.create_actor(DRIVER, actor_call("svc"))
    with pytest.raises(ValueError, match="namespace.*'ns-driver'"):
        c.s.actor_table.get("svc", conn=OTHER)


def test_a_task_s_actor_lives_in_the_namespace_of_the_driver_whose_task_it_runs():
    c = Cluster(cpus=1)
    c.s.clients[DRIVER].namespace = "ns-driver"
    c.submit(make_call("parent"))
    [(wid, _)] = executed(c.take())
    ctor = actor_call("child")
    c.s.create_actor(worker_conn(wid), ctor)
    assert c.s.actor_table.get("child", "ns-driver").actor_id == ctor.actor.actor_id


def test_get_if_exists_returns_the_live_actor_and_makes_nothing():
    c = cluster_with()
    first = actor_call("svc")
    c.s.create_actor(DRIVER, first)
    c.take()
    existing = c.s.create_actor(DRIVER, actor_call("svc", get_if_exists=True))
    assert existing.actor_id == first.actor.actor_id
    assert len(c.s.actor_table.actors) == 1 and not c.take()


def test_a_creation_made_again_makes_nothing_and_its_caller_holds_the_handle():
    """A driver whose head died before it answered makes the request again on the
    restarted head (_runtime/verbs.py), which may have kept the actor: the same id is
    not made twice (a name would be taken by itself), and the caller holds the handle
    once, whatever the number of tries."""
    c = cluster_with((OTHER, "ns-other"))
    first = actor_call("svc", detached=True)
    wid = alive(c, first)
    again = call_in(types_pb2.Call.FromString(first.wire.SerializeToString()))
    for _ in range(2):
        assert c.s.create_actor(OTHER, again) is None
    aid = first.actor.actor_id
    assert len(c.s.actor_table.actors) == 1 and not c.take()
    assert c.s.clients[OTHER].holds[aid] == 1 and c.s.objects[aid].count == 2
    assert c.s.actor_table.actors[aid].worker.worker_id == wid


# ------------------------------------------------------------------ lifetime

def test_a_driver_s_actors_end_with_it_unless_detached():
    c = cluster_with((OTHER, "ns-other"))
    plain, kept = actor_call("plain"), actor_call("kept", detached=True)
    alive(c, plain, OTHER)
    alive(c, kept, OTHER)
    c.s.client_disconnected(OTHER)
    table = c.s.actor_table
    assert table.actors[plain.actor.actor_id].state is ActorState.DEAD
    assert table.actors[kept.actor.actor_id].state is ActorState.ALIVE
    assert table.get("kept", "ns-other").actor_id == kept.actor.actor_id


# ------------------------------------------------------------------ max_task_retries

def test_a_call_in_flight_is_sent_again_to_the_restarted_actor():
    c = cluster_with()
    ctor = actor_call(max_restarts=1, max_task_retries=1)
    wid = alive(c, ctor)
    call = c.submit(method(ctor, retries=1))
    assert executed(c.take()) == [(wid, call.task_id)]
    c.s.client_disconnected(worker_conn(wid), "killed")
    [new] = [i.worker_id for i in c.take() if type(i) is StartWorker]
    c.connect(new)
    assert executed(c.take()) == [(new, ctor.task_id)]   # the constructor first
    c.done(new, ctor)
    assert executed(c.take()) == [(new, call.task_id)]


def test_without_retries_the_call_in_flight_fails_and_the_actor_restarts():
    c = cluster_with()
    ctor = actor_call(max_restarts=1)
    wid = alive(c, ctor)
    call = c.submit(method(ctor))
    c.take()
    c.s.client_disconnected(worker_conn(wid), "killed")
    out = c.take()
    assert error_of(out, rid(call))
    assert [i for i in out if type(i) is StartWorker]


# ------------------------------------------------------------------ max_calls

def test_a_worker_is_replaced_after_max_calls_of_a_function():
    c = Cluster(cpus=1)
    call = make_call("f")
    call.max_calls = 2
    first = c.submit(call)
    [(wid, _)] = executed(c.take())
    c.done(wid, first)
    c.take()
    second = make_call("f")
    second.max_calls = 2
    c.submit(second)
    assert executed(c.take()) == [(wid, second.task_id)]
    c.done(wid, second)
    out = c.take()
    assert [i.worker_id for i in out if type(i) is StopWorker] == [wid]
    assert [i for i in out if type(i) is StartWorker]
    assert wid not in c.s.workers


def test_tasks_queued_behind_the_last_call_are_asked_back():
    c = Cluster(cpus=1, pipeline_depth=2)
    calls = []
    for _ in range(2):
        call = make_call("f")
        call.max_calls = 1
        calls.append(c.submit(call))
    out = c.take()
    [wid] = {w for w, _ in executed(out)}
    c.done(wid, calls[0])
    [steal] = sent(c.take(), ReturnTasks)
    assert list(steal.task_ids) == [calls[1].task_id]
    c.s.return_tasks(worker_conn(wid), [calls[1].task_id])
    out = c.take()
    assert [i.worker_id for i in out if type(i) is StopWorker] == [wid]


def test_a_worker_running_a_max_calls_task_is_never_lent():
    c = Cluster(cpus=1, lending=True)
    call = make_call("f")
    call.max_calls = 1
    c.submit(call)
    out = c.take()
    [(wid, _)] = executed(out)
    c.done(wid, call)
    out += c.take()
    assert not sent(out, Loan) and [i for i in out if type(i) is StopWorker]


def test_nothing_is_pipelined_onto_a_retiring_worker_not_even_a_task_asking_for_nothing():
    c = Cluster(cpus=1, workers=1, max_workers=1, pipeline_depth=3)
    long = c.submit(make_call("long", cpus=0))
    last = make_call("f", cpus=0)
    last.max_calls = 1
    c.submit(last)
    [wid] = {w for w, _ in executed(c.take())}
    c.done(wid, last)   # the limit: it retires once "long" ends
    c.take()
    c.submit(make_call("free", cpus=0))
    assert executed(c.take()) == []
    c.done(wid, long)
    assert [i.worker_id for i in c.take() if type(i) is StopWorker] == [wid]
