"""The cluster's objects, for the scheduler core: who holds each one (counts per
client), where its data is (inline, a segment, copies other nodes pulled), who waits for
it (subscribers, tasks); sealed, located and freed here. No I/O.

    put / put_for / seal (a task's result) --> data set, owner and subscribers pushed,
        waiting tasks' dependencies met (SchedulerCore.deps_met)
    ref_delta / decr --> count at zero with data --> free: its segment and copies freed
        (FreeSegment), the refs it contains released; an actor's handle object ends the
        actor (SchedulerCore.handles_gone)
    copy_on / add_copy / relocate --> where a reader on a node maps it
    set_lineage / free / revive --> a freed value that a kept lineage names as an
        argument stays a tomb (its small value, or its own lineage) until the last
        lineage naming it goes; a rebuild whose argument was freed revives it

Objects: PENDING (a task will produce it) -> READY (data inline, in a segment, or an
error) -> freed when its count drops to zero. The count is the number of processes
holding a ref (each tells 0->1 / 1->0), plus queued tasks using it as an argument, plus
sealed objects that contain it.

Lineage (several nodes only): a task's result in shared memory keeps its Lineage (call,
retries left, owner), so that losing its node makes it again. Running that call again
needs its arguments, and a chain whose driver keeps only the last ref has freed each
step's argument when the step ended (a result lost in ~74,000 under node deaths). So, as
Ray's lineage pinning: ``lineage_refs`` counts the kept lineages (live objects' and
tombs') naming each object as an argument; an object freed while that count is positive
leaves a tomb (``tombs``): its own lineage when it has one, else its value when it holds
no refs (small and inline; or in shared memory, made by nothing that could make it
again, as a put passed to the first step of a chain: its segment is freed with the
tomb), and the tomb goes with the last lineage naming it (iteratively: a chain of any
length). A rebuild revives what it needs (``revive``: sealed again from the kept value,
or pending with its lineage to run). Results that can be made again keep only their
calls: memory stays bounded by the chains whose last result is alive and the values at
their roots.

``ObjectDirectory`` owns ``objects``, ``tombs`` and ``lineage_refs`` (SchedulerState.objects
is the same table); the rest of the core reaches them through SchedulerState's event
methods.
"""
from __future__ import annotations

import collections
from collections.abc import Iterable, MutableSequence
from typing import NamedTuple

from .data import ERROR, SEGMENT, Data, Segment, at, error_value
from .instructions import FreeSegment, Pull, Push
from .model import Lineage, Obj, SchedulerCore, TaskState


class Tomb(NamedTuple):
    """A freed object a kept lineage names as an argument: its small value (inline,
    holding no refs), or how to make it again."""

    data: Data | None
    lineage: Lineage | None


# Revived objects belong to no client: their new value is pushed to nobody.
NO_OWNER = -1


class ObjectDirectory:
    """Every object of the cluster (see the module docstring)."""

    def __init__(self, core: SchedulerCore) -> None:
        self.core = core
        self.objects: dict[bytes, Obj] = {}
        self.tombs: dict[bytes, Tomb] = {}
        self.lineage_refs: collections.Counter[bytes] = collections.Counter()
        # A head that drivers outlive: a task's return freed as it is sealed (its owner
        # dropped every ref) is told to its owner (a driver keeps the call until then,
        # _runtime/replay.py), as a lost value no ref can read.
        self.tell_owner_freed = False

    def new_object(self, conn: int, oid: bytes) -> Obj:
        """A pending object held by ``conn`` (implied hold: no RefDelta for it)."""
        o = Obj(conn)
        o.count = 1
        self.objects[oid] = o
        client = self.core.clients.get(conn)
        if client is not None:
            client.holds[oid] += 1
        return o

    def put(self, conn: int, data: Data) -> None:
        """``conn`` put an object: held for it, sealed (the writer has the data already)."""
        oid = data.object_id
        if oid not in self.objects:
            self.new_object(conn, oid)
        self.seal(oid, data, push_owner=False)

    def put_for(self, conn: int, data: Data) -> None:
        """An object of ``conn`` made elsewhere (an actor answering a direct call):
        held for ``conn`` and pushed to it."""
        oid = data.object_id
        if conn not in self.core.clients:
            if data.segment is not None:
                self.free_segment(data.segment)
            return
        if oid not in self.objects:
            self.new_object(conn, oid)
        self.seal(oid, data)

    def register_pending(self, conn: int, ids: Iterable[bytes]) -> None:
        """Results of direct calls ``conn`` made to an actor, not answered yet, whose
        refs leave that process: held for it until it forwards their data (put)."""
        for oid in ids:
            if oid not in self.objects:
                self.new_object(conn, oid)

    def seal(self, oid: bytes, data: Data, push_owner: bool = True) -> None:
        o = self.objects.get(oid)
        if o is None or o.data is not None:
            # Nobody wants it any more (a second run's copy, or the object is gone);
            # the same segment told twice is the object's own, and stays.
            if data.segment is not None and not _holds(o, data.segment):
                self.free_segment(data.segment)
            return
        o.data = data
        if data.segment is not None:
            o.size = data.segment.size
        for cid in data.contained:
            co = self.objects.get(cid)
            if co is not None:
                co.count += 1
        if o.count <= 0:
            self.free(oid, o)
            told = o.subscribers
            if push_owner and self.tell_owner_freed:
                owner = self.core.clients.get(o.owner)
                if owner is not None and owner.kind == "driver" and o.owner not in told:
                    told = [*told, o.owner]
            if told:   # readers holding no ref (locate, gRPC), an owner: it is gone
                lost = error_value(oid, self.core.error("lost", object_id=oid, name=""))
                self.core.out.extend(Push(sub, lost) for sub in told
                                     if sub in self.core.clients)
            return
        out = self.core.out
        if push_owner and o.owner in self.core.clients:
            out.append(Push(o.owner, data))
        for sub in o.subscribers:
            if sub != o.owner and sub in self.core.clients:
                out.append(Push(sub, data))
        o.subscribers = []
        if o.waiting_tasks:
            waiting, o.waiting_tasks = o.waiting_tasks, []
            for t in waiting:
                t.deps.discard(oid)
                if not t.deps and t.state is TaskState.WAITING:
                    self.core.deps_met(t)

    def free_segment(self, segment: Segment) -> None:
        # The store's key: the spill file's path, or the shared-memory segment's name.
        self.core.out.append(FreeSegment(segment.node_id, segment.path or segment.name))

    def relocate(self, oid: bytes, segment: Segment) -> bool:
        """The store spilled the object's segment to a file: point the object at it.
        False when the object is gone or no longer in that segment."""
        o = self.objects.get(oid)
        if o is None:
            return self._relocate_tomb(oid, segment)
        data = o.data
        if data is None or data.segment is None:
            return False
        if segment.node_id != data.segment.node_id:   # a copy another node pulled
            copy = o.copies.get(segment.node_id) if o.copies else None
            if copy is None or copy.path or copy.name != segment.name:
                return False
            o.copies[segment.node_id] = segment  # type: ignore[index]
            return True
        if data.segment.path or data.segment.name != segment.name:
            return False
        o.data = at(oid, segment, data.contained)
        return True

    def _relocate_tomb(self, oid: bytes, segment: Segment) -> bool:
        """A value kept for a lineage was spilled: its tomb points at the file."""
        tomb = self.tombs.get(oid)
        kept = tomb.data if tomb is not None else None
        if kept is None or kept.segment is None or kept.segment.path \
                or kept.segment.name != segment.name or kept.segment.node_id != segment.node_id:
            return False
        self.tombs[oid] = Tomb(at(oid, segment), None)
        return True

    def args_to(self, node_id: int, resolved: MutableSequence[Data]) -> None:
        """Name the copies on a worker's node of its task's large arguments, and have
        the node pull those it lacks now (the worker asks for them once it runs).
        ``resolved`` is the Execute's own list of the objects' records: an entry is
        replaced by the copy's, never changed in place (it is the object's record)."""
        for i, data in enumerate(resolved):
            if data.segment is None or data.segment.node_id == node_id:
                continue
            local = self.copy_on(data.object_id, node_id)
            if local is not None:
                resolved[i] = local
            else:
                self.core.out.append(Pull(node_id, data.object_id))

    def copy_on(self, oid: bytes, node_id: int) -> Data | None:
        """The object's data as a reader on ``node_id`` maps it: the primary copy when it
        is there, else a copy pulled there; None when that node has none (pull it)."""
        o = self.objects.get(oid)
        if o is None or o.data is None:
            return None
        data = o.data
        if data.segment is None or data.segment.node_id == node_id:
            return data
        seg = o.copies.get(node_id) if o.copies else None
        if seg is None:
            return None
        return at(oid, seg, data.contained)

    def add_copy(self, oid: bytes, segment: Segment) -> bool:
        """A node pulled the object into its store; False when the object is gone (the
        caller frees the copy)."""
        o = self.objects.get(oid)
        if o is None or o.data is None or o.data.segment is None:
            return False
        if o.copies is None:
            o.copies = {}
        old = o.copies.get(segment.node_id)
        if old is not None:
            self.free_segment(old)
        o.copies[segment.node_id] = segment
        return True

    def subscribe(self, conn: int, ids: Iterable[bytes]) -> None:
        for oid in ids:
            o = self.objects.get(oid)
            if o is None:
                self.core.out.append(Push(conn, error_value(
                    oid, self.core.error("lost", object_id=oid, name=""))))
            elif o.data is not None:
                self.core.out.append(Push(conn, o.data))
            elif conn not in o.subscribers:
                o.subscribers.append(conn)

    def hold_once(self, conn: int, oid: bytes) -> None:
        """``conn`` holds ``oid`` (once: nothing when it does already), as its creator
        would (a creation made again on a restarted head: SchedulerState.create_actor)."""
        c = self.core.clients.get(conn)
        if c is not None and not c.holds.get(oid, 0):
            self.ref_delta(conn, (oid,), ())

    def ref_delta(self, conn: int, incr: Iterable[bytes], decr: Iterable[bytes]) -> None:
        c = self.core.clients.get(conn)
        objects = self.objects
        for oid in incr:   # increments first: a batch never frees what it also takes
            o = objects.get(oid)
            if o is not None:
                o.count += 1
                if c is not None:
                    c.holds[oid] += 1
        for oid in decr:
            if c is not None:
                n = c.holds.get(oid, 0)
                if n <= 0:
                    continue
                if n == 1:
                    del c.holds[oid]
                else:
                    c.holds[oid] = n - 1
            self.decr(oid)

    def decr(self, oid: bytes, n: int = 1) -> None:
        o = self.objects.get(oid)
        if o is None:
            return
        o.count -= n
        if o.count <= 0 and o.data is not None:
            self.free(oid, o)

    def free(self, oid: bytes, o: Obj) -> None:
        del self.objects[oid]
        if self.core.handles_gone(oid):   # it was an actor's handle: the actor goes
            return
        data = o.data
        assert data is not None, "freed before it was made"
        # A kept lineage may need it: leave a tomb (see the module docstring).
        tomb = _tomb_of(o, data) if self.lineage_refs.get(oid) else None
        if data.segment is not None:
            if tomb is None or tomb.data is None:
                self.free_segment(data.segment)
            if o.copies:
                for seg in o.copies.values():
                    self.free_segment(seg)
        for cid in data.contained:
            self.decr(cid)
        if tomb is not None:
            self.tombs[oid] = tomb
        if o.lineage is not None and (tomb is None or tomb.lineage is None):
            self._forget(o.lineage)

    # ------------------------------------------------------------------ lineage
    def set_lineage(self, oid: bytes, lineage: Lineage | None) -> None:
        """Object ``oid`` is made (again) by ``lineage``, or by nothing any more (None)."""
        o = self.objects.get(oid)
        if o is None or (o.lineage is None and lineage is None):
            return
        if lineage is not None:   # named first: what both name is never released between
            for oid in lineage.call.refs:
                self.lineage_refs[oid] += 1
        old, o.lineage = o.lineage, lineage
        if old is not None:
            self._forget(old)

    def _forget(self, lineage: Lineage) -> None:
        """A kept lineage goes: the tombs only it named go too, and theirs after them."""
        refs, tombs = self.lineage_refs, self.tombs
        stack = [lineage]
        while stack:
            for oid in stack.pop().call.refs:
                n = refs[oid] - 1
                if n > 0:
                    refs[oid] = n
                    continue
                del refs[oid]
                tomb = tombs.pop(oid, None)
                if tomb is None:
                    continue
                if tomb.lineage is not None:
                    stack.append(tomb.lineage)
                elif tomb.data is not None and tomb.data.segment is not None:
                    self.free_segment(tomb.data.segment)   # a kept value: freed now

    def revive(self, oid: bytes) -> Obj | None:
        """A rebuild needs the freed object ``oid``: back from its tomb, sealed with its
        small value or pending with its lineage (the caller runs it); None when nothing
        can make it."""
        tomb = self.tombs.pop(oid, None)
        if tomb is None:
            return None
        o = Obj(NO_OWNER)
        self.objects[oid] = o
        if tomb.data is not None:
            o.data = tomb.data
            if tomb.data.segment is not None:
                o.size = tomb.data.segment.size
        else:
            o.lineage = tomb.lineage   # still counted in lineage_refs: named while it lives
        return o

    def node_lost(self, node_id: int, reason: str) -> dict[bytes, Lineage]:
        """Node ``node_id`` is gone with its store: its copies are forgotten; an object
        whose primary copy was there lives on in a copy pulled elsewhere, is pending
        again when its task can run again (the tasks to rebuild, by task id: call,
        retries left, owner), or holds ObjectLostError naming the node."""
        rebuild: dict[bytes, Lineage] = {}
        gone = [oid for oid, t in self.tombs.items() if t.data is not None
                and t.data.segment is not None and t.data.segment.node_id == node_id]
        for oid in gone:   # a value kept for a lineage, lost with its node
            del self.tombs[oid]
        for oid, o in self.objects.items():
            if o.copies:
                o.copies.pop(node_id, None)
            data = o.data
            if data is None or data.segment is None or data.segment.node_id != node_id:
                continue
            if o.copies:   # another node pulled a copy: it becomes the primary one
                _, seg = o.copies.popitem()
                o.data = at(oid, seg, data.contained)
            elif o.lineage is not None:
                # Pending again: readers wait for the new run. The lineage stays until
                # the run ends (its arguments' tombs are needed by it).
                rebuild.setdefault(o.lineage.call.task_id, o.lineage)
                o.data = None
                for cid in data.contained:   # counted again when it is sealed anew
                    self.decr(cid)
            else:
                o.data = error_value(oid, self.core.error(
                    "node_lost", object_id=oid, node=node_id, reason=reason), data.contained)
        return rebuild


def _tomb_of(o: Obj, data: Data) -> Tomb | None:
    """What a freed object a kept lineage names leaves: its own lineage (a task's result
    in shared memory), else its value when it holds no refs (small and inline, or in
    shared memory and made by nothing that could make it again: a put, or a task with
    no retry left; kept until the last lineage naming it goes), else nothing."""
    kind = data.kind
    if kind == SEGMENT and o.lineage is not None:
        return Tomb(None, o.lineage)
    if kind != ERROR and not data.contained:
        return Tomb(data, None)
    return None


def _holds(o: Obj | None, segment: Segment) -> bool:
    """Whether ``segment`` is where object ``o`` lives now, or a copy of it."""
    if o is None or o.data is None:
        return False
    key = segment.key()
    own = o.data.segment
    if own is not None and own.key() == key:
        return True
    copies = o.copies or {}
    return any(c.key() == key for c in copies.values())
