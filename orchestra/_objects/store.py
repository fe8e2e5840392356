"""Per-node object store: the one owner of this node's shared-memory segments.

create: reserve capacity and hand out a segment (a warm one from the pool, or a new
name) -> the writer (driver or worker) maps it, copies, and seals -> the scheduler
records it -> free: when the object's count reaches zero the segment goes back to the
pool, or is unlinked when the pool is full.

Fresh shared memory costs ~3 ms per MiB to fault in, reused memory is written at memcpy
speed: so freed segments are kept (up to ``pool_limit`` bytes) and a warm reserve is
allocated in the background after start, never on init()'s path.

Readers map a segment read-only and never unlink; they tell the store which segments
they map (pin) and when the last view of a map is gone (unpin). A segment whose object
was freed is reused only once nobody maps it, so a live zero-copy view never sees the
bytes of a later object. Readers do not use multiprocessing.shared_memory: CPython's
resource tracker would unlink segments it did not create (gh-82300).

Where segments live: a directory of the session under /dev/shm, made by the store
(``orchestra-<uid>-<head pid>-<session>-<random>``, mode 0700, checked after mkdir).
/dev/shm itself is writable by every user: segments there under predictable names let
another user squat the next names (every large put failed with FileExistsError) or
plant a pickle at the name of a spilled segment (the next get unpickled it: code
execution as the session's user). In the private directory only the session's user
can list, create or open anything. On top of that every open is O_NOFOLLOW (O_EXCL as
well when creating), and before a map the file must be a regular file of this user with
mode 0600. A failed create or map raises ObjectStoreError naming the file; the writer
then asks the store to give back the bytes counted for the segment (abort). The pid in
the directory's name tells a later session which directories a crashed head left
behind (sweep_stale_segments). Every path of a segment is made by segment_path().

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
import errno
import itertools
import mmap
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from .._platform.procutil import pid_alive
from .._proto import types_pb2
from ..exceptions import ObjectStoreError, ObjectStoreFullError
from .pages import map_for_writing, populate_write
from .serialization import Serialized

SHM_DIR = "/dev/shm"
DIR_PREFIX = "orchestra-"      # + <uid>-<head pid>-<session>-<random>: see make_session_dir
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_MIN_CLASS = 64 * 1024
_WARM_CHUNK = 8 << 20


def size_class(n: int) -> int:
    """Round up to one of four sizes per power of two (at most 25% slack)."""
    if n <= _MIN_CLASS:
        return _MIN_CLASS
    top = 1 << (n - 1).bit_length()
    step = top // 8
    return (n + step - 1) // step * step


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


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


class StoredSegment:
    __slots__ = ("name", "capacity", "state", "pins", "writer", "object_id", "size",
                 "last_use", "no_pool", "rw", "holds_refs")

    def __init__(self, name: str, capacity: int, state: str, writer: int) -> None:
        self.name = name
        self.capacity = capacity
        # writing / sealed / spilling / spill-cancelled (freed while spilling) /
        # retired (freed, still mapped) / pooled
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


class ObjectStore:
    def __init__(self, node_id: int, session: str, capacity: int, *,
                 pool_limit: int | None = None, warm_bytes: int = 0,
                 spill_dir: str | None = None) -> None:
        self.node_id = node_id
        self.capacity = capacity
        self.dir = make_session_dir(session)
        # Pooled segments are evicted on demand by create(), so the pool may use all
        # capacity that live objects leave free.
        self.pool_limit = capacity if pool_limit is None else pool_limit
        self.warm_bytes = min(warm_bytes, self.pool_limit)
        self.used = 0          # bytes of segments holding live objects (writing/sealed/retired)
        self.pooled = 0        # bytes of free, warm segments
        self.segs: dict[str, StoredSegment] = {}
        self.pool: dict[int, collections.deque[str]] = {}
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

    def create(self, conn: int, object_id: bytes, size: int, *, spill: bool = True,
               release: bool = True, holds_refs: bool = True) -> types_pb2.Segment:
        """Reserve room for ``size`` bytes; returns the Segment the writer fills.

        Raises SpillNeeded when spilling some objects to disk would make the room (the
        caller spills them and asks again), ObjectStoreFullError when nothing can.
        """
        cap = size_class(max(size, 1))
        if cap > self.capacity:
            raise ObjectStoreFullError(
                f"an object of {_fmt(size)} cannot fit in the object store of "
                f"{_fmt(self.capacity)} (object_store_memory). Start the cluster with a larger "
                "orchestra.init(object_store_memory=...) or send smaller pieces.")
        if self.used + cap > self.capacity:
            need = self.used + cap - self.capacity
            victims = self._spill_victims(need) if spill else None
            if victims:
                raise SpillNeeded(victims)
            held = self._held_by_readers(need) if spill and release else None
            if held:
                raise ReleaseNeeded(held)
            raise ObjectStoreFullError(self._full_message(size, need, spill))
        name = self._take_pooled(cap)
        reused = name is not None
        if name is None:
            self._evict_pool(self.used + self.pooled + cap - self.capacity)
            name = self._new_name()
            seg = self.segs[name] = StoredSegment(name, cap, "writing", conn)
        else:
            seg = self.segs[name]
            seg.state, seg.writer = "writing", conn
            cap = seg.capacity
        seg.object_id, seg.size, seg.last_use = object_id, size, next(self._clock)
        seg.holds_refs = holds_refs
        self.used += cap
        seg.rw.add(conn)   # the writer keeps its map (see DropMaps)
        return types_pb2.Segment(name=name, size=size, node_id=self.node_id, capacity=cap,
                                 reused=reused)

    def _full_message(self, size: int, need: int, spill: bool) -> str:
        busy = sum(s.capacity for s in self.segs.values()
                   if s.state in ("writing", "retired") or (s.state == "sealed" and s.pins))
        text = (f"the object store is full: {_fmt(self.used)} of {_fmt(self.capacity)} held by "
                f"live objects, {_fmt(size)} more needed")
        if self.spill_dir is None:
            reason = "spilling to disk is off"
        elif not spill and self.spill_error:
            reason = f"spilling to disk failed ({self.spill_error})"
        else:
            reason = (f"{_fmt(busy)} of them are in use (mapped by readers or being written) "
                      f"and cannot be spilled to disk, {_fmt(need)} would have to be")
        return (f"{text}; {reason}. Drop ObjectRefs and values read from them that you no "
                "longer need, or start with a larger object_store_memory.")

    def _least_recently_used(self, need: int, *, mapped: bool) -> list[StoredSegment] | None:
        """Sealed segments, least recently used first, ``need`` bytes' worth; those
        that readers map too when ``mapped``. None when they cannot make the room."""
        if self.spill_dir is None:
            return None
        chosen, room = [], 0
        for seg in sorted((s for s in self.segs.values()
                           if s.state == "sealed" and (mapped or not s.pins)),
                          key=lambda s: s.last_use):
            if room >= need:
                break
            chosen.append(seg)
            room += seg.capacity
        return chosen if room >= need else None

    def _spill_victims(self, need: int) -> list[str] | None:
        """Segments nobody maps that spilled would make the room."""
        segs = self._least_recently_used(need, mapped=False)
        return [s.name for s in segs] if segs else None

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

    def _take_pooled(self, cap: int) -> str | None:
        # Exact class first, else the smallest larger class up to 2x (bounded waste).
        for c in sorted(k for k in self.pool if cap <= k <= 2 * cap):
            q = self.pool[c]
            if q:
                name = q.popleft()
                self.pooled -= c
                return name
        return None

    def _evict_pool(self, need: int) -> None:
        """Unlink pooled segments until ``need`` bytes are returned (largest first)."""
        for c in sorted(self.pool, reverse=True):
            q = self.pool[c]
            while q and need > 0:
                name = q.pop()
                self.pooled -= c
                need -= c
                self._remove(name)

    def seal(self, name: str) -> bool:
        seg = self.segs.get(name)
        if seg is None or seg.state != "writing":
            return False
        seg.state = "sealed"
        return True

    def free(self, name: str) -> None:
        """The object in ``name`` (a segment name or a spill file path) is gone: pool
        the segment once nobody maps it, remove the file."""
        if name in self.files:
            self.spilled_bytes -= self.files.pop(name)
            _unlink_path(name)
            return
        seg = self.segs.get(name)
        if seg is None or seg.state in ("pooled", "retired", "spill-cancelled"):
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
        if not seg.no_pool and self.pooled + seg.capacity <= self.pool_limit and \
                self.used + self.pooled + seg.capacity <= self.capacity:
            seg.state = "pooled"
            self.pool.setdefault(seg.capacity, collections.deque()).append(seg.name)
            self.pooled += seg.capacity
        else:
            self._remove(seg.name)

    def abort(self, conn: int, name: str) -> None:
        """The writer could not create, map or fill the segment it was given: give back
        the bytes counted for it and remove the file (never pooled: its state is unknown)."""
        seg = self.segs.get(name)
        if seg is None or seg.state != "writing" or seg.writer != conn:
            return
        seg.no_pool = True
        seg.state = "sealed"
        self.free(name)

    def _remove(self, name: str) -> None:
        seg = self.segs.pop(name, None)
        if seg is not None:
            self.dropped.extend((conn, name) for conn in seg.rw)
        self._unlink(name)

    def _unlink(self, name: str) -> None:
        _unlink_path(segment_path(self.dir, name))

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
        for seg in [s for s in self.segs.values() if s.state == "writing" and s.writer == conn]:
            # Removed, never pooled: a writer that died after the reply but before its
            # open left no file (a later reuse opens the name without creating it), or
            # one shorter than the segment (ftruncate not reached: a map would SIGBUS).
            seg.no_pool = True
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
            jobs.append(SpillJob(name, seg.object_id, segment_path(self.dir, name),
                                 os.path.join(self.spill_dir, name), seg.size))
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
            _unlink_path(path)
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
            ok = _allocate(path, cap, idle)
            schedule(lambda: self._warmed(name, cap, ok))
        threading.Thread(target=work, name="orchestra-warm", daemon=True).start()

    def _warmed(self, name: str, cap: int, ok: bool) -> None:
        self._warming = False
        if not ok:
            return
        if self.used + self.pooled + cap > self.capacity or name in self.segs:
            self._unlink(name)
            return
        self.segs[name] = StoredSegment(name, cap, "pooled", -1)
        self.pool.setdefault(cap, collections.deque()).append(name)
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
        kept = []
        for seg in list(self.segs.values()):
            mapped = seg.pins > 0 or bool(seg.rw)
            seg.rw.clear()
            seg.pins = 0
            if seg.state == "pooled":
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
        self.used = self.pooled = 0
        for path in self.files:
            _unlink_path(path)
        self.files.clear()
        self.spilled_bytes = 0
        if self.spill_dir is not None:
            shutil.rmtree(self.spill_dir, ignore_errors=True)
        remove_private_dir(self.dir)


# ---------------------------------------------------------------- the private directory


def session_dir_prefix(pid: int) -> str:
    """The start of the name of every segment directory the store of process ``pid``
    makes under /dev/shm (this user's)."""
    return f"{DIR_PREFIX}{os.geteuid()}-{pid}-"


def make_session_dir(session: str) -> str:
    """Create the session's directory of segments under /dev/shm: mode 0700, a name
    nobody can guess (mkdtemp retries on a name taken already, so squatting it only
    costs the squatter)."""
    prefix = f"{session_dir_prefix(os.getpid())}{session}-"
    try:
        path = tempfile.mkdtemp(prefix=prefix, dir=SHM_DIR)
    except OSError as exc:
        raise ObjectStoreError(
            f"cannot create the session's shared-memory directory in {SHM_DIR} "
            f"({exc.strerror}): the object store needs a writable {SHM_DIR} (a tmpfs). "
            f"Mount one, or give this user write access to it.") from exc
    os.chmod(path, 0o700)   # mkdir's mode is masked by the umask; nobody else can swap it
    check_private_dir(path)
    return path


def check_private_dir(path: str) -> None:
    """Raise ObjectStoreError unless ``path`` is a directory (not a link) of this user
    with mode 0700: only then can no other user put or replace a file in it."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise ObjectStoreError(f"cannot check the private directory {path} ({exc.strerror})") from exc
    problem = _not_own(st, stat.S_ISDIR, "a directory", 0o700)
    if problem:
        raise ObjectStoreError(
            f"{path} is not this session's private directory: {problem}. Another user or "
            "program made or changed it; remove it (or pick another spill_dir=) and start "
            "the cluster again.")


def remove_private_dir(path: str) -> bool:
    """Remove a directory of segments made by make_session_dir, if it is ours."""
    try:
        check_private_dir(path)
    except ObjectStoreError:
        return False   # gone already, or not ours to remove
    shutil.rmtree(path, ignore_errors=True)
    return True


def segment_path(folder: str, name: str) -> str:
    """The file of segment ``name`` in the session's directory ``folder``."""
    if "/" in name or name.startswith("."):
        raise ObjectStoreError(f"bad segment name {name!r}: not a file of {folder}")
    return f"{folder}/{name}"


def _not_own(st: os.stat_result, is_kind: Callable[[int], bool], kind: str, mode: int) -> str:
    """Why a file is not this user's own of ``kind`` and ``mode``; "" when it is."""
    if not is_kind(st.st_mode):
        return f"it is not {kind}" + (" (a symbolic link)" if stat.S_ISLNK(st.st_mode) else "")
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if stat.S_IMODE(st.st_mode) != mode:
        return f"its mode is {stat.S_IMODE(st.st_mode):04o}, not {mode:04o}"
    return ""


def _open_own(path: str, flags: int) -> int:
    """Open a segment or spill file of this session: never through a symbolic link, and
    only a regular file of this user with mode 0600. Raises FileNotFoundError when it is
    gone (the object moved), ObjectStoreError naming path and cause otherwise."""
    try:
        fd = os.open(path, flags | _NOFOLLOW, 0o600)
    except FileNotFoundError:
        raise
    except FileExistsError as exc:
        raise ObjectStoreError(
            f"cannot create the segment {path}: a file of that name exists already. Only "
            "this session's user can write its directory, so a program of this user made "
            "it; the object was not stored (put it again).") from exc
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ObjectStoreError(f"cannot open the segment {path} ({why}); the object's data "
                               "cannot be read or written here. A segment is only ever a "
                               "file of this session's user: stop what changes files in "
                               "that directory, and put the value again.") from exc
    try:
        problem = _not_own(os.fstat(fd), stat.S_ISREG, "a regular file", 0o600)
    except OSError as exc:
        problem = exc.strerror or "fstat failed"
    if problem:
        os.close(fd)
        raise ObjectStoreError(
            f"refusing to map {path}: {problem}. A segment is only ever a file of this "
            "session's user with mode 0600: a program of this user replaced or changed it "
            "(no other user can). Stop what writes into that directory, and put the value "
            "again.")
    return fd


def _allocate(path: str, cap: int, idle: Callable[[], bool]) -> bool:
    """Create a segment and write every page once (tmpfs zeroes a page at its first
    touch, ~3 ms per MiB): the first large put then writes at memcpy speed."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | _NOFOLLOW, 0o600)
    except OSError:
        return False
    zeros = bytes(_WARM_CHUNK)
    try:
        os.ftruncate(fd, cap)
        for off in range(0, cap, _WARM_CHUNK):
            while not idle():
                time.sleep(0.05)
            # pwrite releases the GIL, unlike a populating mmap: the loop stays responsive.
            os.pwrite(fd, zeros[: min(_WARM_CHUNK, cap - off)], off)
        return True
    except OSError:
        _unlink_path(path)
        return False
    finally:
        os.close(fd)


def _unlink_path(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        # Not a file (a directory someone made at a segment's name): its name is never
        # handed out again, and the session's directory goes with the session.
        pass


def spill_file(src: str, dst: str, size: int) -> str:
    """Copy a sealed segment to its spill file in the kernel; "" or why it failed."""
    try:
        fin = os.open(src, os.O_RDONLY | _NOFOLLOW)
    except OSError as exc:
        return f"{src}: {exc.strerror}"
    try:
        fout = os.open(dst, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NOFOLLOW, 0o600)
    except OSError as exc:
        os.close(fin)
        return f"{dst}: {exc.strerror}"
    try:
        off = 0
        while off < size:
            n = os.sendfile(fout, fin, off, min(size - off, 1 << 30))
            if n <= 0:
                return f"{dst}: short copy ({off} of {size} bytes)"
            off += n
        return ""
    except OSError as exc:
        return f"{dst}: {exc.strerror}"
    finally:
        os.close(fin)
        os.close(fout)


def sweep_stale_segments() -> int:
    """Remove this user's segment directories of sessions whose head process is gone
    (the pid in the name). Returns how many. Another user's entries are never touched,
    even by root: a name says nothing of who made it, the owner does."""
    removed = 0
    mine = f"{DIR_PREFIX}{os.geteuid()}-"
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(mine):
            continue
        try:
            pid = int(name[len(mine):].split("-", 1)[0])
        except ValueError:
            continue
        if not pid_alive(pid) and remove_private_dir(os.path.join(SHM_DIR, name)):
            removed += 1
    return removed


# ---------------------------------------------------------------- writer / reader side


def open_segment(folder: str, segment: types_pb2.Segment) -> mmap.mmap:
    """A read-write map of the whole segment the store handed out, pages mapped.
    ObjectStoreError (or ObjectStoreFullError) when it cannot be made: the caller
    aborts the segment so that the store gives its bytes back."""
    path = segment_path(folder, segment.name)
    size = max(segment.size, 1)
    cap = max(segment.capacity, size)
    try:
        fd = _open_own(path, os.O_RDWR if segment.reused else os.O_CREAT | os.O_EXCL | os.O_RDWR)
    except FileNotFoundError as exc:   # the store removed it, or the session ends
        raise ObjectStoreError(f"cannot open the segment {path}: it is gone (the cluster is "
                               "shutting down, or something removed it)") from exc
    try:
        if not segment.reused:
            os.ftruncate(fd, cap)
            try:
                # Allocate now: a full /dev/shm then fails here with ENOSPC instead of
                # killing the writer with SIGBUS in the middle of the copy.
                os.posix_fallocate(fd, 0, cap)
            except OSError as exc:
                raise ObjectStoreFullError(
                    f"/dev/shm has no room for an object of {_fmt(size)} ({exc.strerror}). "
                    "Free shared memory, or lower object_store_memory so the store fits "
                    "in /dev/shm.") from exc
        return map_for_writing(fd, cap, fresh=not segment.reused)
    except OSError as exc:
        raise ObjectStoreError(f"cannot size or map the segment {path} ({exc.strerror}); "
                               "the object was not stored.") from exc
    finally:
        os.close(fd)


def map_ahead(folder: str, name: str) -> mmap.mmap | None:
    """A read-write map of an existing segment with its pages mapped, the GIL released
    meanwhile (a populating mmap() holds it for ~0.1 s per 512 MiB); None if gone or
    not the session's own file (the put then opens it itself, and says why)."""
    try:
        fd = _open_own(segment_path(folder, name), os.O_RDWR)
    except (OSError, ObjectStoreError):
        return None
    try:
        size = os.fstat(fd).st_size
        if size <= 0:
            return None
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError:
        return None
    finally:
        os.close(fd)
    populate_write(mm)
    return mm




def write_into(mm: mmap.mmap, ser: Serialized) -> None:
    view = memoryview(mm)
    try:
        ser.write_into(view)
    finally:
        view.release()


def map_segment(folder: str, segment: types_pb2.Segment,
                whole: bool = False) -> tuple[mmap.mmap, memoryview]:
    """A read-only map of a sealed segment or spill file (``whole``: all of the file, for
    the later objects the segment will hold); it lives as long as views of it.
    FileNotFoundError: the object moved (spilled), ask the head where to;
    ObjectStoreError: the file is not the session's own, or cannot be mapped."""
    path = segment.path or segment_path(folder, segment.name)
    fd = _open_own(path, os.O_RDONLY)
    try:
        length = max(os.fstat(fd).st_size if whole else segment.size, segment.size, 1)
        mm = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ)
    except (OSError, ValueError) as exc:
        raise ObjectStoreError(f"cannot map {path} ({exc}); the object's data cannot be "
                               "read here.") from exc
    finally:
        os.close(fd)
    return mm, memoryview(mm)[: segment.size]
