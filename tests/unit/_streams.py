"""Helpers of the serialization tests: a stream as a reader of a segment sees it, and
whether a value read from it is a view of it."""
from __future__ import annotations

import mmap

import numpy as np

from orchestra._objects.serialization import Serialized


def read_only_copy(ser: Serialized) -> memoryview:
    """The layout in a read-only shared map, as a reader of a segment sees it."""
    size = ser.stream_size()
    mm = mmap.mmap(-1, max(size, 1))
    ser.write_into(memoryview(mm))
    ro = mmap.mmap(-1, max(size, 1))
    ro.write(mm[:])
    return memoryview(ro).toreadonly()[:size]


def address_of(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])


def within(address: int, view: memoryview) -> bool:
    """``address`` lies in ``view``'s memory: a value read from it is not a copy."""
    start = address_of(view)
    return start <= address < start + len(view)
