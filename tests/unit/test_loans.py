"""Loans: idle workers lent to drivers for direct calls, and taken back. No processes.

A loan is a Loan instruction to the driver (the head writes it after the batch's other
frames: instructions.LATE); a recall is a LoanRecall; the driver's LOAN_RETURN reaches
the scheduler as return_loan.
"""
from __future__ import annotations

from typing import Any

import pytest

from _sched_helpers import (
    DRIVER,
    NODE,
    Cluster,
    executed,
    make_call,
    sent,
    socket_path,
    worker_conn,
)
from orchestra._scheduler.events import Hello
from orchestra._scheduler.instructions import (
    LATE,
    Execute,
    KillWorker,
    Loan,
    LoanRecall,
    ReturnTasks,
    StartWorker,
    StopWorker,
)
from orchestra._scheduler.model import TaskState, WorkerState

pytestmark = pytest.mark.timeout(10)

OTHER_DRIVER = 2


def loans(out: list[Any], conn: int = DRIVER) -> list[Any]:
    return sent(out, Loan, conn)


def recalls(out: list[Any]) -> list[tuple[int, int]]:
    """(driver connection, worker id) of every LoanRecall."""
    return [(ins.conn, ins.worker_id) for ins in sent(out, LoanRecall)]


def ready_then_connected(c: Cluster, *names: str) -> list[Any]:
    """Tasks submitted before the workers connect: one schedule() pass sees them all."""
    calls = [c.submit(make_call(name)) for name in names]
    for wid in c.pool:
        c.connect(wid)
    return calls


def lent(c: Cluster) -> Any:
    """A one-CPU cluster whose only worker is lent to the driver, its task done."""
    task = c.submit(make_call("first"))
    assert [m.worker_id for m in loans(c.take())] == [1]
    c.done(1, task)
    c.take()
    return task


# ------------------------------------------------------------------ lending

def test_a_worker_taken_idle_for_a_drivers_task_is_lent_to_that_driver():
    c = Cluster(cpus=2, lending=True)
    call = c.submit(make_call("f"))
    out = c.take()
    assert executed(out) == [(1, call.task_id)]
    assert loans(out) == [Loan(DRIVER, 1, socket_path(0, 1), {"CPU": 1.0}, 1001, call.task_id, 0)]
    assert c.worker(1).lent_to == DRIVER and c.s.loans.loaned == {1}


def test_the_loan_is_written_after_the_execute_it_names():
    c = Cluster(cpus=2, lending=True)
    call = c.submit(make_call("f"))
    out = c.take()
    assert [type(ins) for ins in out] == [Execute, Loan] and Loan in LATE
    assert out[0].call.task_id == out[1].busy_task == call.task_id


def test_nothing_is_lent_when_lending_is_off():
    c = Cluster(cpus=2, worker_socket=True)
    c.submit(make_call("f"))
    assert loans(c.take()) == []


def test_no_worker_is_lent_while_work_waits_for_one():
    c = Cluster(cpus=1, lending=True, pipeline_depth=1, connect=False)
    ready_then_connected(c, "runs", "waits")
    assert loans(c.take()) == []


def test_a_worker_with_tasks_pipelined_behind_its_first_is_not_lent():
    c = Cluster(cpus=1, lending=True, pipeline_depth=2, connect=False)
    first, second = ready_then_connected(c, "first", "second")
    out = c.take()
    assert executed(out) == [(1, first.task_id), (1, second.task_id)]
    assert loans(out) == []


def test_a_task_with_retry_exceptions_gets_no_loan():
    c = Cluster(cpus=2, lending=True)
    c.submit(make_call("f", retry_exceptions=True))
    assert loans(c.take()) == []


def test_a_worker_granted_a_gpu_is_not_lent():
    c = Cluster(cpus=2, gpus=1, lending=True)
    c.submit(make_call("f", resources={"GPU": 1.0}))
    out = c.take()
    assert executed(out) and loans(out) == []


def test_a_worker_running_a_task_a_worker_submitted_is_not_lent():
    c = Cluster(cpus=2, lending=True, pipeline_depth=1)
    c.s.lending = False                     # the parent runs on a worker of the head's
    c.submit(make_call("parent"))
    c.take()
    c.s.lending = True
    child = c.submit(make_call("child"), conn=worker_conn(1))
    out = c.take()
    assert executed(out) == [(2, child.task_id)]
    assert sent(out, Loan) == [] and c.worker(2).lent_to is None


def test_a_worker_that_ran_a_drivers_pipelined_tasks_is_lent_once_empty():
    c = Cluster(cpus=1, lending=True, pipeline_depth=2, connect=False)
    first, second = ready_then_connected(c, "first", "second")
    c.take()
    c.done(1, first)
    assert loans(c.take()) == []
    c.done(1, second)
    assert loans(c.take()) == [Loan(DRIVER, 1, socket_path(0, 1), {"CPU": 1.0}, 1001, b"", 0)]


# ------------------------------------------------------------------ lend_idle

def test_lend_idle_lends_one_idle_worker_of_the_shape_asked_for():
    c = Cluster(cpus=2, lending=True)
    lent(c)
    c.s.loans.lend_idle(DRIVER, {"CPU": 1.0})
    assert loans(c.take()) == [Loan(DRIVER, 2, socket_path(0, 2), {"CPU": 1.0}, 1002, b"", 0)]
    assert c.worker(2).state is WorkerState.BUSY and c.available()["CPU"] == 0.0


def test_lend_idle_lends_nothing_when_no_idle_worker_fits():
    c = Cluster(cpus=1, lending=True)
    lent(c)
    c.s.loans.lend_idle(DRIVER, {"CPU": 1.0})
    assert loans(c.take()) == []


def test_lend_idle_lends_nothing_while_work_waits():
    c = Cluster(cpus=2, lending=True, pipeline_depth=1)
    c.submit(make_call("a"))
    c.submit(make_call("b"))
    c.submit(make_call("waits"))
    c.take()
    c.s.loans.lend_idle(DRIVER, {"CPU": 1.0})
    assert loans(c.take()) == []


# ------------------------------------------------------------------ return and recall

def test_a_returned_worker_is_idle_again_and_its_grant_back_on_the_node():
    c = Cluster(cpus=1, lending=True)
    lent(c)
    assert c.available()["CPU"] == 0.0
    c.s.loans.return_loan(DRIVER, 1)
    assert c.worker(1).state is WorkerState.IDLE and c.worker(1).lent_to is None
    assert c.available()["CPU"] == 1.0 and c.s.loans.loaned == set()


def test_a_return_from_a_driver_it_is_not_lent_to_is_ignored():
    c = Cluster(cpus=1, lending=True)
    c.s.client_connected(OTHER_DRIVER, Hello(kind="driver", pid=2))
    lent(c)
    c.s.loans.return_loan(OTHER_DRIVER, 1)
    assert c.worker(1).lent_to == DRIVER


def test_a_task_that_finds_every_worker_lent_recalls_them_once():
    c = Cluster(cpus=1, lending=True)
    lent(c)
    waiting = c.submit(make_call("waits"))
    out = c.take()
    assert executed(out) == [] and recalls(out) == [(DRIVER, 1)]   # not pipelined to a loan
    c.submit(make_call("waits too"))
    assert recalls(c.take()) == []                                  # asked once
    c.s.loans.return_loan(DRIVER, 1)
    assert executed(c.take())[0] == (1, waiting.task_id)


def test_a_drivers_loans_end_when_it_disconnects_and_the_workers_are_replaced():
    # A driver gone with workers still on loan (killed: a clean shutdown gives them
    # back first) may have left its direct calls queued there: they are retired.
    c = Cluster(cpus=1, lending=True)
    c.s.client_connected(OTHER_DRIVER, Hello(kind="driver", pid=2))
    task = c.submit(make_call("f"), conn=OTHER_DRIVER)
    assert [m.worker_id for m in loans(c.take(), OTHER_DRIVER)] == [1]
    c.done(1, task)
    c.s.client_disconnected(OTHER_DRIVER)
    out = c.take()
    assert c.s.loans.loaned == set() and 1 not in c.s.workers
    assert [i.worker_id for i in out if type(i) is StopWorker] == [1]
    assert [i.worker_id for i in out if type(i) is StartWorker] == [2]


def test_a_dead_drivers_tasks_are_cancelled_and_its_running_ones_killed():
    c = Cluster(cpus=1, pipeline_depth=1)
    c.s.client_connected(OTHER_DRIVER, Hello(kind="driver", pid=2))
    running = c.submit(make_call("running"), conn=OTHER_DRIVER)
    queued = c.submit(make_call("queued"), conn=OTHER_DRIVER)
    mine = c.submit(make_call("mine"))
    c.take()
    c.s.client_disconnected(OTHER_DRIVER)
    out = c.take()
    assert [(i.worker_id, i.reason) for i in out if type(i) is KillWorker] == \
        [(1, "cancelled with force=True")]
    assert queued.task_id not in c.s.tasks
    assert mine.task_id in c.s.tasks and c.s.tasks[mine.task_id].state is not TaskState.DONE
    assert c.s.tasks[running.task_id].cancelled


def test_a_lent_worker_that_dies_ends_its_loan_and_is_replaced():
    c = Cluster(cpus=1, lending=True)
    lent(c)
    c.s.worker_died(1, "SIGKILL")
    assert c.s.loans.loaned == set()
    assert c.take() == [StartWorker(NODE, 2)]


def test_a_returned_worker_with_nothing_ready_takes_back_tasks_pipelined_elsewhere():
    c = Cluster(cpus=2, lending=True, pipeline_depth=2)
    lent_task = c.submit(make_call("lent"))
    c.submit(make_call("runs", retry_exceptions=True))        # not lent: the head sees each try
    behind = c.submit(make_call("behind", retry_exceptions=True))
    assert [w for w, _ in executed(c.take())] == [1, 2, 2]
    c.done(1, lent_task)
    c.s.loans.return_loan(DRIVER, 1)
    assert sent(c.take(), ReturnTasks, worker_conn(2)) == [ReturnTasks(worker_conn(2), [behind.task_id])]
