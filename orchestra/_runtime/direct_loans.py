"""Tasks on workers lent to this driver, the I/O: the driver's side of the loans the
head grants (_scheduler/loans.py).

    LOAN frame --> granted: a connection to the worker --> tasks of its shape queued
        here (submit) --plan_loans--> EXECUTE on the lent worker's connection (pump)
    all lent workers of a shape full --LOAN_REQUEST--> the head lends one more (_ask)
    TASK_DONE / RETURN_TASKS on that connection --> dispatch: answers delivered (the
        DirectCalls' answered), tasks handed back queued again
    idle for LOAN_IDLE_S, or LOAN_RECALL --> LOAN_RETURN (return_idle, recalled)
    a worker slow or idle --> STEAL: its queued tasks back, to the others
    its connection closed --> lost: what it left unanswered handed to the head

The decisions are made in _runtime/direct_core.py (plan_loans, idle_loans, slow_loans,
steal_targets, wants_another_loan). One lock, ``lock``, guards every loan and the queues
of tasks waiting for one; the DirectCalls it belongs to (``d``) owns the connections, the
ResultBook and the calls' routes, and sends the frames.
"""
from __future__ import annotations

import collections
import os
import signal
import threading
import time
from typing import Any, Protocol

from .._protocol import pb
from .._protocol import wire as _wire
from .._protocol.connection import Connection
from .._resources import pinned_key, shape_key, split_pinned
from ..exceptions import ClusterLostError
from .direct_core import (
    LOAN_DEPTH,
    ActorRoute,
    Call,
    Loan,
    Plan,
    ResultBook,
    Shape,
    idle_loans,
    load,
    plan_loans,
    slow_loans,
    steal_targets,
    wants_another_loan,
)


class Calls(Protocol):
    """What the loans use of their DirectCalls (_runtime/direct.py)."""

    client: Any   # the CoreClient (direct.Client)
    book: ResultBook
    call_route: dict[bytes, ActorRoute | Loan]
    to_close: list[Any]

    def execute(self, plan: Plan, functions: bool = False) -> None: ...
    def answered(self, c: Call, msg: pb.TaskDone, forward: list[pb.ObjectData],
                 answered: list[Call]) -> None: ...
    def hand_back(self, peer: Any, lost: list[Call], worker_id: int,
                  actor_id: bytes = b"") -> None: ...
    def end_unsent(self, c: Call, msg: pb.TaskDone) -> None: ...
    def add_peer(self, conn: Connection, route: ActorRoute | Loan | None, worker_id: int) -> Any: ...


class LoanCalls:
    """The workers lent to this driver, by resource shape, and the tasks waiting for them."""

    def __init__(self, direct: Calls) -> None:
        self.d = direct
        self.client = direct.client
        self.lock = threading.Lock()
        self.loans: dict[Shape, list[Loan]] = {}
        self.queue: dict[Shape, collections.deque[Call]] = {}
        self.asked: dict[Shape, float] = {}
        self.ever_loaned = False
        self.busy_tasks: dict[bytes, Loan] = {}   # task sent by the head -> lent worker running it

    def submit(self, c: Call, shape: Shape) -> bool:
        """Queue a task for a worker lent for ``shape``; False when none is lent."""
        with self.lock:
            if not self.loans.get(shape):
                return False
            with self.client.refs.lock:
                self.client.owned.update(c.rids)
                self.d.book.sent(c.rids)
            q = self.queue[shape]
            q.append(c)
            if len(q) == 1:   # else the lent workers are full: an answer pumps
                self.pump(shape)
        return True

    def pump(self, shape: Shape) -> None:
        """Send queued tasks of ``shape`` to lent workers. Holds the lock."""
        q = self.queue.get(shape)
        if not q:
            return
        now = time.monotonic()
        loans = self.loans.get(shape, [])
        usable = [le for le in loans if not le.recalled and not le.blocked]
        plan = plan_loans(q, usable, self.client.results, now)
        self.d.execute(plan, functions=True)
        if usable:
            self._ask(shape, usable, now)

    def _ask(self, shape: Shape, loans: list[Loan], now: float) -> None:
        if wants_another_loan(len(self.queue.get(shape, ())), loans,
                              self.asked.get(shape, 0.0), now):
            self.asked[shape] = now
            res, pinned = split_pinned(dict(shape))
            self.client.send(_wire.LOAN_REQUEST, pb.LoanRequest(resources=res, pinned_node=pinned))

    def granted(self, msg: pb.Loan) -> None:
        self.ever_loaned = True
        shape = pinned_key(shape_key(msg.resources), msg.pinned_node)
        try:
            conn = Connection.connect_once(msg.path, self.client.token)
        except OSError:   # the worker is gone (or the cluster stops): give it back
            try:
                self.client.send(_wire.LOAN_RETURN, pb.LoanReturn(worker_id=msg.worker_id))
            except ClusterLostError:
                pass
            return
        loan = Loan(msg.worker_id, msg.pid, shape)
        if msg.busy_task:   # it runs that task of ours first: until its result comes
            loan.busy = 1
            self.busy_tasks[msg.busy_task] = loan
        loan.peer = self.d.add_peer(conn, loan, msg.worker_id)
        with self.lock:
            self.loans.setdefault(shape, []).append(loan)
            self.queue.setdefault(shape, collections.deque())
            self.pump(shape)
            if not load(loan):
                self._steal_for(loan)

    def recalled(self, worker_id: int) -> None:
        with self.lock:
            for loans in self.loans.values():
                for loan in loans:
                    if loan.worker_id == worker_id:
                        loan.recalled = True
                        if not loan.inflight:
                            self._give_back(loan)
                        elif len(loan.inflight) > 1:
                            self._take_back(loan)   # the head places them
                        self.pump(loan.shape)
                        return

    def _give_back(self, loan: Loan) -> None:
        """Holds the lock; the loan has no task unanswered."""
        loans = self.loans.get(loan.shape)
        if loans is not None and loan in loans:
            loans.remove(loan)
            if not loans:
                del self.loans[loan.shape]
        self.d.to_close.append(loan.peer)
        client = self.client
        if client.lost is None:
            try:
                if self.d.book.awaiting_push:
                    # Answers the head may still have to read: it waits for them, or
                    # runs their calls again should the worker die first (adoption.py).
                    self.d.hand_back(loan.peer, [], loan.worker_id)
                client.send(_wire.LOAN_RETURN, pb.LoanReturn(worker_id=loan.worker_id))
            except ClusterLostError:
                pass

    def return_idle(self, min_idle_s: float = 0.0, ask: bool = False) -> None:
        """Give back lent workers with no task unanswered for ``min_idle_s``; ``ask``:
        and ask for more where tasks wait behind others."""
        if not self.loans:
            return
        now = time.monotonic()
        with self.lock:
            for shape, loans in list(self.loans.items()):
                if ask:
                    self._ask(shape, loans, now)
                    for loan in slow_loans(loans, now):
                        self._take_back(loan)   # queued behind a long task
                for loan in idle_loans(loans, len(self.queue.get(shape, ())), min_idle_s, now):
                    self._give_back(loan)

    def _take_back(self, loan: Loan) -> None:
        """Ask a lent worker for the tasks it has not started, and send it no more until
        its running task answers. Holds the lock."""
        loan.blocked = True
        loan.stealing = True
        loan.peer.send(_wire.encode(_wire.STEAL, pb.ReturnTasks(task_ids=list(loan.inflight))))

    def _steal_for(self, idle: Loan) -> None:
        """A lent worker has nothing left: take back tasks queued behind a running one
        on another (a quick task never waits long behind a slow one). Holds the lock."""
        for loan in steal_targets(idle, self.loans.get(idle.shape, ())):
            loan.stealing = True
            ids = list(loan.inflight)
            loan.peer.send(_wire.encode(_wire.STEAL, pb.ReturnTasks(task_ids=ids)))

    def dispatch(self, loan: Loan, frames: list[tuple[int, Any]]) -> None:
        forward: list[pb.ObjectData] = []
        answered: list[Call] = []
        with self.lock:
            returned: list[Call] = []
            for kind, msg in frames:
                if kind == _wire.TASK_DONE:
                    c = loan.inflight.pop(msg.task_id, None)
                    if c is None:
                        continue
                    loan.blocked = False
                    loan.busy = 0   # what the head sent it ran before this
                    self.d.answered(c, msg, forward, answered)
                elif kind == _wire.RETURN_TASKS:
                    for tid in msg.task_ids:
                        c = loan.inflight.pop(tid, None)
                        if c is not None:
                            self.d.call_route.pop(tid, None)
                            returned.append(c)
                    if not loan.stealing:
                        loan.blocked = True   # its running task waits in get()
                    loan.stealing = False
            loan.idle_since = time.monotonic()
            q = self.queue.setdefault(loan.shape, collections.deque())
            q.extendleft(reversed(returned))
            if returned or load(loan) <= LOAN_DEPTH // 2:
                self.pump(loan.shape)
            if loan.recalled and not loan.inflight:
                self._give_back(loan)
            elif not loan.inflight and not q:
                self._steal_for(loan)
        self.client.wake()
        if forward:
            self.client.send(_wire.OBJECTS, pb.Objects(objects=forward))
        del answered

    def lost(self, loan: Loan, peer: Connection) -> None:
        """The lent worker's connection closed: the head retries or fails what it left
        unanswered, as for any worker death, and learns what it answered through the
        head that was not pushed here yet (ResultBook.unpushed)."""
        client = self.client
        with self.lock:
            loans = self.loans.get(loan.shape)
            if loans is not None and loan in loans:
                loans.remove(loan)
                if not loans:
                    del self.loans[loan.shape]
            lost = list(loan.inflight.values())
            loan.inflight.clear()
            if client.lost is None:
                for c in lost:
                    self.d.call_route.pop(c.tid, None)
                try:
                    self.d.hand_back(peer, lost, loan.worker_id)
                except ClusterLostError:
                    return
            if client.lost is None:
                try:
                    self.pump(loan.shape)
                except ClusterLostError:
                    pass
        del lost


    def cancel(self, tid: bytes, force: bool, loan: Loan | None,
                        recursive: bool = False) -> bool:
        with self.lock:
            if loan is not None:
                c = loan.inflight.get(tid)
                if c is not None:
                    if force and next(iter(loan.inflight)) == tid:
                        c.cancelled = True   # the head fails it as cancelled (AdoptCalls)
                        try:
                            os.kill(loan.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    else:
                        loan.peer.send(_wire.encode(_wire.CANCEL_TASK, pb.CancelTask(
                            task_id=tid, recursive=recursive)))
                    return True
            for q in self.queue.values():
                for c in q:
                    if c.tid == tid:
                        q.remove(c)
                        self.d.end_unsent(c, pb.TaskDone(task_id=tid, cancelled=True))
                        return True
        return False


    def pump_woken(self, woken: list[Loan]) -> None:
        """Lent workers with room for more: send them what waits."""
        with self.lock:
            for shape in {le.shape for le in woken}:
                self.pump(shape)
