"""The store's records of its segments, and its part that carves slabs (slabs.py says
what slabs are and decides how they are carved): ObjectStore (store.py) is a SlabStore,
one owner on one thread, the node's event loop; these methods change its counts, pool
and files as its own do."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from ..exceptions import ObjectStoreFullError
from .segments import make_slab, punch, segment_file, segment_path, unlink_path
from .slabs import SLAB, Slab, recarve


class StoredSegment:
    __slots__ = ("name", "capacity", "state", "pins", "writer", "object_id", "size",
                 "last_use", "no_pool", "rw", "holds_refs", "pooled_at", "allocated", "slab")

    def __init__(self, name: str, capacity: int, state: str, writer: int) -> None:
        self.name = name
        self.capacity = capacity
        # writing / sealed / spilling / spill-cancelled (freed while spilling) /
        # retired (freed, still mapped) / pooled; a slot also cold / dead (slabs.py)
        self.state = state
        self.pins = 0
        self.writer = writer
        self.object_id = b""
        self.size = 0
        self.last_use = 0
        self.no_pool = False      # spilled: unlink when released, never reuse the name
        # Connections that may keep a map of it (writers; readers keep theirs across
        # objects): told when it is unlinked (DROP_MAPS).
        self.rw: set[int] = set()
        self.holds_refs = False   # refs inside its value: never kept for a next head
        self.pooled_at = 0.0      # when it was last pooled (ObjectStore.now)
        self.allocated = 0        # bytes at its start its writers allocated (Segment.allocated)
        self.slab: Slab | None = None   # the slab it is a slot of


class SlabStore:
    """Slab carving for ObjectStore (store.py), over its fields named below."""

    dir: str
    segs: dict[str, StoredSegment]
    pool: dict[int, dict[str, None]]
    pooled: int
    used: int
    dropped: list[tuple[int, str]]
    now: Callable[[], float]
    _n: int
    # Slabs by file name; those with no object in them and warm slots (to carve again
    # for another class); the slab each class takes cold slots from.
    slabs: dict[str, Slab]
    _empty: dict[str, Slab]
    _carving: dict[int, Slab]

    def _unlink(self, name: str) -> None:   # ObjectStore's
        raise NotImplementedError

    def _new_slab(self, cap: int) -> Slab:
        self._n += 1
        slab = Slab(f"slab-{self._n}", 1, cap)
        path = segment_path(self.dir, slab.name)
        try:
            make_slab(path, SLAB)
        except OSError as exc:
            raise ObjectStoreFullError(
                f"cannot make the slab file {path} ({exc.strerror}); the object was not "
                "stored. Only this session's user can write that directory: free shared "
                "memory (/dev/shm), or stop what makes files there, and put the value "
                "again.") from exc
        self._add_slots(slab, ())
        return slab

    def _add_slots(self, slab: Slab, warm: Iterable[int]) -> None:
        """Record a slab just carved: the slots ``warm`` (indexes) pooled, the rest cold."""
        self.slabs[slab.name] = slab
        warm = set(warm)
        now = self.now()
        for i, name in enumerate(slab.slots):
            seg = self.segs[name] = StoredSegment(name, slab.cap, "cold", -1)
            seg.slab = slab
            if i in warm:
                seg.state, seg.pooled_at = "pooled", now
                self.pool.setdefault(slab.cap, {})[name] = None
                self.pooled += slab.cap
        slab.cold = [n for i, n in enumerate(slab.slots) if i not in warm][::-1]
        if warm:
            self._empty[slab.name] = slab

    def _cold_slot(self, cap: int) -> str:
        """A slot of class ``cap`` with no pages (room checked): from the slab this class
        takes them from, else another with one, else a new slab."""
        slab = self._carving.get(cap)
        if slab is None or not slab.cold or self.slabs.get(slab.name) is not slab:
            slab = next((s for s in self.slabs.values() if s.cap == cap and s.cold), None) \
                or self._new_slab(cap)
            self._carving[cap] = slab
        return slab.cold.pop()

    def _recarve(self, cap: int) -> bool:
        """Carve the empty slab of another class with the most warm slots again for
        ``cap`` (slabs.py), its warm slots pooled: False when none would keep a warm one.
        The file is renamed, so that no name of its old carving finds it."""
        old = max((s for s in self._empty.values() if s.cap != cap),
                  key=lambda s: len(s.slots) - len(s.cold), default=None)
        if old is None:
            return False
        warm = [int(n.rpartition("@")[2]) for n in old.slots if self.segs[n].state == "pooled"]
        keep, holes = recarve(old.cap, warm, cap)
        if not keep:
            return False
        self._forget(old)
        slab = Slab(old.ident, old.carving + 1, cap)
        slab.mappers = old.mappers
        path = segment_path(self.dir, slab.name)
        try:
            os.rename(segment_path(self.dir, old.name), path)
        except OSError:   # (its records are gone already: the file goes too)
            unlink_path(segment_path(self.dir, old.name))
            self.dropped.extend((conn, old.name) for conn in old.mappers)
            return False
        punch(path, holes)
        self._add_slots(slab, keep)
        self._carving[cap] = slab
        return True

    def _chill(self, seg: StoredSegment) -> None:
        """A free slot's pages go back to the machine; the slot stays, cold."""
        slab = seg.slab
        assert slab is not None
        path, offset = segment_file(self.dir, seg.name)
        punch(path, [(offset, seg.capacity)])
        seg.state, seg.allocated = "cold", 0
        slab.cold.append(seg.name)
        self._drop_slab_if_done(slab)

    def _drop_slab_if_done(self, slab: Slab) -> None:
        """Remove a slab that holds no object and no page (all its slots cold), or whose
        last live slot went while a slot of it is dead."""
        if slab.live or (not slab.dead and len(slab.cold) < len(slab.slots)) or \
                self.slabs.get(slab.name) is not slab:
            return
        self._forget(slab)
        self.dropped.extend((conn, slab.name) for conn in slab.mappers)   # their slab maps
        self._unlink(slab.name)

    def _forget(self, slab: Slab) -> None:
        """Take a slab with no live slot out of the records: its slots (those who map
        one are told), its warm ones from the pool, its dead ones' bytes from ``used``."""
        for name in slab.slots:
            seg = self.segs.pop(name)
            self.dropped.extend((conn, name) for conn in seg.rw)
            if seg.state == "pooled":
                del self.pool[slab.cap][name]
                self.pooled -= slab.cap
            elif seg.state == "dead":
                self.used -= slab.cap
        del self.slabs[slab.name]
        self._empty.pop(slab.name, None)
        if self._carving.get(slab.cap) is slab:
            del self._carving[slab.cap]


__all__ = ["SlabStore", "StoredSegment"]
