"""Direct calls handed over to the head when the connection they went on closed, for
the scheduler core (the ADOPT frame). No I/O.

    a driver's calls to an actor's process --> adopt_calls: queued on the process while
        it lives (its death, or its answer through the head, ends them); failed as calls
        in flight when it died; run again on the restarted instance with retries left
    a driver's tasks on a worker lent to it --> the same, as tasks: queued on it, or
        retried and failed as tasks queued on a worker that died (the first one as the
        one running, unless a task the head sent was)

A call the process answered through the head already is not run again (_adopted).

Calls it answered through the head whose results the head had not pushed to the caller
come too (``answered``), when the connection closed or the loan went back: the head
may not have read that answer (it comes on the process's own connection), and never
reads it when the process died with its node first (the head voids what a dead node's
workers said). Read already: nothing to do. Else they wait here (``unread``) for the
answer, or for the process's death; dead before its answer was read, a task runs again
with a retry spent (as a rebuild of its lineage would), or fails as a result lost with
its worker, and an actor call fails as one in flight when its process died (or runs
again on the restarted instance, with retries). An answer read after its call ran
again stands, and the run again ends by itself (SchedulerState.task_done).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .actors import ActorState, ActorTable
from .call import Call
from .events import AdoptCalls
from .model import DeadWorker, SchedulerCore, Task, TaskState, Worker, WorkerState
from .objects import ObjectDirectory

# A worker whose death the head has not seen yet (its connection closed first).
_UNKNOWN_DEATH = DeadWorker(0, "its connection closed", False)

# A call answered through the head, its answer not read: (caller's connection, call,
# actor id or b"").
_Unread = tuple[int, Call, bytes]


class Adoption:
    """Calls handed over to the head (see the module docstring)."""

    def __init__(self, core: SchedulerCore, actors: ActorTable, directory: ObjectDirectory) -> None:
        self.core = core
        self.actors = actors
        self.directory = directory
        # Calls answered through the head, that answer not read yet: worker id -> task
        # id -> the call (see the module docstring). Emptied by the answer, or the death.
        self.unread: dict[int, dict[bytes, _Unread]] = {}
        # Those run again (or failed) for want of their answer: task id -> worker id. A
        # late answer (the worker's death told first) finds their results made, or
        # freed since: it makes nothing anew (answer_read).
        self.reran: dict[bytes, int] = {}

    def adopt_calls(self, conn: int, msg: AdoptCalls) -> None:
        """Direct calls ``conn`` made to a process, handed over (see the module docstring)."""
        calls: Sequence[Any] = msg.calls
        if msg.answered:
            answered = set(msg.answered)
            calls = [c for c in msg.calls if c.task_id not in answered]
            for call in msg.calls:
                if call.task_id in answered:
                    self._answered(conn, msg.worker_id, msg.actor_id, call)
        if not msg.actor_id:
            self._adopt_tasks(conn, msg.worker_id, calls, set(msg.cancelled))
        else:
            self._adopt_actor_calls(conn, msg.worker_id, msg.actor_id, calls)
            self.core.schedule()

    def _read(self, call: Call) -> bool:
        """Whether the head read the answer of ``call`` (its results are here), or runs
        it again already (a rebuild of a result lost with a node)."""
        objects = self.core.objects
        return call.task_id in self.core.tasks or bool(call.num_returns) and all(
            (o := objects.get(r)) is not None and o.data is not None
            for r in Task(call, 0).return_ids)

    def _answered(self, conn: int, worker_id: int, actor_id: bytes, call: Call) -> None:
        if self._read(call):
            return
        w = self.core.workers.get(worker_id)
        if w is not None and w.state is not WorkerState.DEAD:   # its answer is still to come
            self.unread.setdefault(worker_id, {})[call.task_id] = (conn, call, actor_id)
            return
        self._answer_lost(conn, worker_id, actor_id, call)

    def answer_read(self, worker_id: int, task_id: bytes) -> bool:
        """Worker ``worker_id``'s answer of ``task_id`` through the head was read. True
        when that call ran again for want of it (a late answer)."""
        waiting = self.unread.get(worker_id) if self.unread else None
        if waiting is not None:
            waiting.pop(task_id, None)
            if not waiting:
                del self.unread[worker_id]
        return bool(self.reran) and self.reran.pop(task_id, None) is not None

    def worker_gone(self, worker_id: int) -> None:
        """Worker ``worker_id`` died: the answers it still owed the head are lost."""
        waiting = self.unread.pop(worker_id, None)
        if waiting is None:
            return
        for conn, call, actor_id in waiting.values():
            if conn in self.core.clients and not self._read(call):
                self._answer_lost(conn, worker_id, actor_id, call)

    def _answer_lost(self, conn: int, worker_id: int, actor_id: bytes, call: Call) -> None:
        """A call that ran to its end on a process now dead, its answer never read by
        the head: a task runs again with a retry spent, as a rebuild of its lineage
        would, or fails as a result lost with its worker; an actor call as one in
        flight when the process died."""
        self._ran_again(call.task_id, worker_id)
        if actor_id:
            self._adopt_actor_calls(conn, worker_id, actor_id, [call])
            return
        t = self._adopted(conn, call)
        if t is None or not self.core.hold_args(t):
            return
        t.attempt = 1
        if t.retries_left == 0:
            pid, reason, _, node = self.core.dead_workers.get(worker_id, _UNKNOWN_DEATH)
            rid = t.return_ids[0] if t.return_ids else call.task_id
            # A worker this head does not remember (it died long ago, or before a restart
            # of the head): its node and pid are not known.
            who = f"its worker (pid={pid})" if pid else "its worker"
            self.core.fail_task(t, self.core.error(
                "node_lost", object_id=rid, node=node if node >= 0 else "that ran it",
                reason=f"{who} died ({reason}) before the head read the result"))
        else:   # (scheduled by the caller: a worker's death is not carried out yet)
            t.spend_retry()
            t.move(TaskState.READY)
            self.core.enqueue_ready(t)

    def _ran_again(self, task_id: bytes, worker_id: int) -> None:
        """The call runs again (or fails) for a dead worker, which may still have
        answered it: a late answer makes nothing anew (answer_read)."""
        self.reran[task_id] = worker_id
        if len(self.reran) > 4096:   # answers voided for good are never read
            del self.reran[next(iter(self.reran))]

    def _adopt_actor_calls(self, conn: int, worker_id: int, actor_id: bytes,
                           calls: Sequence[Call]) -> None:
        """Direct calls ``conn`` made to an actor's process, unanswered when their
        connection closed: failed as calls in flight when that process died, or ended
        when the process still answers them (through the head)."""
        w = self.core.workers.get(worker_id)
        alive = w is not None and w.actor is not None and w.state is not WorkerState.DEAD
        a = self.actors.actors.get(actor_id)
        name = a.spec.class_name if a is not None else "?"
        for call in calls:
            t = self._adopted(conn, call)
            if t is None:
                continue
            if call.max_retries and a is not None and a.state is not ActorState.DEAD:
                # max_task_retries=: it may run again on the restarted instance, which
                # reads its arguments through the head.
                if not self.core.hold_args(t):
                    continue
                if not alive:
                    t.spend_retry()
                    self.actors.submit_call(t)
                    continue
            if alive:
                assert w is not None
                self._queued_on(t, w)
                continue
            pid, reason, _, _ = self.core.dead_workers.get(worker_id, _UNKNOWN_DEATH)
            self.core.fail_task(t, self.core.error(
                "actor_dead", name=name,
                reason=f"its process (pid={pid}) died while running {call.name}() ({reason})"))

    def _adopted(self, conn: int, call: Call) -> Task | None:
        """The task of a call handed over by ``conn``, its returns held for ``conn``;
        None when the worker answered it through the head already."""
        t = Task(call, conn)
        if call.num_returns and all(
                (o := self.core.objects.get(r)) is not None and o.data is not None for r in t.return_ids):
            return None
        self.core.tasks[call.task_id] = t
        for rid in t.return_ids:
            if rid not in self.core.objects:
                self.directory.new_object(conn, rid)
        return t

    @staticmethod
    def _queued_on(t: Task, w: Worker) -> None:
        """A handed-over call, as sent to ``w`` (its death, or answer, ends it)."""
        t.state = TaskState.DISPATCHED
        t.worker = w
        t.attempt = 1
        w.queue.append(t)

    def _adopt_tasks(self, conn: int, worker_id: int, calls: Sequence[Call],
                     cancelled: set[bytes]) -> None:
        """Tasks a driver sent as direct calls to a worker on loan to it, unanswered when their
        connection closed: as tasks queued there when it died (the first one running,
        unless a task the head sent was) when the head has seen the death, or queued
        there for the death to come."""
        w = self.core.workers.get(worker_id)
        alive = w is not None and w.actor is None and w.state is not WorkerState.DEAD
        pid, reason, head_running, _ = self.core.dead_workers.get(worker_id, _UNKNOWN_DEATH)
        running = not head_running
        for call in calls:
            t = self._adopted(conn, call)
            if t is None or not self.core.hold_args(t):
                continue
            t.cancelled = call.task_id in cancelled
            if t.deps:
                continue   # waits for its arguments like any task
            if alive:
                assert w is not None
                self._queued_on(t, w)
                continue
            t.attempt = 1
            self._ran_again(call.task_id, worker_id)
            if running and t.cancelled:
                self.core.fail_task(t, self.core.error("cancelled", name=call.name))
            elif running and t.retries_left == 0:
                self.core.fail_task(t, self.core.error("crashed", name=call.name, pid=pid,
                                                       reason=reason, attempts=t.attempt))
            else:
                if running:
                    t.spend_retry()
                t.move(TaskState.READY)
                self.core.enqueue_ready(t)
            running = False
        self.core.schedule()
