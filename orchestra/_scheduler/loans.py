"""Loans: idle workers lent to drivers for direct calls. No I/O.

    schedule() takes an idle worker for a driver's task (noted as fresh)
        --nothing else waits--> lend: Loan(worker, socket path, grant, busy_task)
            as a LateSend (after the Execute it names) -> the driver sends its later
            tasks of that shape to the worker's process as direct calls
    TaskDone of a driver's task, worker now empty, nothing waits --> lend it to that driver
    driver: all its loaned workers busy --LoanRequest(resources)--> lend_idle: one more idle one
    work waits that no worker takes --> recall: LOAN_RECALL (once per worker)
    driver --LOAN_RETURN--> return_loan: the worker is the head's again (idle, or more
        work, or it steals tasks pipelined elsewhere)
    driver gone --> its loans return; worker died --> its loan ends

A loaned worker keeps its grant (WorkerState.BUSY, ``lent_to`` set): the head pipelines
nothing to it and steals nothing from it; it is back in the head's hands only when the
driver returns it. Not lent: workers with GPUs (their devices are chosen per task), a
task's worker when tasks wait for one, workers of tasks with retry_exceptions (the head
must see each attempt), workers for a worker's (not a driver's) tasks, actor workers.
"""
from __future__ import annotations

from collections.abc import Iterable

from .._resources import shape_key
from .instructions import Loan, LoanRecall
from .model import SchedulerCore, Task, Worker, WorkerState
from .placement import cpu_share_free, hard_node


class Loans:
    """The loan decisions of a SchedulerState (its helper, as Blocking is)."""

    def __init__(self, state: SchedulerCore) -> None:
        self.s = state
        self.loaned: set[int] = set()   # ids of the workers on loan now
        # Idle workers taken by the running schedule() for a task: (its owner, worker).
        # schedule() appends here itself (the hot path), and calls lend_fresh at its end.
        self.fresh: list[tuple[int, Worker]] = []
        # The same for tasks bound to the worker's node (hard node affinity): lent for
        # those only (Loan.pinned_node).
        self.fresh_pinned: list[tuple[int, Worker]] = []

    # ------------------------------------------------------------------ decisions
    def lend(self, conn: int, w: Worker, pinned: int = 0) -> bool:
        """Lend ``w`` (just taken idle for a task of ``conn``, or asked for) to that
        driver: its later tasks of that shape go to the worker as direct calls (with
        ``pinned``, node id + 1: its tasks bound to that node)."""
        s = self.s
        c = s.clients.get(conn)
        if c is None or c.kind != "driver" or w.gpu_ids:
            return False
        path = s.direct_path(w, c)   # unix socket on one node, TCP across nodes
        if not path:
            return False
        w.lent_to = conn
        self.loaned.add(w.worker_id)
        s.out.append(Loan(conn, w.worker_id, path, w.grant, w.pid,
                          w.queue[0].call.task_id if w.queue else b"", pinned))
        return True

    def after_schedule(self, waiting: bool) -> None:
        """End of a schedule() pass (``waiting``: work is left that no worker took):
        lend the workers it took idle, or recall loans for the work that waits."""
        for fresh, pinned in ((self.fresh, False), (self.fresh_pinned, True)):
            if not fresh:
                continue
            if pinned:
                self.fresh_pinned = []
            else:
                self.fresh = []
            if not waiting:   # lend only what no waiting task needs
                for owner, w in fresh:
                    # Only a worker with just that task: tasks pipelined behind it stay
                    # where the head can move them to a worker that goes idle.
                    if w.state is WorkerState.BUSY and w.lent_to is None and len(w.queue) == 1 \
                            and w.queue[0].owner == owner:
                        self.lend(owner, w, w.node_id + 1 if pinned else 0)
        if waiting and self.loaned:
            self._recall_loans()

    def lend_after_task(self, w: Worker, done: Task) -> bool:
        """``w`` ran ``done`` to its end and has nothing queued: lend it to the driver
        whose task it was, which sends it its next ones as direct calls. True when lent."""
        s = self.s
        # A task placed by a strategy runs on a lent worker only when bound to the
        # worker's node (lent for those); lending after another would have the driver's
        # next placed task recall it first.
        if done.placement is None:
            pinned = 0
        elif hard_node(done) == w.node_id:
            pinned = w.node_id + 1
        else:
            return False
        return s.lending and not done.call.retry_exceptions and not done.call.max_calls \
            and not s.work_waits() and self.lend(done.owner, w, pinned)

    def _recall_loans(self) -> None:
        """Work waits that no worker takes: ask drivers for the workers lent to them."""
        s = self.s
        for wid in self.loaned:
            w = s.workers.get(wid)
            if w is not None and not w.recalling and w.lent_to is not None:
                w.recalling = True
                # After any loan of this batch (LateSend), or the driver would not know it.
                s.out.append(LoanRecall(w.lent_to, wid))

    # ------------------------------------------------------------------ events
    def lend_idle(self, conn: int, req: dict[str, float], pinned: int = 0) -> None:
        """A driver whose loaned workers are all busy asks for one more of this shape."""
        s = self.s
        if not s.lending or s.work_waits():
            return
        idle: Iterable[Worker] = s.workers.values()
        c = s.clients.get(conn)
        if pinned:   # for tasks bound to that node
            idle = [w for w in idle if w.node_id == pinned - 1]
        elif len(s.nodes) > 1 and c is not None:   # the driver's node first, then by CPU free
            shares = {nid: cpu_share_free(n) for nid, n in s.nodes.items()}
            idle = sorted((w for w in idle if w.node_id in shares),
                          key=lambda w: (w.node_id != c.node_id, -shares[w.node_id], w.node_id))
        for w in idle:
            if w.state is WorkerState.IDLE and w.actor is None:
                node = s.nodes[w.node_id]
                if node.resources.fits(req):
                    w.grant = dict(req)
                    w.grant_shape = shape_key(req)
                    w.gpu_ids = node.resources.acquire(req)
                    w.state = WorkerState.BUSY
                    if not self.lend(conn, w, pinned):
                        s.release_grant(w)
                        w.state = WorkerState.IDLE
                    return

    def return_loan(self, conn: int, worker_id: int) -> None:
        """The driver gives the worker back (asked to, or done with it)."""
        s = self.s
        w = s.workers.get(worker_id)
        if w is None or w.lent_to != conn:
            return
        w.lent_to = None
        w.recalling = False
        self.loaned.discard(worker_id)
        s.after_worker_step(w)

    def client_gone(self, conn: int) -> None:
        """A driver's connection closed: every worker on loan to it returns."""
        for wid in list(self.loaned):
            w = self.s.workers.get(wid)
            if w is not None and w.lent_to == conn:
                self.return_loan(conn, wid)

    def worker_died(self, worker_id: int) -> None:
        self.loaned.discard(worker_id)
