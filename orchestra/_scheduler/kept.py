"""Objects a joined node's store kept across a restart of the head, until a task made
again claims them or they expire.

    a node joins the restarted head -> offer(node_id, NodeRegister.kept, now): each
        object held until now + KEEP_S; a task already submitted again (a driver's
        replay, _runtime/replay.py) that returns it is done with it at once
    a task submitted -> claim(t) (SchedulerState.submit, before it holds its arguments):
        True when every return of it is held; then it is done with them, never run
    a kept object spilled by its node -> relocate(oid, segment): held at its file now
    expire(now) -> the segments of those nobody claimed in time, freed on their node
    node_gone(node_id) -> its objects dropped (gone with the node)

What qualifies: a plain task (not an actor's call or constructor, not a generator) that
waits for its arguments or a worker; one a worker runs already answers itself, and the
kept copy expires. A store keeps only sealed objects with no refs inside
(ObjectStore.carry_over): their counts went with the head before.

Rule: I/O-free; owned by the head's loop, as SchedulerState is (the frees go out as
its instructions).
"""
from __future__ import annotations

from .._ids import task_of
from .._protocol import pb
from .lineage import Rebuilds
from .model import SchedulerCore, Task, TaskState
from .objects import ObjectDirectory

# How long a restarted head holds a node's kept objects for the tasks its drivers make
# again: they connect within a second of the head listening, and send what they carry
# over at once.
KEEP_S = 30.0


class KeptObjects:
    def __init__(self, core: SchedulerCore, directory: ObjectDirectory, rebuilds: Rebuilds) -> None:
        self.core, self.directory, self.rebuilds = core, directory, rebuilds
        self.held: dict[bytes, pb.ObjectData] = {}   # object id -> where its node keeps it
        self.until: dict[bytes, float] = {}          # object id -> when it expires

    def offer(self, node_id: int, datas: list[pb.ObjectData], now: float) -> int:
        """A node joined with these objects kept; returns how many tasks they ended."""
        for d in datas:
            o = self.core.objects.get(d.object_id)
            if d.segment.node_id != node_id or (o is not None and o.data is not None):
                # Not its own, or made again already: nobody will claim it.
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
        return len(ts)

    def claim(self, t: Task) -> bool:
        """Whether ``t`` (just submitted) was done with the objects held for it."""
        if not self._claimable(t):
            return False
        self._done(t)
        return True

    def _claimable(self, t: Task) -> bool:
        call = t.call
        if call.actor_id or call.HasField("actor") or call.generator or \
                t.state not in (TaskState.WAITING, TaskState.READY):
            return False
        rids = t.return_ids
        return bool(rids) and all(r in self.held for r in rids)

    def _done(self, t: Task) -> None:
        """The task is done with its held returns, as if it ran (SchedulerState.task_done)."""
        returns = [self.held.pop(r) for r in t.return_ids]
        for r in t.return_ids:
            self.until.pop(r, None)
        core = self.core
        core.unqueue(t)
        # Its lineage, as task_done keeps one: made again should the node die.
        self.rebuilds.keep(t.call, t.retries_left, t.owner, returns)
        core.finish_task(t)
        for data in returns:
            self.directory.seal(data.object_id, data)

    def relocate(self, oid: bytes, segment: pb.Segment) -> bool:
        d = self.held.get(oid)
        if d is None or d.segment.path or d.segment.name != segment.name or \
                d.segment.node_id != segment.node_id:
            return False
        self.held[oid] = pb.ObjectData(object_id=oid, segment=segment)
        return True

    def expire(self, now: float) -> list[bytes]:
        """Free the segments of objects nobody claimed in time; their ids."""
        gone = [oid for oid, t in self.until.items() if t <= now]
        for oid in gone:
            del self.until[oid]
            self.directory.free_segment(self.held.pop(oid).segment)
        return gone

    def node_gone(self, node_id: int) -> None:
        for oid in [o for o, d in self.held.items() if d.segment.node_id == node_id]:
            del self.held[oid]
            self.until.pop(oid, None)
