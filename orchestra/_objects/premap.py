"""Spare segments made ready ahead, on a thread of this process: created, allocated and
mapped with their pages present (segments.open_segment), so that a put into one is a
copy. The writer's side of a put of a fresh segment is mostly the kernel's (making ~25
pages present for 100 KB, ~256 for 1 MiB: the copy is a tenth of it); done here while
the put before it copies, on another core.

    CreateSegment reply with spares --add(spares, size)--> queue --the thread-->
        open_segment (sized for ``size``: the size of the put that asked) --> ready
    a put takes a spare --take(seg)--> its map from ``ready`` (waiting if the thread is on
        it), extended when this object is larger; None when the thread has not reached
        it (taken off the queue: the put opens it itself, as without this module)
    a spare slot of a slab --prepare_slot(seg)--> its pages made present in the writer's
        map of the slab (io.py), ``prepared`` --take_slot(seg, need)--> whether the put
        still has to (a walk of present pages costs ~70 us per MiB here)
    spares given back (idle, or the store asked) --drop(names)--> maps closed
    many maps the store told the writer to drop --discard(maps)--> closed by the thread,
        after the spares queued (munmap of each old slot of a slab carved again)
    the client closes --close()--> every map closed, the thread ends

Rule: ``cond`` guards ``queue``, ``ready``, ``prepared``, ``busy``, ``dropped`` and
``closing``; the thread alone
opens a queued spare, so a spare's file is created by the thread or by the put, never
both. A forked child has no such thread: there it makes nothing ready and waits for
nothing (its puts open their segments themselves).
"""
from __future__ import annotations

import collections
import contextlib
import mmap
import os
import threading
from collections.abc import Callable, Iterable

from .._protocol import pb
from .segments import open_segment, segment_path
from .slabs import is_slot


class Premapper:
    """The ready maps of one process's spare segments (see the module docstring)."""

    def __init__(self, shm_dir: str) -> None:
        self.shm_dir = shm_dir
        self.cond = threading.Condition()
        self.queue: collections.deque[pb.Segment] = collections.deque()
        self.ready: dict[str, mmap.mmap] = {}
        self.busy = ""            # the spare the thread is opening now
        self.dropped: set[str] = set()   # given back while the thread opened it
        self.closing: list[mmap.mmap | memoryview] = []   # maps to close (discard)
        self.prepare_slot: Callable[[pb.Segment], int] | None = None
        self.prepared: dict[str, int] = {}   # slot -> bytes from its start made present
        self.closed = False
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()   # the process whose thread this is

    def add(self, spares: Iterable[pb.Segment], size: int) -> None:
        """Make these spares ready for objects of ``size`` bytes (those the writer keeps
        no map of: io.py wmaps)."""
        with self.cond:
            if self.closed or self.pid != os.getpid():
                return
            for spare in spares:
                seg = pb.Segment()
                seg.CopyFrom(spare)
                seg.size = size
                self.queue.append(seg)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="orchestra-premap",
                                               daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def take(self, seg: pb.Segment) -> mmap.mmap | None:
        """The ready map of the spare ``seg`` (its size the object's), or None: the put
        opens it itself. Raises what open_segment raises when the map must grow."""
        if self.pid != os.getpid():
            return None
        with self.cond:
            while self.busy == seg.name:
                self.cond.wait()
            mm = self.ready.pop(seg.name, None)
            if mm is None:
                self._unqueue({seg.name})
                return None
        if len(mm) >= seg.size:
            return mm
        # Made for a smaller object: open the file it made, allocated that far already.
        length = len(mm)
        mm.close()
        grown = pb.Segment()
        grown.CopyFrom(seg)
        grown.reused, grown.allocated = True, length
        return open_segment(self.shm_dir, grown)

    def take_slot(self, seg: pb.Segment, need: int) -> bool:
        """Whether the spare slot ``seg`` has its first ``need`` bytes present in the
        writer's map of its slab (the thread made them so); else the put does it (taken
        off the queue)."""
        if self.pid != os.getpid():
            return False
        with self.cond:
            while self.busy == seg.name:
                self.cond.wait()
            done = self.prepared.pop(seg.name, 0)
            if not done:
                self._unqueue({seg.name})
        return done >= need

    def drop(self, names: Iterable[str]) -> None:
        """These spares go back to the store: their maps are closed (one being opened
        when the thread is done with it)."""
        wanted = set(names)
        with self.cond:
            self._unqueue(wanted)
            maps = [self.ready.pop(n) for n in wanted if n in self.ready]
            for n in wanted:
                self.prepared.pop(n, None)
            if self.busy in wanted:
                self.dropped.add(self.busy)
        for mm in maps:
            mm.close()

    def discard(self, maps: list[mmap.mmap | memoryview]) -> bool:
        """Close these maps on the thread, off the caller's path; False when this
        process has no thread (the caller closes them)."""
        with self.cond:
            if self.closed or self.thread is None or self.pid != os.getpid():
                return False
            self.closing.extend(maps)
            self.cond.notify_all()
        return True

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.queue.clear()
            maps: list[mmap.mmap | memoryview] = [*self.ready.values(), *self.closing]
            self.ready, self.closing = {}, []
            self.prepared.clear()
            self.cond.notify_all()
        for mm in maps:
            close_map(mm)

    def _unqueue(self, names: set[str]) -> None:
        if self.queue:
            self.queue = collections.deque(s for s in self.queue if s.name not in names)

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closing and not self.closed:
                    self.cond.wait()
                if self.closed:
                    return
                if not self.queue:
                    closing, self.closing = self.closing, []
                    seg = None
                else:
                    seg = self.queue.popleft()
                    self.busy = seg.name
            if seg is None:
                for old in closing:
                    close_map(old)
                continue
            mm: mmap.mmap | None = None
            done = 0
            try:
                if is_slot(seg.name):
                    if self.prepare_slot is not None:
                        done = self.prepare_slot(seg)
                else:
                    mm = open_segment(self.shm_dir, seg)
            except Exception:  # noqa: BLE001 - any: the put opens it itself and says why
                if not is_slot(seg.name):   # (a slot's file is its slab's, the store's)
                    with contextlib.suppress(OSError):
                        os.unlink(segment_path(self.shm_dir, seg.name))   # its file goes
            with self.cond:
                self.busy = ""
                if mm is not None and (self.closed or seg.name in self.dropped):
                    mm.close()
                elif mm is not None:
                    self.ready[seg.name] = mm
                elif done and not self.closed and seg.name not in self.dropped:
                    self.prepared[seg.name] = done
                self.dropped.discard(seg.name)
                self.cond.notify_all()


def close_map(mm: mmap.mmap | memoryview | None) -> None:
    """Close a map (or release a view of one, as of a slab's), unless a value read from
    it still lives: then it is closed when the last goes."""
    if mm is None:
        return
    try:
        if isinstance(mm, memoryview):
            mm.release()
        else:
            mm.close()
    except BufferError:
        pass


__all__ = ["Premapper", "close_map"]
