"""Reference counting of one process: its count per object id, and the changes the head
must learn.

    ObjectRef() --add--> local count 0 -> 1: the id joins ``incr`` (unless counted by
        the head already: the Submit or put that made it)
    ObjectRef.__del__ --remove--> 1 -> 0: ``on_last(oid)`` says whether the head holds a
        count for this process; if so the id joins ``decr``
    maps of segments --pin/unpin--> the store keeps a mapped segment until unpinned
    CoreClient.send_raw --take()--> [RefDelta(incr, pin)][frame][RefDelta(decr, unpin)]

A hold the head must see is never outrun by the release that follows it: increments
travel before the next frame, decrements after it.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from .._protocol import pb
from .._protocol import wire as _wire


class RefCounts:
    __slots__ = ("local", "incr", "decr", "pin", "unpin", "lock", "on_last", "lost")

    def __init__(self, on_last: Callable[[bytes], bool]) -> None:
        self.local: dict[bytes, int] = {}
        self.incr: list[bytes] = []
        self.decr: list[bytes] = []
        self.pin: list[str] = []      # segments mapped here (sent with increments)
        self.unpin: list[str] = []    # segments whose last view died (sent with decrements)
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

    def pending(self) -> bool:
        return bool(self.incr or self.decr or self.pin or self.unpin)

    def take_frames(self) -> tuple[bytes, bytes]:
        """The pending changes as two frames: what goes before the next frame (holds)
        and what goes after it (releases)."""
        with self.lock:
            incr, self.incr = self.incr, []
            decr, self.decr = self.decr, []
            pin, self.pin = self.pin, []
            unpin, self.unpin = self.unpin, []
        pre = post = b""
        if incr or pin:
            pre = _wire.encode(_wire.REF_DELTA, pb.RefDelta(incr=incr, pin=pin))
        if decr or unpin:
            post = _wire.encode(_wire.REF_DELTA, pb.RefDelta(decr=decr, unpin=unpin))
        return pre, post
