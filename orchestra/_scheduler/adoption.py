"""Direct calls handed over to the head when the connection they went on closed, for
the scheduler core (the ADOPT frame). No I/O.

    a driver's calls to an actor's process --> adopt_calls: queued on the process while
        it lives (its death, or its answer through the head, ends them); failed as calls
        in flight when it died; run again on the restarted instance with retries left
    a driver's tasks on a worker lent to it --> the same, as tasks: queued on it, or
        retried and failed as tasks queued on a worker that died (the first one as the
        one running, unless a task the head sent was)

A call the process answered through the head already is not run again (_adopted).
"""
from __future__ import annotations

from .._protocol import pb
from .actors import ActorState, ActorTable
from .model import DeadWorker, SchedulerCore, Task, TaskState, Worker, WorkerState

# A worker whose death the head has not seen yet (its connection closed first).
_UNKNOWN_DEATH = DeadWorker(0, "its connection closed", False)


class Adoption:
    """Calls handed over to the head (see the module docstring)."""

    def __init__(self, core: SchedulerCore, actors: ActorTable) -> None:
        self.core = core
        self.actors = actors

    def adopt_calls(self, conn: int, msg: pb.AdoptCalls) -> None:
        """Direct calls ``conn`` made to an actor's process, unanswered when their
        connection closed: failed as calls in flight when that process died, or ended
        when the process still answers them (through the head)."""
        if not msg.actor_id:
            self._adopt_tasks(conn, msg)
            return
        w = self.core.workers.get(msg.worker_id)
        alive = w is not None and w.actor is not None and w.state is not WorkerState.DEAD
        a = self.actors.actors.get(msg.actor_id)
        name = a.spec.class_name if a is not None else "?"
        for call in msg.calls:
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
            pid, reason, _ = self.core.dead_workers.get(msg.worker_id, _UNKNOWN_DEATH)
            self.core.fail_task(t, self.core.error(
                "actor_dead", name=name,
                reason=f"its process (pid={pid}) died while running {call.name}() ({reason})"))

    def _adopted(self, conn: int, call: pb.Call) -> Task | None:
        """The task of a call handed over by ``conn``, its returns held for ``conn``;
        None when the worker answered it through the head already."""
        t = Task(call, conn)
        if call.num_returns and all(
                (o := self.core.objects.get(r)) is not None and o.data is not None for r in t.return_ids):
            return None
        self.core.tasks[call.task_id] = t
        for rid in t.return_ids:
            if rid not in self.core.objects:
                self.core.new_object(conn, rid)
        return t

    @staticmethod
    def _queued_on(t: Task, w: Worker) -> None:
        """A handed-over call, as sent to ``w`` (its death, or answer, ends it)."""
        t.state = TaskState.DISPATCHED
        t.worker = w
        t.attempt = 1
        w.queue.append(t)

    def _adopt_tasks(self, conn: int, msg: pb.AdoptCalls) -> None:
        """Tasks a driver sent as direct calls to a worker on loan to it, unanswered when their
        connection closed: as tasks queued there when it died (the first one running,
        unless a task the head sent was) when the head has seen the death, or queued
        there for the death to come."""
        w = self.core.workers.get(msg.worker_id)
        alive = w is not None and w.actor is None and w.state is not WorkerState.DEAD
        cancelled = set(msg.cancelled)
        pid, reason, head_running = self.core.dead_workers.get(msg.worker_id, _UNKNOWN_DEATH)
        running = not head_running
        for call in msg.calls:
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
