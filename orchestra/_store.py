"""Per-node object store: the one owner of this node's shared-memory segments.

create: reserve capacity and name a segment -> the writer (driver or worker) creates
the file, fallocates, maps, copies, and seals -> the scheduler records it -> free: the
store unlinks it when the object's count reaches zero.

Readers map a segment read-only and never unlink; a map outlives the unlink, so a
zero-copy view stays valid while it lives (the kernel keeps the pages). Readers do not
go through multiprocessing.shared_memory: CPython's resource tracker would unlink
segments it did not create (gh-82300).

Segments are named ``orch-<head pid>-<session>-<object id>`` so that a later session
can tell (by the pid) which ones a crashed session left behind and remove them.
"""
from __future__ import annotations

import mmap
import os
from typing import Any

from ._proto import types_pb2
from .exceptions import ObjectStoreFullError

SHM_DIR = "/dev/shm"
PREFIX = "orch-"


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024  # type: ignore[assignment]
    return str(n)


class ObjectStore:
    def __init__(self, node_id: int, session: str, capacity: int) -> None:
        self.node_id = node_id
        self.capacity = capacity
        self.prefix = f"{PREFIX}{os.getpid()}-{session}-"
        self.used = 0
        self.sealed: dict[str, int] = {}                 # name -> size
        self.unsealed: dict[str, tuple[int, int]] = {}   # name -> (conn, size)

    def create(self, conn: int, object_id: bytes, size: int) -> Any:
        """Reserve ``size`` bytes; returns the Segment the writer must create."""
        if size > self.capacity:
            raise ObjectStoreFullError(
                f"an object of {_fmt(size)} cannot fit in the object store of "
                f"{_fmt(self.capacity)} (object_store_memory). Start the cluster with a larger "
                "orchestra.init(object_store_memory=...) or send smaller pieces.")
        if self.used + size > self.capacity:
            raise ObjectStoreFullError(
                f"the object store is full: {_fmt(self.used)} of {_fmt(self.capacity)} used by "
                f"{len(self.sealed)} live objects, {_fmt(size)} more needed. Drop ObjectRefs "
                "you no longer need, or start with a larger object_store_memory.")
        name = self.prefix + object_id.hex()
        self.used += size
        self.unsealed[name] = (conn, size)
        return types_pb2.Segment(name=name, size=size, node_id=self.node_id)

    def seal(self, name: str) -> bool:
        entry = self.unsealed.pop(name, None)
        if entry is None:
            return False
        self.sealed[name] = entry[1]
        return True

    def free(self, name: str) -> None:
        size = self.sealed.pop(name, None)
        if size is None:
            entry = self.unsealed.pop(name, None)
            if entry is None:
                return
            size = entry[1]
        self.used -= size
        _unlink(name)

    def drop_writer(self, conn: int) -> None:
        """A writer disconnected: its reserved but unsealed segments are garbage."""
        for name, (c, _) in list(self.unsealed.items()):
            if c == conn:
                self.free(name)

    def close(self) -> None:
        """Unlink every segment of this store, sealed or not, also ones never recorded."""
        for name in list(self.sealed) + list(self.unsealed):
            _unlink(name)
        self.sealed.clear()
        self.unsealed.clear()
        self.used = 0
        try:
            for name in os.listdir(SHM_DIR):
                if name.startswith(self.prefix):
                    _unlink(name)
        except OSError:
            pass


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
        if not _pid_alive(pid):
            _unlink(name)
            removed += 1
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------- writer / reader side

def write_segment(segment: Any, ser: Any) -> None:
    """Create the segment file the store named, and copy ``ser`` (Serialized) into it."""
    path = os.path.join(SHM_DIR, segment.name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        size = max(segment.size, 1)
        os.ftruncate(fd, size)
        try:
            # Allocate now: a full /dev/shm then fails here with ENOSPC instead of
            # killing the writer with SIGBUS in the middle of the copy.
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            os.unlink(path)
            raise ObjectStoreFullError(
                f"/dev/shm has no room for an object of {_fmt(size)} ({exc.strerror}). Free "
                "shared memory, or lower object_store_memory so the store stays within /dev/shm.") from exc
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mm:
            view = memoryview(mm)
            try:
                ser.write_into(view)
            finally:
                view.release()
    finally:
        os.close(fd)


def map_segment(segment: Any) -> memoryview:
    """A read-only view of a sealed segment; the map lives as long as views of it."""
    fd = os.open(os.path.join(SHM_DIR, segment.name), os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, max(segment.size, 1), mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    return memoryview(mm)[: segment.size]
