"""Per-node object store: the one owner of this node's shared-memory segments.

create: reserve capacity and hand out a segment (a warm one from the pool, or a new
name) -> the writer (driver or worker) maps it, copies, and seals -> the scheduler
records it -> free: when the object's count reaches zero the segment goes back to the
pool, or is unlinked when the pool is full.

Fresh shared memory must be faulted in and zeroed by the kernel (~1-2 GB/s), reused
memory is written at memcpy speed: so freed segments are kept for reuse (up to
``pool_limit`` bytes), newest first, and given back once unused for ``pool_idle_s``
(trim_pool): a busy store reuses its memory, an idle one holds none. An optional warm
reserve (``warm_bytes``, none by default) is allocated in the background after start,
never on init()'s path, and the trim keeps that much pooled for good.

Readers map a segment read-only and never unlink; they tell the store which segments
they map (pin) and when the last view of a map is gone (unpin). A segment whose object
was freed is reused only once nobody maps it, so a live zero-copy view never sees the
bytes of a later object. Readers do not use multiprocessing.shared_memory: CPython's
resource tracker would unlink segments it did not create (gh-82300).

Where segments live, and how they are opened and mapped safely: _objects/segments.py.
Medium objects (size classes up to SLAB_MAX) are slots of slab files, several to a file,
so that memory freed by objects of one class serves another: _objects/slabs.py says how
slots are carved, reused, given back and spilled.
With huge pages (ORCHESTRA_HUGE_PAGES, a hugetlbfs mount), a new segment for an object
of HUGE_MIN or more is made there, its capacity in whole pages, while the mount has the
pages free (less those handed out and not written yet); else, as any other, in /dev/shm.

Spilling: when live objects leave no room for a new one, create() names the least
recently used sealed segments that nobody maps (SpillNeeded); the head copies them to
files of the spill directory on a thread (spill_file), then end_spill() records each
file and frees its segment, and the head points the object at the file. Readers map a
spilled object's file read-only like a segment (page cache, still zero-copy). A
segment that was spilled is unlinked, never pooled: its name is never handed out
again, so a reader that learnt the old name finds it gone (FileNotFoundError) and asks
the head where the object is now instead of reading another object's bytes.
"""
from __future__ import annotations

import collections
import itertools
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from .._proto import types_pb2
from ..exceptions import ObjectStoreFullError
from .segments import (
    HUGE,
    allocate,
    check_private_dir,
    fmt_bytes,
    free_huge_bytes,
    huge_page_mount,
    make_huge_dir,
    make_session_dir,
    page_align,
    remove_private_dir,
    segment_file,
    segment_path,
    sweep_stale_segments,
    unlink_path,
)
from .slabs import SLAB_MAX
from .store_slabs import SlabStore, StoredSegment

_MIN_CLASS = 64 * 1024
# With huge pages (ORCHESTRA_HUGE_PAGES): objects from this size go to them.
HUGE_MIN = 1 << 20
# Seconds a freed segment is kept for reuse when nothing takes it
# (ORCHESTRA_OBJECT_POOL_IDLE_S).
DEFAULT_POOL_IDLE_S = 30.0


def pool_settings(env: Mapping[str, str]) -> tuple[float, int]:
    """(seconds a freed segment is kept for reuse, bytes of warm reserve), from
    ORCHESTRA_OBJECT_POOL_IDLE_S and ORCHESTRA_OBJECT_WARM_RESERVE; ValueError names a
    value that is not one."""
    raw_idle = env.get("ORCHESTRA_OBJECT_POOL_IDLE_S", "")
    raw_warm = env.get("ORCHESTRA_OBJECT_WARM_RESERVE", "")
    try:
        idle = float(raw_idle) if raw_idle else DEFAULT_POOL_IDLE_S
        warm = int(raw_warm) if raw_warm else 0
    except ValueError:
        idle, warm = -1.0, -1
    if not idle >= 0 or warm < 0:
        raise ValueError(
            f"ORCHESTRA_OBJECT_POOL_IDLE_S={raw_idle!r} / ORCHESTRA_OBJECT_WARM_RESERVE="
            f"{raw_warm!r}: seconds (at least 0) and bytes (a whole number, at least 0) "
            "are expected, e.g. 30 and 1073741824")
    return idle, warm


def huge_pages_dir(env: Mapping[str, str], setting: str = "ORCHESTRA_HUGE_PAGES") -> str | None:
    """The hugetlbfs mount that ORCHESTRA_HUGE_PAGES names for large objects, or None;
    ValueError names the ``setting``, what is wrong with it and how to set one up."""
    raw = env.get("ORCHESTRA_HUGE_PAGES", "")
    if not raw:
        return None
    problem = huge_page_mount(raw)
    if problem:
        raise ValueError(
            f"{setting}={raw!r}: {problem}. Mount one and reserve pages, as root: "
            "mkdir -p /mnt/huge && mount -t hugetlbfs none /mnt/huge && "
            "echo 1024 > /proc/sys/vm/nr_hugepages (2 GiB of 2 MiB pages); or "
            f"{'leave it out' if setting.startswith('--') else 'unset it'}")
    return os.path.realpath(raw)


def size_class(n: int) -> int:
    """Round up to one of four sizes per power of two (at most 25% slack)."""
    if n <= _MIN_CLASS:
        return _MIN_CLASS
    top = 1 << (n - 1).bit_length()
    step = top // 8
    return (n + step - 1) // step * step


class SpillNeeded(Exception):
    """create() can make room only once these segments are spilled to disk."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names)
        self.names = names


class ReleaseNeeded(Exception):
    """create() could make room by spilling objects that readers map only to make a
    later get fast: ask them to let go (RELEASE_MAPS), then try again."""

    def __init__(self, held: dict[int, list[str]]) -> None:
        super().__init__(held)
        self.held = held


class SpillJob(NamedTuple):
    """A segment to copy to a spill file (begin_spill -> spill_file -> end_spill)."""

    name: str          # the segment's
    object_id: bytes
    source: str        # its path in shared memory
    dest: str          # the spill file's path
    size: int
    offset: int = 0    # of its bytes in ``source`` (a slot's in its slab)


class ObjectStore(SlabStore):
    def __init__(self, node_id: int, session: str, capacity: int, *,
                 pool_limit: int | None = None, warm_bytes: int = 0,
                 pool_idle_s: float = DEFAULT_POOL_IDLE_S,
                 spill_dir: str | None = None, huge_pages: str | None = None) -> None:
        self.node_id = node_id
        self.capacity = capacity
        self.dir = make_session_dir(session)
        # Huge pages: objects from HUGE_MIN go to the session's directory on that
        # hugetlbfs mount, in whole pages, while the mount has pages free for them
        # (huge_free: now, less those handed out and not written yet); the rest, and
        # all while none are free, to /dev/shm.
        if huge_pages:
            sweep_stale_segments(huge_pages)   # pages a crashed session's files hold
        self.huge = make_huge_dir(self.dir, huge_pages) if huge_pages else ""
        self.huge_page = os.statvfs(huge_pages).f_bsize if huge_pages else 0
        mount = huge_pages or ""
        self.huge_free: Callable[[], int] = lambda: free_huge_bytes(mount)
        self.huge_used = 0     # bytes of huge-page segments (live, pooled or being written)
        self.huge_writing: dict[str, int] = {}   # new ones handed out, not sealed yet
        # Pooled segments are evicted on demand by create(), so the pool may use all
        # capacity that live objects leave free.
        self.pool_limit = capacity if pool_limit is None else pool_limit
        self.warm_bytes = min(warm_bytes, self.pool_limit)
        self.pool_idle_s = pool_idle_s
        self.now: Callable[[], float] = time.monotonic
        self.used = 0          # bytes of segments holding live objects (writing/sealed/retired)
        self.pooled = 0        # bytes of free, warm segments
        self.segs: dict[str, StoredSegment] = {}
        # Free segments by capacity, oldest pooled first (dicts as ordered sets): create()
        # takes the newest (its pages are the likeliest in cache), trim_pool() gives back
        # the oldest, a slab carved again takes its slots out.
        self.pool: dict[int, dict[str, None]] = {}
        self.slabs = {}     # SlabStore's (store_slabs.py)
        self._empty = {}
        self._carving = {}
        self.conn_pins: dict[int, collections.Counter[str]] = {}
        self._n = 0
        self._warming = False
        self._clock = itertools.count(1)
        # Spilling: None turns it off. The directory is made at the first spill and
        # removed by close().
        self.spill_dir = spill_dir
        self.files: dict[str, int] = {}     # spill file path -> bytes
        self.spilled_bytes = 0
        self.spill_error = ""               # why the last spill failed, for the error text
        # (connection, segment name) of read-write maps writers must close: the segment
        # was unlinked, and a map would keep its memory. The head sends them (DropMaps).
        self.dropped: list[tuple[int, str]] = []
        self.warmed: list[str] = []         # warm reserve segments made since last asked

    # ------------------------------------------------------------------ allocation
    def _new_name(self) -> str:
        self._n += 1
        return f"seg-{self._n}"

    def _class(self, size: int) -> int:
        """The capacity of a segment for ``size`` bytes: its size class, in whole huge
        pages where it goes to them (never where that would need a spill the class
        alone would not); where the mount has too few pages free for the class, the
        object's own size in whole pages (an 8 GiB object's class is 10 GiB)."""
        cap = size_class(max(size, 1))
        if self.huge and size >= HUGE_MIN:
            page = self.huge_page
            for whole in (-(-cap // page) * page, -(-size // page) * page):
                if self._huge(whole):
                    return whole
        return cap

    def _huge(self, cap: int) -> bool:
        """Whether a new segment of ``cap`` bytes goes to huge pages (as _class chose: a
        class of a smaller object is never whole pages, being at most HUGE_MIN): it fits
        the store without a spill, and the mount has its pages (those free now, less
        the ones handed out that their writers have not allocated yet)."""
        return bool(self.huge) and cap >= HUGE_MIN and cap % self.huge_page == 0 \
            and self.used + cap <= self.capacity \
            and self.huge_free() - sum(self.huge_writing.values()) >= cap

    def create(self, conn: int, object_id: bytes, size: int, *, spill: bool = True,
               release: bool = True, holds_refs: bool = True) -> types_pb2.Segment:
        """Reserve room for ``size`` bytes; returns the Segment the writer fills.

        Raises SpillNeeded when spilling some objects to disk would make the room (the
        caller spills them and asks again), ObjectStoreFullError when nothing can.
        """
        cap = self._class(size)
        if cap > self.capacity:
            raise ObjectStoreFullError(
                f"an object of {fmt_bytes(size)} cannot fit in the object store of "
                f"{fmt_bytes(self.capacity)} (object_store_memory). Start the cluster with a larger "
                "orchestra.init(object_store_memory=...) or send smaller pieces.")
        if self.used + cap > self.capacity:
            need = self.used + cap - self.capacity
            victims = self._spill_victims(need) if spill else None
            if victims:
                raise SpillNeeded(victims)
            # Readers' maps to let go of, and spares to give back, by connection.
            wanted = dict(self._held_by_readers(need) or {}) if spill and release else {}
            if release:
                for conn, names in self._spares_held().items():
                    wanted.setdefault(conn, []).extend(names)
            if wanted:
                raise ReleaseNeeded(wanted)
            raise ObjectStoreFullError(self._full_message(size, need, spill))
        return self._hand_out(conn, object_id, size, cap, holds_refs)

    def create_spares(self, conn: int, size: int, n: int) -> list[types_pb2.Segment]:
        """Up to ``n`` more segments of ``size``'s class for ``conn``'s next puts of that
        class, which go into them without asking (CreateSegment.spares); each is named
        its object and size when sealed. At most a 32nd of the store at a time, and only
        while live objects and spares leave a quarter of it free: never a spill or a wait
        for them."""
        cap = self._class(size)
        n = min(n, self.capacity // 32 // cap)
        spares: list[types_pb2.Segment] = []
        while len(spares) < n and self.used + cap <= self.capacity - self.capacity // 4:
            try:
                spares.append(self._hand_out(conn, b"", 0, cap, False))
            except ObjectStoreFullError:   # no slab file could be made: fewer spares
                break
        return spares

    def _hand_out(self, conn: int, object_id: bytes, size: int, cap: int,
                  holds_refs: bool) -> types_pb2.Segment:
        """A segment of class ``cap`` for ``conn`` to write (room checked): a pooled
        one, else a new name (pooled ones evicted to make the room)."""
        slotted = cap <= SLAB_MAX and not self._huge(cap)
        name = self._take_pooled(cap)
        if name is None and slotted and self._empty and self._recarve(cap):
            name = self._take_pooled(cap)
        reused = name is not None
        if name is None:
            self._evict_pool(self.used + self.pooled + cap - self.capacity)
            if slotted:
                seg = self.segs[self._cold_slot(cap)]
                seg.state, seg.writer = "writing", conn
            else:
                name = self._new_name()
                if self._huge(cap):
                    name = f"{HUGE}/{name}"
                    self.huge_used += cap
                    self.huge_writing[name] = cap
                seg = self.segs[name] = StoredSegment(name, cap, "writing", conn)
        else:
            seg = self.segs[name]
            seg.state, seg.writer = "writing", conn
            cap = seg.capacity
        if seg.slab is not None:
            seg.slab.live += 1
            seg.slab.mappers.add(conn)
            self._empty.pop(seg.slab.name, None)
        seg.object_id, seg.size, seg.last_use = object_id, size, next(self._clock)
        seg.holds_refs = holds_refs
        self.used += cap
        seg.rw.add(conn)   # the writer keeps its map (see DropMaps)
        allocated = seg.allocated
        if object_id:   # a spare's writer allocates what it writes: counted when sealed
            seg.allocated = max(allocated, min(page_align(max(size, 1)), cap))
        return types_pb2.Segment(name=seg.name, size=size, node_id=self.node_id, capacity=cap,
                                 reused=reused, allocated=allocated)

    def _full_message(self, size: int, need: int, spill: bool) -> str:
        # What no spill can give back: objects mapped or being written, and the slabs
        # they share with others (a slab is spilled whole).
        busy = self.used - sum(u[1] for u in self._spill_units(False))
        text = (f"the object store is full: {fmt_bytes(self.used)} of {fmt_bytes(self.capacity)} held by "
                f"live objects, {fmt_bytes(size)} more needed")
        if self.spill_dir is None:
            reason = "spilling to disk is off"
        elif not spill and self.spill_error:
            reason = f"spilling to disk failed ({self.spill_error})"
        else:
            reason = (f"{fmt_bytes(busy)} of them are in use (mapped by readers or being written) "
                      f"and cannot be spilled to disk, {fmt_bytes(need)} would have to be")
        return (f"{text}; {reason}. Drop ObjectRefs and values read from them that you no "
                "longer need, or start with a larger object_store_memory.")

    def _least_recently_used(self, need: int, *, mapped: bool) -> list[StoredSegment] | None:
        """Sealed segments, least recently used first, ``need`` bytes' worth; those
        that readers map too when ``mapped``. None when they cannot make the room."""
        if self.spill_dir is None:
            return None
        chosen: list[StoredSegment] = []
        room = 0
        for _, size, segs in sorted(self._spill_units(mapped), key=lambda u: u[0]):
            if room >= need:
                break
            chosen.extend(segs)
            room += size
        return chosen if room >= need else None

    def _spill_units(self, mapped: bool) -> list[tuple[int, int, list[StoredSegment]]]:
        """What may be spilled, as (last use, bytes it gives back, its segments): a
        sealed segment (that nobody maps, unless ``mapped``), or a slab whole (its memory
        comes back with its file) when all its objects are such."""
        units = [(s.last_use, s.capacity, [s]) for s in self.segs.values()
                 if s.slab is None and s.state == "sealed" and (mapped or not s.pins)]
        for slab in self.slabs.values():
            if not slab.live:
                continue
            live = [seg for seg in map(self.segs.__getitem__, slab.slots)
                    if seg.state not in ("pooled", "cold", "dead")]
            if all(seg.state == "sealed" and (mapped or not seg.pins) for seg in live):
                units.append((max(seg.last_use for seg in live),
                              (len(live) + slab.dead) * slab.cap, live))
        return units

    def _spill_victims(self, need: int) -> list[str] | None:
        """Segments nobody maps that spilled would make the room."""
        segs = self._least_recently_used(need, mapped=False)
        return [s.name for s in segs] if segs else None

    def readers_hold(self, size: int) -> bool:
        """Whether maps readers keep stand between a create of ``size`` and the room a
        spill would make (ReleaseNeeded asked them to let go)."""
        need = self.used + self._class(size) - self.capacity
        return need > 0 and bool(self._held_by_readers(need))

    def _held_by_readers(self, need: int) -> dict[int, list[str]] | None:
        """The readers' maps to let go of, by connection, so that spilling makes the
        room; None when even that would not."""
        segs = self._least_recently_used(need, mapped=True)
        names = {s.name for s in segs or () if s.pins}
        held: dict[int, list[str]] = {}
        for conn, pins in self.conn_pins.items():
            mine = [n for n in pins if n in names]
            if mine:
                held[conn] = mine
        return held or None

    def _spares_held(self) -> dict[int, list[str]]:
        """The spares handed out and not filled yet, by connection."""
        held: dict[int, list[str]] = {}
        for seg in self.segs.values():
            if seg.state == "writing" and not seg.object_id:
                held.setdefault(seg.writer, []).append(seg.name)
        return held

    def _take_pooled(self, cap: int) -> str | None:
        # Exact class first, else the smallest larger class up to 2x (bounded waste).
        for c in sorted(k for k in self.pool if cap <= k <= 2 * cap):
            q = self.pool[c]
            if q:
                name = q.popitem()[0]
                self.pooled -= c
                return name
        return None

    def _evict_pool(self, need: int) -> None:
        """Unlink pooled segments until ``need`` bytes are returned (largest first)."""
        for c in sorted(self.pool, reverse=True):
            q = self.pool[c]
            while q and need > 0:
                name = next(iter(q))
                del q[name]
                self.pooled -= c
                need -= c
                self._remove(name)

    def trim_pool(self) -> int:
        """Unlink the pooled segments nobody took for ``pool_idle_s`` seconds, oldest
        first, keeping ``warm_bytes`` pooled; returns the bytes given back. The node
        calls it every half second: an idle store gives its memory back to the machine."""
        cutoff = self.now() - self.pool_idle_s
        freed = 0
        for c in sorted(self.pool, reverse=True):
            q = self.pool[c]
            while q and self.segs[next(iter(q))].pooled_at <= cutoff and \
                    self.pooled - c >= self.warm_bytes:
                name = next(iter(q))
                del q[name]
                self.pooled -= c
                freed += c
                self._remove(name)
        return freed

    def seal(self, name: str, object_id: bytes = b"", size: int = 0) -> bool:
        """Its writer filled ``name`` with ``object_id`` of ``size`` bytes: a spare
        (create_spares) learns its object here; False when it is no segment being
        written, or a spare named no object or more bytes than it holds."""
        seg = self.segs.get(name)
        if seg is None or seg.state != "writing":
            return False
        if not seg.object_id:
            if not object_id or not 0 < size <= seg.capacity:
                return False
            seg.object_id, seg.size = object_id, size
            seg.allocated = max(seg.allocated, min(page_align(size), seg.capacity))
        seg.state = "sealed"
        self.huge_writing.pop(name, None)
        return True

    def free(self, name: str) -> None:
        """The object in ``name`` (a segment name or a spill file path) is gone: pool
        the segment once nobody maps it, remove the file."""
        if name in self.files:
            self.spilled_bytes -= self.files.pop(name)
            unlink_path(name)
            return
        seg = self.segs.get(name)
        if seg is None or seg.state in ("pooled", "retired", "spill-cancelled", "cold", "dead"):
            return
        if seg.state == "spilling":
            seg.state = "spill-cancelled"   # end_spill() removes the file
            return
        if seg.pins > 0:
            seg.state = "retired"
            return
        self._release(seg)

    def _release(self, seg: StoredSegment) -> None:
        self.used -= seg.capacity
        self.huge_writing.pop(seg.name, None)
        slab = seg.slab
        if slab is not None:
            slab.live -= 1
            if seg.no_pool:   # its name is never handed out again (slabs.py)
                seg.state = "dead"
                slab.dead += 1
                self.used += seg.capacity
                self._drop_slab_if_done(slab)
                return
        if not seg.no_pool and self.pooled + seg.capacity <= self.pool_limit and \
                self.used + self.pooled + seg.capacity <= self.capacity:
            seg.state, seg.pooled_at = "pooled", self.now()
            self.pool.setdefault(seg.capacity, {})[seg.name] = None
            self.pooled += seg.capacity
            if slab is not None:
                if slab.empty():
                    self._empty[slab.name] = slab
                self._drop_slab_if_done(slab)
        else:
            self._remove(seg.name)

    def abort(self, conn: int, name: str) -> None:
        """The writer could not create, map or fill the segment it was given: give back
        the bytes counted for it and remove the file (never pooled: its state is unknown)."""
        seg = self.segs.get(name)
        if seg is None or seg.state != "writing" or seg.writer != conn:
            return
        seg.no_pool = seg.slab is None   # a slot's file is the store's: sound
        seg.state = "sealed"
        self.free(name)

    def _remove(self, name: str) -> None:
        seg = self.segs.get(name)
        if seg is not None and seg.slab is not None:
            self._chill(seg)
            return
        seg = self.segs.pop(name, None)
        if seg is not None:
            self.dropped.extend((conn, name) for conn in seg.rw)
            if name.startswith(HUGE + "/"):
                self.huge_used -= seg.capacity
                self.huge_writing.pop(name, None)
        self._unlink(name)

    def _unlink(self, name: str) -> None:
        unlink_path(segment_path(self.dir, name))

    # ------------------------------------------------------------------ readers
    def pin(self, conn: int, names: Iterable[str]) -> None:
        pins = self.conn_pins.setdefault(conn, collections.Counter())
        for name in names:
            seg = self.segs.get(name)
            if seg is not None:
                seg.pins += 1
                seg.last_use = next(self._clock)
                pins[name] += 1
                seg.rw.add(conn)   # a reader keeps its map (ObjectIO.rmaps)

    def unpin(self, conn: int, names: Iterable[str]) -> None:
        pins = self.conn_pins.get(conn)
        for name in names:
            if pins is None or pins[name] <= 0:
                continue
            pins[name] -= 1
            if not pins[name]:
                del pins[name]
            self._unpin_one(name)

    def _unpin_one(self, name: str) -> None:
        seg = self.segs.get(name)
        if seg is None:
            return
        seg.pins -= 1
        if seg.pins <= 0 and seg.state == "retired":
            self._release(seg)

    def drop_conn(self, conn: int) -> None:
        """A process disconnected: its unsealed segments are garbage, its maps are gone."""
        for name, n in self.conn_pins.pop(conn, {}).items():
            for _ in range(n):
                self._unpin_one(name)
        for seg in self.segs.values():
            seg.rw.discard(conn)
        for slab in self.slabs.values():
            slab.mappers.discard(conn)
        for seg in [s for s in self.segs.values() if s.state == "writing" and s.writer == conn]:
            # Removed, never pooled: a writer that died after the reply but before its
            # open left no file (a later reuse opens the name without creating it), or
            # one shorter than the segment (ftruncate not reached: a map would SIGBUS).
            # A slot's file is the store's: sound, and reused.
            seg.no_pool = seg.slab is None
            seg.state = "sealed"
            self.free(seg.name)

    # ------------------------------------------------------------------ spilling
    def begin_spill(self, names: list[str]) -> list[SpillJob]:
        """Mark the segments as being spilled; returns what spill_file() copies, off
        the event loop."""
        assert self.spill_dir is not None
        # Also a directory inside a spill_dir= that other users may write: refused unless
        # it is this user's own, mode 0700 (then it is what an earlier spill made).
        try:
            os.mkdir(self.spill_dir, 0o700)
        except FileExistsError:
            pass
        check_private_dir(self.spill_dir)
        jobs = []
        for name in names:
            seg = self.segs[name]
            seg.state = "spilling"
            path, offset = segment_file(self.dir, name)
            jobs.append(SpillJob(name, seg.object_id, path,
                                 os.path.join(self.spill_dir, name.rpartition("/")[2]), seg.size,
                                 offset))
        return jobs

    def end_spill(self, name: str, path: str, error: str) -> types_pb2.Segment | None:
        """A spill_file() finished: the Segment that now locates the object, or None
        when the object was freed meanwhile or the copy failed."""
        seg = self.segs.get(name)
        state = seg.state if seg is not None else ""
        if seg is not None and state in ("spilling", "spill-cancelled"):
            seg.state = "sealed"
        if error:
            self.spill_error = error
        if error or seg is None or state != "spilling":
            unlink_path(path)
            if state == "spill-cancelled":
                self.free(name)
            return None
        self.spill_error = ""
        self.files[path] = seg.size
        self.spilled_bytes += seg.size
        seg.no_pool = True
        self.free(name)
        return types_pb2.Segment(name=name, size=seg.size, node_id=self.node_id, path=path)

    # ------------------------------------------------------------------ warm reserve
    def warm(self, schedule: Callable[[Callable[[], None]], object],
             idle: Callable[[], bool]) -> None:
        """Allocate ``warm_bytes`` of pooled segments on a thread, only while ``idle()``.

        Zeroing shared memory costs a core for ~0.5 s per GiB: done while the cluster has
        nothing else to do, in chunks, so it never competes with tasks. ``schedule``
        hands the result back to the owning (event loop) thread.
        """
        if self._warming or self.warm_bytes <= 0:
            return
        cap = size_class(self.warm_bytes)
        if self.used + self.pooled + cap > self.capacity:
            return
        self._warming = True
        name = self._new_name()
        path = segment_path(self.dir, name)

        def work() -> None:
            ok = allocate(path, cap, idle)
            schedule(lambda: self._warmed(name, cap, ok))
        threading.Thread(target=work, name="orchestra-warm", daemon=True).start()

    def _warmed(self, name: str, cap: int, ok: bool) -> None:
        self._warming = False
        if not ok:
            return
        if self.used + self.pooled + cap > self.capacity or name in self.segs:
            self._unlink(name)
            return
        seg = self.segs[name] = StoredSegment(name, cap, "pooled", -1)
        seg.pooled_at, seg.allocated = self.now(), cap
        self.pool.setdefault(cap, {})[name] = None
        self.pooled += cap
        self.warmed.append(name)

    # ------------------------------------------------------------------ a head lost
    def carry_over(self) -> list[types_pb2.ObjectData]:
        """The head that handed out these segments was lost, and with it every
        connection it named (writers, readers) and every count of refs: forget their
        pins and maps; remove what was being written or spilled, and what was freed
        while mapped; remove spilled files (no next head can name them). Returns the
        objects sealed here without refs inside, which this store keeps for the next
        head (an object holding refs is removed: its refs' counts are gone)."""
        self.conn_pins.clear()
        self.dropped.clear()
        for slab in self.slabs.values():
            slab.mappers.clear()
        kept = []
        for seg in list(self.segs.values()):
            if self.segs.get(seg.name) is not seg:
                continue   # its slab went with a slot before it
            mapped = seg.pins > 0 or bool(seg.rw)
            seg.rw.clear()
            seg.pins = 0
            if seg.state in ("pooled", "cold", "dead"):
                continue
            if seg.state == "sealed" and not seg.holds_refs:
                # A process that outlived the head may read it still (a task's argument,
                # an actor's): freed, it is removed, never handed to another writer.
                seg.no_pool = seg.no_pool or mapped
                kept.append(types_pb2.ObjectData(object_id=seg.object_id, segment=types_pb2.Segment(
                    name=seg.name, size=seg.size, node_id=self.node_id, capacity=seg.capacity)))
                continue
            # writing / spilling (its copy ends unheard: the file is removed below) /
            # retired / holding refs
            seg.no_pool, seg.state = True, "sealed"
            self.free(seg.name)
        for path in list(self.files):
            self.free(path)
        self.dropped.clear()
        return kept

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Remove every segment of this store (its directory, so also ones never
        recorded) and every spill file."""
        self.segs.clear()
        self.pool.clear()
        self.slabs.clear()
        self._empty.clear()
        self._carving.clear()
        self.used = self.pooled = 0
        for path in self.files:
            unlink_path(path)
        self.files.clear()
        self.spilled_bytes = 0
        if self.spill_dir is not None:
            shutil.rmtree(self.spill_dir, ignore_errors=True)
        remove_private_dir(self.dir)
        if self.huge:
            remove_private_dir(self.huge)
            self.huge_used = 0
            self.huge_writing.clear()
