"""Direct calls answered through the head whose answer the head may not have read,
handed back by their caller (AdoptCalls.answered; orchestra/_scheduler/adoption.py),
driven on the SchedulerState directly (helpers: tests/unit/_sched_helpers.py).

A worker lent to a driver answers a large result through the head (its TaskDone on its
own connection) and tells the driver on another: the head may read the driver's next
frames first, and never reads that answer when the worker died with its node (it voids
what a dead node's workers said). The driver hands such calls back when its connection
to the worker closes, or when it gives the worker back.
"""
from __future__ import annotations

import pickle
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
)
from orchestra._scheduler.events import AdoptCalls, TaskDone
from orchestra._scheduler.model import DeadWorker

pytestmark = pytest.mark.timeout(10)

GONE = 999     # a worker the head does not remember
NO_CONN = 77   # a connection with no worker (a late answer's, the worker forgotten)


def hand_back(c: Cluster, call: Any, worker_id: int = GONE) -> list[Any]:
    """The driver hands back ``call``, answered through the head by ``worker_id``, not
    pushed to it yet."""
    c.s.adoption.adopt_calls(DRIVER, AdoptCalls(worker_id=worker_id, calls=[call],
                                          answered=[call.task_id]))
    return c.take()


def answer(c: Cluster, conn: int, call: Any, value: Any = "first") -> list[Any]:
    """A worker's answer of a direct call through the head (TaskDone naming its owner)."""
    c.s.task_done(conn, TaskDone(task_id=call.task_id, owner=DRIVER,
                                    returns=[inline_data(rid(call), value)]))
    return c.take()


def value_of(out: list[Any], call: Any) -> Any:
    return pickle.loads(pushes(out)[rid(call)].payload)


def test_an_answer_never_read_by_the_head_of_a_dead_worker_runs_again_with_a_retry_spent() -> None:
    c = Cluster(cpus=1)
    call = make_call("direct", max_retries=2)
    assert executed(hand_back(c, call)) == [(c.pool[0], call.task_id)]
    assert c.s.tasks[call.task_id].retries_left == 1
    c.done(c.pool[0], call, "again")
    assert value_of(c.take(), call) == "again"


def test_an_answer_never_read_without_retries_fails_naming_the_node_and_pid() -> None:
    c = Cluster(cpus=1)
    call = make_call("direct")
    c.s.dead_workers[998] = DeadWorker(4242, "died of SIGKILL", False, 3)
    err = error_of(hand_back(c, call, 998), rid(call))
    assert b"node_lost" in err and b"('node', 3)" in err and b"pid=4242" in err


def test_an_answer_never_read_of_a_worker_not_remembered_fails_without_a_made_up_node() -> None:
    c = Cluster(cpus=1)
    call = make_call("direct")
    err = error_of(hand_back(c, call), rid(call))
    assert b"node_lost" in err and b"-1" not in err and b"pid=0" not in err
    assert b"that ran it" in err


def test_an_answer_the_head_read_already_is_not_run_again() -> None:
    c = Cluster(cpus=1)
    call = make_call("direct", max_retries=2)
    assert value_of(answer(c, NO_CONN, call), call) == "first"
    assert executed(hand_back(c, call)) == []
    assert call.task_id not in c.s.tasks


def test_a_call_whose_result_is_rebuilt_already_is_not_run_twice() -> None:
    c = Cluster(cpus=1)
    call = make_call("direct", max_retries=2)
    running = make_call("direct", max_retries=2)
    running.task_id = call.task_id
    c.submit(running)   # its task runs again already (a rebuild, or a resubmit)
    assert executed(c.take())
    assert hand_back(c, call) == []
    assert c.s.tasks[call.task_id].call is running


def test_an_answer_a_live_worker_still_owes_is_waited_for_not_run_again() -> None:
    # The worker lives (the loan went back, or only the connection closed): all it wrote
    # reaches the head. Run again meanwhile, the first answer ended the run again's task
    # under it, its arguments freed while read ("freed while it was being read").
    c = Cluster(cpus=2)
    lent, other = c.pool
    call = make_call("direct", max_retries=2)
    assert hand_back(c, call, lent) == []
    assert call.task_id not in c.s.tasks
    assert value_of(answer(c, 100 + lent, call), call) == "first"
    assert c.s.adoption.unread == {}
    c.s.worker_died(lent, "killed")   # later: nothing is owed any more
    assert executed(c.take()) == []


def test_an_answer_a_worker_owed_when_it_died_runs_again() -> None:
    c = Cluster(cpus=2)
    lent, other = c.pool
    call = make_call("direct", max_retries=2)
    assert hand_back(c, call, lent) == []
    c.s.worker_died(lent, "died with its node")
    assert (other, call.task_id) in executed(c.take())
    assert c.s.adoption.unread == {}


def test_a_late_answer_stands_and_the_run_again_keeps_its_arguments_until_it_ends() -> None:
    # The worker's death was told first (by its node), its answer read after its call
    # ran again: ending the run again's task then released its arguments while it read
    # them.
    c = Cluster(cpus=1)
    arg = new_id() + bytes(4)
    c.s.directory.put(DRIVER, inline_data(arg, "arg"))
    call = make_call("direct", (ref(arg),), max_retries=2)
    assert executed(hand_back(c, call)) == [(c.pool[0], call.task_id)]
    assert value_of(answer(c, NO_CONN, call), call) == "first"
    c.s.directory.ref_delta(DRIVER, [], [arg])   # the driver lets the argument go (it was pushed)
    assert arg in c.s.objects, "the run again's argument was freed while it ran"
    c.done(c.pool[0], call, "again")
    out = c.take()
    assert rid(call) not in pushes(out)   # the first answer stands
    assert arg not in c.s.objects


def test_a_late_answer_after_its_result_was_dropped_makes_nothing_anew() -> None:
    # It made the result again, held for a driver that had dropped it: leaked.
    c = Cluster(cpus=1)
    call = make_call("direct", max_retries=2)
    hand_back(c, call)
    c.done(c.pool[0], call, "again")
    assert value_of(c.take(), call) == "again"
    c.s.directory.ref_delta(DRIVER, [], [rid(call)])
    assert rid(call) not in c.s.objects
    answer(c, NO_CONN, call)
    assert rid(call) not in c.s.objects
    assert c.s.clients[DRIVER].holds.get(rid(call), 0) == 0


def test_an_actor_call_whose_answer_was_never_read_fails_as_one_in_flight() -> None:
    c = Cluster(cpus=1)
    call = make_call("method", max_retries=0)
    call.actor_id = new_id()
    c.s.dead_workers[998] = DeadWorker(4242, "died of SIGKILL", False, NODE)
    c.s.adoption.adopt_calls(DRIVER, AdoptCalls(actor_id=call.actor_id, worker_id=998,
                                          calls=[call], answered=[call.task_id]))
    err = error_of(c.take(), rid(call))
    assert b"actor_dead" in err and b"pid=4242" in err


def test_a_call_run_again_for_a_dead_workers_answer_is_not_sent_to_that_worker() -> None:
    # It runs again while the head carries out that worker's death.
    c = Cluster(cpus=1)
    (lent,) = c.pool
    call = make_call("direct", max_retries=2)
    hand_back(c, call, lent)
    c.s.worker_died(lent, "died with its node")
    assert lent not in [w for w, _ in executed(c.take())]
    assert c.s.tasks[call.task_id].worker is None or c.s.tasks[call.task_id].worker.worker_id != lent


def test_a_late_answer_of_a_call_left_unanswered_and_run_again_makes_nothing_anew() -> None:
    # The worker's death told first, its call handed over unanswered and run again; its
    # own answer (through the head: its caller's connection was gone) read after the
    # driver dropped the result made that result again for it.
    c = Cluster(cpus=1)
    call = make_call("direct", max_retries=2)
    c.s.dead_workers[998] = DeadWorker(4242, "killed", False, NODE)
    c.s.adoption.adopt_calls(DRIVER, AdoptCalls(worker_id=998, calls=[call]))
    assert executed(c.take()) == [(c.pool[0], call.task_id)]
    c.done(c.pool[0], call, "again")
    assert value_of(c.take(), call) == "again"
    c.s.directory.ref_delta(DRIVER, [], [rid(call)])
    answer(c, NO_CONN, call)
    assert rid(call) not in c.s.objects
