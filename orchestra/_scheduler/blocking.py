"""Workers blocked in get(): running the awaited task inline, and spotting a stall. No I/O.

    worker: get(ref) misses -> Blocked(ids, task) -> head: Wait pushed on the worker
        producer of an id READY here and covered by the worker's grant?
          yes -> EXECUTE_NESTED to that worker: it runs the task inside its get() (same
                 thread, nested on the stack), its CPU stays taken   (worker BUSY)
          no  -> its CPU is lent back; another worker may start it     (worker BLOCKED)
        nested TaskDone -> back in the get(): lend the CPU again, or inline the next one
        Blocked(false) -> the innermost Wait is popped

A worker's state follows from two stacks: BLOCKED while it has more Waits than tasks run
inline (``len(w.waits) > len(w.nested)``), BUSY otherwise. So ``rec(n) = 1 +
get(rec.remote(n - 1))`` nests on a few workers instead of holding one blocked process
per level: before this, on 2 CPUs it ended at n = 40 with every one of the 40 workers
the cap allows blocked, and the cluster stalled for good (issue 12).

Inline runs stay within the outer task's grant (the task asks for no more of any
resource than the blocked one holds, and for the same GPUs), so they never oversubscribe
a node. A worker nests at most ``MAX_NESTED`` tasks: each level costs ~7 Python frames
of the worker's main thread (its recursion limit rises to match, _worker/worker.py).

A task submitted by a running task starts no new worker at once (defer_growth): its
submitter is likely to block on it next and run it inline; otherwise a worker about to
go idle takes the chain over and the pool fills with blocked processes.

Where nothing can progress (ready tasks that no worker takes, no worker running or
starting, some blocked in get()), ``check_stalled`` names the blocked tasks and what
they wait for once the same picture has held for ``STALL_S`` seconds, for the head to
send to the drivers (Stalled frame), which log it: never a silent stall.
"""
from __future__ import annotations

from collections.abc import Iterable

from .._ids import TASK_ID_LEN
from .call import NODE_AFFINITY
from .instructions import Execute, Stalled
from .model import SchedulerCore, Task, TaskState, Wait, Worker, WorkerState, cluster_free

# Tasks one worker runs nested inside its blocked get()s, at most. The worker stops
# asking sooner, by its own recursion limit (~960 levels with an 8 MiB stack:
# _worker/worker.py); deeper chains go on other workers, up to max_workers.
MAX_NESTED = 1000
# How long the same stalled picture holds before the drivers hear of it: a blocked get()
# that a worker about to start will serve must not warn.
STALL_S = 5.0


# What a stall looks like (Blocking._stalled_picture): the blocked workers, and the
# objects they wait for.
Picture = tuple[tuple[tuple[int, int, int], ...], tuple[bytes, ...]]


class Blocking:
    """The blocked-worker decisions of a SchedulerState (its helper, as ActorTable is)."""

    def __init__(self, state: SchedulerCore) -> None:
        self.s = state
        # Task id -> the blocked get()s that wait for one of its returns: a task that
        # becomes ready (its arguments sealed, handed back by a worker) goes to one of
        # them inline before any other worker (schedule() looks here first).
        self.waiting_for: dict[bytes, list[tuple[Worker, Wait]]] = {}
        # Tasks whose submitter still runs, for which no worker was started (defer_growth)
        # since the last tick; those of the tick before, which may start one now.
        self._deferred: set[bytes] = set()
        self._grow_ok: set[bytes] = set()
        self._stall_key: Picture | None = None   # the stalled picture last seen, and since when
        self._stall_since = 0.0
        self._warned: Picture | None = None      # the picture last warned about (warn once)

    # ------------------------------------------------------------------ events
    def blocked(self, w: Worker, is_blocked: bool, ids: Iterable[bytes] = (),
                task_id: bytes = b"", name: str = "") -> None:
        if is_blocked:
            wait = Wait(list(ids), task_id, name)
            w.waits.append(wait)
            for oid in wait.ids:
                self.waiting_for.setdefault(oid[:TASK_ID_LEN], []).append((w, wait))
            if self._inline(w):
                return
            self.settle(w)
            self.s.schedule()
        elif w.waits:
            self._forget(w, w.waits.pop())
            self.settle(w)

    def _forget(self, w: Worker, wait: Wait) -> None:
        waiting_for = self.waiting_for
        for oid in wait.ids:
            tid = oid[:TASK_ID_LEN]
            waiters = waiting_for.get(tid)
            if waiters is None:
                continue
            try:
                waiters.remove((w, wait))
            except ValueError:
                pass
            if not waiters:
                del waiting_for[tid]

    def nested_done(self, w: Worker, t: Task) -> None:
        """``t``, run inline on ``w``, ended (or left ``w``): back in the get() below it."""
        w.nested.remove(t)
        self.s.workers.may_pipeline(w)
        if not self._inline(w):
            self.settle(w)
            self.s.schedule()

    def clear(self, w: Worker) -> None:
        while w.waits:
            self._forget(w, w.waits.pop())
        w.nested.clear()

    # ------------------------------------------------------------------ decisions
    def settle(self, w: Worker) -> None:
        """Set ``w``'s state from its stacks, lending or taking back its CPU."""
        cpu = w.grant.get("CPU", 0.0)
        node = self.s.nodes[w.node_id]
        if len(w.waits) > len(w.nested):
            if w.state is WorkerState.BUSY:
                w.state = WorkerState.BLOCKED
                if cpu:
                    node.resources.release({"CPU": cpu}, [])
        elif w.state is WorkerState.BLOCKED:
            w.state = WorkerState.BUSY
            if cpu:  # may go below zero for a moment: the task runs on, as in Ray
                node.resources.overdraw({"CPU": cpu})

    def _inline(self, w: Worker) -> bool:
        """Hand ``w`` (blocked in its innermost get) a task that get waits for, not
        started anywhere yet; True when one was sent."""
        if not w.waits or len(w.nested) >= MAX_NESTED or w.state is WorkerState.DEAD:
            return False
        s = self.s
        tasks = s.tasks
        for oid in w.waits[-1].ids:
            t = tasks.get(oid[:TASK_ID_LEN])
            if t is None or t.state is not TaskState.READY or not _inlinable(t, w):
                continue
            q = s.ready.get(t.qkey)
            if q is None or t not in q:
                continue
            q.remove(t)
            self._run_inline(t, w)
            return True
        return False

    def inline_waiter(self, t: Task) -> bool:
        """``t`` is ready and first in its queue: run it inline in a get() blocked on it
        (the caller takes it off the queue); True when one takes it."""
        nodes = self.s.nodes
        for w, wait in self.waiting_for.get(t.call.task_id, ()):
            # (A worker of a node being removed is not: remove_node schedules between
            # its workers' deaths, and the node's resources are gone already.)
            if w.state is WorkerState.BLOCKED and w.waits and w.waits[-1] is wait \
                    and w.node_id in nodes and len(w.nested) < MAX_NESTED and _inlinable(t, w):
                self._run_inline(t, w)
                return True
        return False

    def _run_inline(self, t: Task, w: Worker) -> None:
        """Send ``t`` (off the ready queue) to ``w``, to run inside its innermost get()."""
        s = self.s
        w.nested.append(t)
        self.settle(w)          # its CPU is the nested task's now
        s.dispatch(t, w)       # appends to the queue and sends an Execute ...
        w.queue.pop()
        w.queue.appendleft(t)   # ... the innermost running task comes first
        ins = s.out[-1]
        assert type(ins) is Execute
        s.out[-1] = ins._replace(nested=True)

    def defer_growth(self, t: Task) -> bool:
        """True: start no worker for ``t`` yet. Its submitter, a task still running,
        will most likely block on it next and run it inline. A worker started now would
        go idle just in time to take the submitter's next subtask, and a chain like
        rec(n) would hop to it, leaving one more process blocked for good with a few
        levels each (rec(1000) on 2 CPUs filled all 40 workers the cap allows). Held
        until the submitter blocks (on something else, or past its nesting bound) or
        ends, both of which schedule again, or for one tick (~0.5 s) of the head."""
        tid = t.call.task_id
        if tid in self._grow_ok:
            return False
        c = self.s.clients.get(t.owner)
        w = c.worker if c is not None else None
        if w is None or w.state is not WorkerState.BUSY or w.actor is not None \
                or len(w.nested) >= MAX_NESTED or not _inlinable(t, w):
            return False
        self._deferred.add(tid)
        return True

    def tick(self, now: float) -> None:
        """Every fraction of a second (the head's timer): tasks held back from starting
        a worker for a whole tick may start one now; warn of a stall."""
        self._grow_ok, self._deferred = self._deferred, set()
        if self._grow_ok:
            self.s.schedule()
        self.check_stalled(now)

    # ------------------------------------------------------------------ stalls
    def check_stalled(self, now: float) -> None:
        """Called every fraction of a second: warn the drivers (once per picture) when
        no task can progress and the picture has not changed for STALL_S."""
        key = self._stalled_picture()
        if key is None:
            self._stall_key = None
            self._warned = None
            return
        if key != self._stall_key:
            self._stall_key, self._stall_since = key, now
            return
        if now - self._stall_since < STALL_S or key == self._warned:
            return
        self._warned = key
        text, blocked_ids = self._describe(now - self._stall_since)
        for c in self.s.clients.values():
            if c.kind == "driver":
                self.s.out.append(Stalled(c.conn, text, blocked_ids))

    def _stalled_picture(self) -> Picture | None:
        """What is stuck (blocked tasks, ready tasks), or None while anything can move."""
        s = self.s
        if not s.has_ready():
            return None
        blocked = []
        for w in s.workers.values():
            st = w.state
            if st is WorkerState.STARTING or st is WorkerState.IDLE and w.actor is None \
                    and _any_fits_idle(s, w):
                return None     # a worker about to take work
            if st is WorkerState.BUSY and (w.actor is None or w.queue):
                return None     # something runs: it may free what the others wait for
            if st is WorkerState.BLOCKED:
                blocked.append((w.worker_id, len(w.waits), len(w.nested)))
        if not blocked:
            return None
        ready = tuple(sorted(t.call.task_id for q in s.ready.values() for t in list(q)[:64]))
        return tuple(sorted(blocked)), ready

    def _describe(self, for_s: float) -> tuple[str, list[bytes]]:
        s = self.s
        lines = []
        blocked_ids: list[bytes] = []
        for w in s.workers.values():
            if w.state is not WorkerState.BLOCKED or not w.waits:
                continue
            wait = w.waits[-1]
            tid = wait.task_id or (w.queue[0].call.task_id if w.queue else b"")
            name = wait.name or (w.queue[0].call.name if w.queue else "?")
            blocked_ids.append(tid)
            on = [self._producer(oid) for oid in wait.ids[:4]]
            more = f" and {len(wait.ids) - 4} more" if len(wait.ids) > 4 else ""
            lines.append(f"  {name}() [task {tid.hex()}] on worker pid={w.pid} waits for "
                         f"{', '.join(on) or 'objects'}{more}")
        waiting = [t for q in s.ready.values() for t in q]
        free = cluster_free(s.nodes)
        lines.append(f"  {len(waiting)} task(s) ready but not started, e.g. "
                     + ", ".join(f"{t.call.name}() [task {t.call.task_id.hex()}] needs "
                                 f"{_fmt(t.resources)}" for t in waiting[:4])
                     + f"; free now: {_fmt(free)}; task workers: {len(s.pool(0))}, at most "
                     + f"{max((n.max_workers for n in s.nodes.values()), default=0)}")
        text = (f"orchestra: no task can make progress for {for_s:.0f} s: every worker is blocked "
                "in get()/wait() on tasks that cannot start (the resources they need are held by "
                "the blocked tasks, or the worker limit is reached).\n" + "\n".join(lines) +
                "\nRemedy: give the subtasks resources the blocked tasks do not hold, get() their "
                "results outside the task that holds those resources, or start the cluster with "
                "more of them.")
        return text, blocked_ids

    def _producer(self, oid: bytes) -> str:
        t = self.s.tasks.get(oid[:TASK_ID_LEN])
        if t is None:
            return f"object {oid.hex()}"
        return f"{t.call.name}() [task {t.call.task_id.hex()}, {t.state.value}, needs {_fmt(t.resources)}]"


def _inlinable(t: Task, w: Worker) -> bool:
    """A plain task (not an actor's) that asks for no more of anything than ``w``'s
    grant holds, and for the same GPUs (an inline task sees the outer task's devices)."""
    if t.call.actor_id or t.call.actor is not None or t.cancelled:
        return False
    p = t.placement
    if p is not None and p[0] == NODE_AFFINITY and not p[2] and p[1] != w.node_id:
        return False   # it may run on its node only
    grant = w.grant
    if t.resources.get("GPU", 0.0) != grant.get("GPU", 0.0):
        return False
    return all(v <= grant.get(k, 0.0) for k, v in t.resources.items())


def _any_fits_idle(s: SchedulerCore, w: Worker) -> bool:
    """An idle worker whose node fits some ready task will take it (schedule runs on)."""
    node = s.nodes[w.node_id]
    return any(q and node.resources.fits(q[0].resources) for q in s.ready.values())


def _fmt(res: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(res.items())) + "}"
