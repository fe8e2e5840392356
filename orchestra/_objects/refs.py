"""Reference counting of one process: its count per object id, and the changes the head
must learn.

    ObjectRef() --add--> local count 0 -> 1: the id joins ``incr`` (unless counted by
        the head already: the Submit or put that made it)
    ObjectRef.__del__ --remove--> 1 -> 0: ``on_last(oid)`` says whether the head holds a
        count for this process; if so the id joins ``decr``
    maps of segments --pin/unpin--> the store keeps a mapped segment until unpinned
    a driver's put --seal(data)--> ``sealed`` (flushed by the put once _SEAL_BATCH wait)
    CoreClient.send_raw --take()--> [Objects(sealed)][RefDelta(incr, pin)][frame]
        [RefDelta(decr, unpin)]

A hold the head must see is never outrun by the release that follows it: increments
travel before the next frame, decrements after it. A driver's puts reach the head in
batches (one frame, one write, one read of the head's for up to _SEAL_BATCH puts): an
object is sealed before the next frame of its process, whatever it is, and within a
round of the background thread (pacer.SHORT) otherwise. Nothing of another process
needs it sooner: its ref leaves the driver in a frame to the head, or in a direct call
that syncs with the head first where the callee would ask the head of it (must_sync).
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from .._protocol import pb
from .._protocol import wire as _wire

# A driver's puts sent to the head in one frame (see the module docstring): at 100 KB a
# put, one write and one read of ~20 us each on both sides for every put otherwise.
_SEAL_BATCH = 16


class RefCounts:
    __slots__ = ("local", "incr", "decr", "pin", "unpin", "sealed", "lock", "on_last", "lost")

    def __init__(self, on_last: Callable[[bytes], bool]) -> None:
        self.local: dict[bytes, int] = {}
        self.incr: list[bytes] = []
        self.decr: list[bytes] = []
        self.pin: list[str] = []      # segments mapped here (sent with increments)
        self.unpin: list[str] = []    # segments whose last view died (sent with decrements)
        self.sealed: list[pb.ObjectData] = []   # a driver's puts not yet sent (seal)
        # Re-entered when the garbage collector runs a __del__ while it is held.
        self.lock = threading.RLock()
        # Called under the lock when the last ref of an id here goes: True when the head
        # holds a count for this process (a decrement is due).
        self.on_last = on_last
        self.lost = False   # the head is gone: nothing more to tell it

    def add(self, oid: bytes, counted: bool) -> None:
        with self.lock:
            n = self.local.get(oid, 0)
            self.local[oid] = n + 1
            if n == 0 and not counted:
                self.incr.append(oid)

    def remove(self, oid: bytes) -> None:
        with self.lock:
            n = self.local.get(oid, 0) - 1
            if n > 0:
                self.local[oid] = n
                return
            self.local.pop(oid, None)
            if self.on_last(oid) and not self.lost:
                self.decr.append(oid)

    def seal(self, data: pb.ObjectData) -> bool:
        """Under the lock: a put's object for the head's next frame; True when
        _SEAL_BATCH wait, and the caller should flush them now."""
        self.sealed.append(data)
        return len(self.sealed) >= _SEAL_BATCH

    def pending(self) -> bool:
        return bool(self.incr or self.decr or self.pin or self.unpin or self.sealed)

    def take_frames(self) -> tuple[bytes, bytes]:
        """The pending changes as two frames: what goes before the next frame (holds)
        and what goes after it (releases)."""
        with self.lock:
            incr, self.incr = self.incr, []
            decr, self.decr = self.decr, []
            pin, self.pin = self.pin, []
            unpin, self.unpin = self.unpin, []
            sealed, self.sealed = self.sealed, []
        pre = post = b""
        if sealed:
            pre = _wire.encode(_wire.OBJECTS, pb.Objects(objects=sealed))
        if incr or pin:
            pre += _wire.encode(_wire.REF_DELTA, pb.RefDelta(incr=incr, pin=pin))
        if decr or unpin:
            post = _wire.encode(_wire.REF_DELTA, pb.RefDelta(decr=decr, unpin=unpin))
        return pre, post
