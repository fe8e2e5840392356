"""A reader's maps of segments kept across objects (ObjectIO.rmaps), over a real store's
private directory (no processes, no sockets): the next object in a pooled segment is
read through the same map, views pin the segment until they are gone, the maps kept are
bounded, and the store's removal of a segment closes its map."""
from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from orchestra._objects.io import _RMAPS_MAX, ObjectIO
from orchestra._objects.refs import RefCounts
from orchestra._objects.segments import open_segment
from orchestra._objects.store import ObjectStore
from orchestra._proto import types_pb2

pytestmark = pytest.mark.timeout(30)

KiB = 1 << 10
READER = 7


class Client:
    """What ObjectIO's reads use of a CoreClient."""

    def __init__(self) -> None:
        self.refs = RefCounts(lambda oid: False)
        self.results: dict[bytes, Any] = {}
        self.lost: str | None = None
        self.closing = False


@pytest.fixture
def store() -> Iterator[ObjectStore]:
    s = ObjectStore(0, "unit", 16 << 20)
    yield s
    s.close()


def put(store: ObjectStore, fill: int, size: int = 256 * KiB) -> types_pb2.Segment:
    """A sealed object of ``size`` bytes of ``fill`` (a writer filled the segment)."""
    seg = store.create(1, fill.to_bytes(16, "big"), size)
    mm = open_segment(store.dir, seg)
    mm[:size] = bytes([fill]) * size
    mm.close()
    assert store.seal(seg.name)
    return seg


def read(io: ObjectIO, store: ObjectStore, seg: types_pb2.Segment) -> int:
    """Map the object, pin as a reader does, and give back its first byte."""
    view = io.map_segment(seg)
    with io.refs.lock:
        store.pin(READER, io.refs.pin)
        io.refs.pin.clear()
    first = view[0]
    del view
    assert io.refs.unpin, "the view was freed at once (no cycle): its finalizer unpinned it"
    with io.refs.lock:
        store.unpin(READER, io.refs.unpin)
        io.refs.unpin.clear()
    return first


def test_the_next_object_in_a_pooled_segment_is_read_through_the_map_kept(store) -> None:
    io = ObjectIO(Client(), store.dir, 100 * KiB)   # type: ignore[arg-type]
    first = put(store, 1)
    assert read(io, store, first) == 1
    kept = io.rmaps[first.name]
    store.free(first.name)                  # pooled: the next put of that size goes there
    second = put(store, 2)
    assert second.name == first.name and second.reused
    assert read(io, store, second) == 2     # the new bytes, through the same map
    assert io.rmaps[first.name] is kept


def test_a_view_pins_the_segment_so_a_free_retires_it_instead_of_pooling_it(store) -> None:
    io = ObjectIO(Client(), store.dir, 100 * KiB)   # type: ignore[arg-type]
    seg = put(store, 3)
    view = io.map_segment(seg)
    with io.refs.lock:
        store.pin(READER, io.refs.pin)
        io.refs.pin.clear()
    store.free(seg.name)
    assert store.segs[seg.name].state == "retired"   # not handed to the next writer
    assert put(store, 4).name != seg.name
    assert view[0] == 3
    del view
    gc.collect()
    with io.refs.lock:
        assert io.refs.unpin == [seg.name]


def test_the_maps_kept_are_bounded(store) -> None:
    io = ObjectIO(Client(), store.dir, 100 * KiB)   # type: ignore[arg-type]
    segs = [put(store, i % 250, 128 * KiB) for i in range(_RMAPS_MAX + 8)]
    for seg in segs:
        read(io, store, seg)
    assert len(io.rmaps) == _RMAPS_MAX
    assert set(io.rmaps) == {s.name for s in segs[-_RMAPS_MAX:]}   # the newest stay


def test_a_removed_segment_closes_its_map_and_its_reader_is_told(store) -> None:
    io = ObjectIO(Client(), store.dir, 100 * KiB)   # type: ignore[arg-type]
    seg = put(store, 5)
    read(io, store, seg)
    kept = io.rmaps[seg.name]
    store.free(seg.name)
    store._evict_pool(store.capacity)       # the pool gives its segments up: unlinked
    assert (READER, seg.name) in store.dropped
    io.drop_maps([seg.name])                # what DROP_MAPS does in the reader
    assert seg.name not in io.rmaps and kept.closed
