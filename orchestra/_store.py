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

Segments are named ``orch-<head pid>-<session>-<n>`` so that a later session can tell
(by the pid) which ones a crashed session left behind, and remove them.
"""
from __future__ import annotations

import collections
import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ._proto import types_pb2
from .exceptions import ObjectStoreFullError

SHM_DIR = "/dev/shm"
PREFIX = "orch-"
_MIN_CLASS = 64 * 1024
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
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


class _Seg:
    __slots__ = ("name", "capacity", "state", "pins", "writer")

    def __init__(self, name: str, capacity: int, state: str, writer: int) -> None:
        self.name = name
        self.capacity = capacity
        self.state = state        # writing / sealed / retired (freed, still mapped) / pooled
        self.pins = 0
        self.writer = writer


class ObjectStore:
    def __init__(self, node_id: int, session: str, capacity: int, *,
                 pool_limit: int | None = None, warm_bytes: int = 0) -> None:
        self.node_id = node_id
        self.capacity = capacity
        self.prefix = f"{PREFIX}{os.getpid()}-{session}-"
        # Pooled segments are evicted on demand by create(), so the pool may use all
        # capacity that live objects leave free.
        self.pool_limit = capacity if pool_limit is None else pool_limit
        self.warm_bytes = min(warm_bytes, self.pool_limit)
        self.used = 0          # bytes of segments holding live objects (writing/sealed/retired)
        self.pooled = 0        # bytes of free, warm segments
        self.segs: dict[str, _Seg] = {}
        self.pool: dict[int, collections.deque[str]] = {}
        self.conn_pins: dict[int, collections.Counter[str]] = {}
        self._n = 0
        self._warming = False

    # ------------------------------------------------------------------ allocation
    def _new_name(self) -> str:
        self._n += 1
        return f"{self.prefix}{self._n}"

    def create(self, conn: int, object_id: bytes, size: int) -> Any:
        """Reserve room for ``size`` bytes; returns the Segment the writer fills."""
        cap = size_class(max(size, 1))
        if cap > self.capacity:
            raise ObjectStoreFullError(
                f"an object of {_fmt(size)} cannot fit in the object store of "
                f"{_fmt(self.capacity)} (object_store_memory). Start the cluster with a larger "
                "orchestra.init(object_store_memory=...) or send smaller pieces.")
        if self.used + cap > self.capacity:
            raise ObjectStoreFullError(
                f"the object store is full: {_fmt(self.used)} of {_fmt(self.capacity)} held by "
                f"live objects, {_fmt(size)} more needed. Drop ObjectRefs you no longer need, "
                "or start with a larger object_store_memory.")
        name = self._take_pooled(cap)
        reused = name is not None
        if name is None:
            self._evict_pool(self.used + self.pooled + cap - self.capacity)
            name = self._new_name()
            self.segs[name] = _Seg(name, cap, "writing", conn)
        else:
            seg = self.segs[name]
            seg.state, seg.writer = "writing", conn
            cap = seg.capacity
        self.used += cap
        return types_pb2.Segment(name=name, size=size, node_id=self.node_id, capacity=cap,
                                 reused=reused)

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
                self.segs.pop(name, None)
                _unlink(name)

    def seal(self, name: str) -> bool:
        seg = self.segs.get(name)
        if seg is None or seg.state != "writing":
            return False
        seg.state = "sealed"
        return True

    def free(self, name: str) -> None:
        """The object in ``name`` is gone: pool the segment once nobody maps it."""
        seg = self.segs.get(name)
        if seg is None or seg.state in ("pooled", "retired"):
            return
        if seg.pins > 0:
            seg.state = "retired"
            return
        self._release(seg)

    def _release(self, seg: _Seg) -> None:
        self.used -= seg.capacity
        if self.pooled + seg.capacity <= self.pool_limit and \
                self.used + self.pooled + seg.capacity <= self.capacity:
            seg.state = "pooled"
            self.pool.setdefault(seg.capacity, collections.deque()).append(seg.name)
            self.pooled += seg.capacity
        else:
            del self.segs[seg.name]
            _unlink(seg.name)

    # ------------------------------------------------------------------ readers
    def pin(self, conn: int, names: Any) -> None:
        pins = self.conn_pins.setdefault(conn, collections.Counter())
        for name in names:
            seg = self.segs.get(name)
            if seg is not None:
                seg.pins += 1
                pins[name] += 1

    def unpin(self, conn: int, names: Any) -> None:
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
        for seg in [s for s in self.segs.values() if s.state == "writing" and s.writer == conn]:
            seg.state = "sealed"
            self.free(seg.name)

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

        def work() -> None:
            ok = _allocate(name, cap, idle)
            schedule(lambda: self._warmed(name, cap, ok))
        threading.Thread(target=work, name="orchestra-warm", daemon=True).start()

    def _warmed(self, name: str, cap: int, ok: bool) -> None:
        self._warming = False
        if not ok:
            return
        if self.used + self.pooled + cap > self.capacity or name in self.segs:
            _unlink(name)
            return
        self.segs[name] = _Seg(name, cap, "pooled", -1)
        self.pool.setdefault(cap, collections.deque()).append(name)
        self.pooled += cap

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Unlink every segment of this store, also ones never recorded."""
        for name in list(self.segs):
            _unlink(name)
        self.segs.clear()
        self.pool.clear()
        self.used = self.pooled = 0
        try:
            for name in os.listdir(SHM_DIR):
                if name.startswith(self.prefix):
                    _unlink(name)
        except OSError:
            pass



def _allocate(name: str, cap: int, idle: Callable[[], bool]) -> bool:
    """Create a segment and write every page once (tmpfs zeroes a page at its first
    touch, ~3 ms per MiB): the first large put then writes at memcpy speed."""
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
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
        _unlink(name)
        return False
    finally:
        os.close(fd)


def _unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def sweep_stale_segments() -> int:
    """Remove segments of sessions whose head process is gone. Returns how many."""
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name[len(PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if not pid_alive(pid):
            _unlink(name)
            removed += 1
    return removed


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


# ---------------------------------------------------------------- writer / reader side


def write_segment(segment: Any, ser: Any) -> None:
    """Copy ``ser`` (Serialized) into the segment the store handed out."""
    path = os.path.join(SHM_DIR, segment.name)
    size = max(segment.size, 1)
    if segment.reused:
        fd = os.open(path, os.O_RDWR)
    else:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        if not segment.reused:
            cap = max(segment.capacity, size)
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
        # MAP_POPULATE: map every page in one call instead of one fault per page.
        with mmap.mmap(fd, size, mmap.MAP_SHARED | _POPULATE,
                       mmap.PROT_READ | mmap.PROT_WRITE) as mm:
            view = memoryview(mm)
            try:
                ser.write_into(view)
            finally:
                view.release()
    finally:
        os.close(fd)


def map_segment(segment: Any) -> tuple[mmap.mmap, memoryview]:
    """A read-only map of a sealed segment; it lives as long as views of it."""
    fd = os.open(os.path.join(SHM_DIR, segment.name), os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, max(segment.size, 1), mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    return mm, memoryview(mm)[: segment.size]
