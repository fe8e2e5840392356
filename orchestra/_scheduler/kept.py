"""What outlived a restart of the head on its joined nodes: the objects their stores
kept, and the workers that were running a plain task; held until a task made again
claims them, or they expire.

    restore -> expect(the joined nodes of before, now): until each joined again (at
        most NODE_WAIT_S), and then until the workers each names came back (at most
        WORKER_WAIT_S), tasks made ready wait here (``parked``: enqueue_ready) instead
        of starting on another worker while the process that runs them comes back
    a node joins again -> node_joined(node id, its workers of before, now), and
        offer(node id, NodeRegister.kept, now): each object held until now + KEEP_S; a
        task already submitted again (a driver's replay, _runtime/replay.py) that
        returns it is done with it at once
    a worker of before connects (Hello.resume_task) -> connected(worker, task id): the
        task, submitted again and waiting, is that worker's (attach: it runs there, as
        if dispatched); not submitted yet: noted (``running``) for its submission
    a task submitted -> claim(t) (SchedulerState.submit, before it holds its arguments):
        True when every return of it is held (then it is done with them, never run), or
        when a worker of before runs it (then it is that worker's, its arguments held)
    a worker of before answers its task -> answered(w, t, msg): attached, the usual
        path (False); not submitted again yet, its returns held as kept objects; made
        again and run elsewhere meanwhile (the waits ran out), its returns freed
    tick(now) (the head's, every 0.5 s while ``active``): the waits that ran out; the
        held objects nobody claimed (freed); the workers of before whose task nobody
        made again (killed)
    a kept object spilled by its node -> relocate(oid, segment): held at its file now
    node_gone(node_id) -> its objects dropped (gone with the node)

What qualifies: a plain task (not an actor's call or constructor, not a generator). A
store keeps only sealed objects with no refs inside (ObjectStore.carry_over): their
counts went with the head before; a worker of before hands back only results with no
refs inside (_worker/rejoin.py), and a worker serving a detached actor comes back as
that actor's (ActorTable.adopt), which ends its wait here too.

Rule: I/O-free; owned by the head's loop, as SchedulerState is (frees and kills go out
as its instructions). ``active`` and ``parking`` are read on the task path: one
attribute each, kept up to date by _update.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from .._ids import task_of
from .data import ERROR, Data, Segment, at
from .events import TaskDone
from .instructions import KillWorker
from .lineage import Rebuilds
from .model import SchedulerCore, Task, TaskState, Worker, WorkerState
from .objects import ObjectDirectory
from .workers import RETIRING

# How long a restarted head holds a node's kept objects, and a worker of before the
# task it runs, for the tasks its drivers make again: they connect within a second of
# the head listening, and send what they carry over at once.
KEEP_S = 30.0
# How long a restarted head waits for a joined node of before to join again (they try
# every 0.2 s), and then for the workers of before the node names to connect (each
# tries once its node joined, every 0.2 s), before it runs tasks made again.
NODE_WAIT_S = 5.0
WORKER_WAIT_S = 3.0


class KeptObjects:
    def __init__(self, core: SchedulerCore, directory: ObjectDirectory, rebuilds: Rebuilds,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.core, self.directory, self.rebuilds = core, directory, rebuilds
        self.clock = clock   # now, for resume and answered (tests pass their own)
        self.held: dict[bytes, Data] = {}   # object id -> where it is kept
        self.until: dict[bytes, float] = {}          # object id -> when it expires
        self.nodes: dict[int, float] = {}     # joined node of before -> until when it is waited for
        self.awaited: dict[int, float] = {}   # worker of before -> until when it is waited for
        # Tasks a worker of before runs that were not submitted again yet: task id ->
        # (the worker, until when it runs unclaimed).
        self.running: dict[bytes, tuple[Worker, float]] = {}
        self.resumed: dict[int, bytes] = {}   # worker of before -> the task it came back with
        self.parked: dict[bytes, Task] = {}   # made ready while the waits last, in order
        self.parking = False   # nodes or workers of before are waited for
        self.active = False    # anything here a submission may meet

    def _update(self) -> None:
        self.parking = bool(self.nodes or self.awaited)
        self.active = bool(self.held or self.running or self.parking)

    # ------------------------------------------------------------------ waits
    def expect(self, node_ids: set[int], now: float) -> None:
        """A restarted head: the joined nodes of before may come back with workers."""
        self.nodes.update((nid, now + NODE_WAIT_S) for nid in node_ids)
        self._update()

    def node_joined(self, node_id: int, workers: list[int], now: float) -> None:
        """A node joined (again), naming its workers of before that live on."""
        self.nodes.pop(node_id, None)
        self.awaited.update((wid, now + WORKER_WAIT_S) for wid in workers
                            if wid not in self.core.workers)
        self._settle()

    def worker_gone(self, worker_id: int) -> None:
        """A worker of before exited before it connected."""
        if self.awaited.pop(worker_id, None) is not None:
            self._settle()

    def park(self, t: Task) -> None:
        """(enqueue_ready, while ``parking``.) ``t`` is ready: it waits here."""
        self.parked[t.call.task_id] = t

    def _settle(self) -> None:
        """Once nothing is waited for: the parked tasks go to their queues, in order."""
        self._update()
        if self.parking or not self.parked:
            return
        parked, self.parked = self.parked, {}
        core = self.core
        for tid, t in parked.items():
            if core.tasks.get(tid) is t and t.state is TaskState.READY:
                core.enqueue_ready(t)
        core.schedule()

    # ------------------------------------------------------------------ workers of before
    def connected(self, w: Worker, task_id: bytes) -> None:
        """A worker connected (IDLE); ``task_id``: it outlived the head before while
        running that task (b"": it did not, or it serves a detached actor)."""
        if task_id:
            self.resume(w, task_id)
        elif self.awaited.pop(w.worker_id, None) is not None:
            self._settle()

    def resume(self, w: Worker, task_id: bytes) -> None:
        self.awaited.pop(w.worker_id, None)
        self.resumed[w.worker_id] = task_id
        # It ends once it answered (retire: stopped, a new one only below the pool's
        # size); nothing is queued behind its task.
        w.state, w.retiring, w.grant_shape = WorkerState.BUSY, True, RETIRING
        t = self.core.tasks.get(task_id)
        if t is not None and self._waits(t):
            self._attach(t, w)
        elif t is None:
            self.running[task_id] = (w, self.clock() + KEEP_S)
        self._settle()

    def _attach(self, t: Task, w: Worker) -> None:
        """``t`` runs on ``w`` already: as if dispatched there."""
        core = self.core
        core.unqueue(t)
        self.parked.pop(t.call.task_id, None)
        t.state = TaskState.DISPATCHED
        t.worker = w
        t.attempt += 1
        w.queue.append(t)
        node = core.nodes.get(w.node_id)
        if node is not None and not w.grant and node.resources.fits(t.resources):
            w.grant = dict(t.resources)   # released when it answers (release_grant)
            w.gpu_ids = node.resources.acquire(w.grant)

    def answered(self, w: Worker, t: Task | None, msg: TaskDone) -> bool:
        """``w``, a worker of before, answered; False: its task is attached to it (the
        usual path takes the answer)."""
        tid = self.resumed.pop(w.worker_id, None)
        if tid != msg.task_id:   # (not its task: the usual path)
            if tid is not None:
                self.resumed[w.worker_id] = tid
            return False
        if t is not None and t in w.queue:
            return False
        self.running.pop(tid, None)
        if t is not None and self._waits(t):
            self.core.unqueue(t)   # (parked, or made ready meanwhile)
            self.parked.pop(tid, None)
            self._finish(t, list(msg.returns))
        elif t is None and not msg.cancelled:
            now = self.clock()
            for d in msg.returns:
                self.held[d.object_id] = d
                self.until[d.object_id] = now + KEEP_S
        else:   # run elsewhere meanwhile (its answer stands), or cancelled
            for d in msg.returns:
                if d.segment is not None:
                    self.directory.free_segment(d.segment)
        self._update()
        return True

    # ------------------------------------------------------------------ kept objects
    def offer(self, node_id: int, datas: list[Data], now: float) -> int:
        """A node joined with these objects kept (each in a segment of its store);
        returns how many tasks they ended."""
        for d in datas:
            o = self.core.objects.get(d.object_id)
            if d.segment is None or d.segment.node_id != node_id \
                    or (o is not None and o.data is not None):
                # Not its own, or made again already: nobody will claim it.
                if d.segment is not None:
                    self.directory.free_segment(d.segment)
                continue
            self.held[d.object_id] = d
            self.until[d.object_id] = now + KEEP_S
        # All out of their queues first: one's value sealed would send another (that
        # waited for it as an argument) to a worker before its own turn here.
        ts = [t for t in (self.core.tasks.get(tid) for tid in {task_of(d.object_id) for d in datas})
              if t is not None and self._claimable(t)]
        for t in ts:
            self.core.unqueue(t)
        for t in ts:
            self._done(t)
        self._update()
        return len(ts)

    def claim(self, t: Task) -> bool:
        """Whether ``t`` (just submitted) was done with the objects held for it, or is
        run by a worker of before."""
        run = self.running.pop(t.call.task_id, None) if self.running else None
        if run is not None and self.core.workers.get(run[0].worker_id) is run[0] \
                and self._plain(t):
            if self.core.hold_args(t):   # (else it failed: the worker's answer is dropped)
                self._attach(t, run[0])
            self._update()
            return True
        if not self._claimable(t):
            return False
        self._done(t)
        self._update()
        return True

    @staticmethod
    def _plain(t: Task) -> bool:
        call = t.call
        return not (call.actor_id or call.actor is not None or call.generator)

    def _waits(self, t: Task) -> bool:
        """``t`` is a plain task that waits for its arguments or a worker."""
        return self._plain(t) and t.state in (TaskState.WAITING, TaskState.READY)

    def _claimable(self, t: Task) -> bool:
        rids = t.return_ids
        if not (self._waits(t) and rids and all(r in self.held for r in rids)):
            return False
        # An error it may be retried for is not its answer yet.
        return not (t.call.retry_exceptions and t.retries_left != 0 and
                    any(self.held[r].kind == ERROR for r in rids))

    def _done(self, t: Task) -> None:
        """The task is done with its held returns, as if it ran (SchedulerState.task_done)."""
        returns = [self.held.pop(r) for r in t.return_ids]
        for r in t.return_ids:
            self.until.pop(r, None)
        self.core.unqueue(t)
        self.parked.pop(t.call.task_id, None)
        self._finish(t, returns)

    def _finish(self, t: Task, returns: list[Data]) -> None:
        # Its lineage, as task_done keeps one: made again should the node die.
        self.rebuilds.keep(t.call, t.retries_left, t.owner, returns)
        self.core.finish_task(t)
        for data in returns:
            self.directory.seal(data.object_id, data)

    def relocate(self, oid: bytes, segment: Segment) -> bool:
        d = self.held.get(oid)
        if d is None or d.segment is None or d.segment.path or d.segment.name != segment.name \
                or d.segment.node_id != segment.node_id:
            return False
        self.held[oid] = at(oid, segment)
        return True

    # ------------------------------------------------------------------ time
    def tick(self, now: float) -> list[bytes]:
        """The waits that ran out end; the held objects nobody claimed in time are freed
        (their ids returned); the workers of before whose task nobody made again in time
        are killed."""
        nodes = [nid for nid, until in self.nodes.items() if until <= now]
        workers = [wid for wid, until in self.awaited.items() if until <= now]
        for nid in nodes:
            del self.nodes[nid]
        for wid in workers:
            del self.awaited[wid]
        gone = [oid for oid, until in self.until.items() if until <= now]
        for oid in gone:
            del self.until[oid]
            d = self.held.pop(oid)
            if d.segment is not None:
                self.directory.free_segment(d.segment)
        for tid, (w, until) in list(self.running.items()):
            if until <= now:
                del self.running[tid]
                if self.core.workers.get(w.worker_id) is w:
                    self.core.out.append(KillWorker(
                        w.node_id, w.worker_id, "it ran a task from before the head's restart "
                        f"that no driver made again within {KEEP_S:g} s"))
        self._settle()
        return gone

    def due(self) -> float | None:
        """When tick has something to do next (None: nothing waits)."""
        times = [*self.nodes.values(), *self.awaited.values(), *self.until.values(),
                 *(until for _, until in self.running.values())]
        return min(times) if times else None

    def node_gone(self, node_id: int) -> None:
        for oid in [o for o, d in self.held.items()
                    if d.segment is not None and d.segment.node_id == node_id]:
            del self.held[oid]
            self.until.pop(oid, None)
        self.nodes.pop(node_id, None)
        self._settle()
