"""Slabs (_objects/slabs.py, store_slabs.py) over a real private directory: how an empty
slab is carved again for another size class (its warm pages kept where whole new slots
fall on them, the rest given back), the rename that retires every old name, and which
processes are told to drop which maps."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from orchestra._objects.segments import open_segment, segment_path
from orchestra._objects.slabs import SLAB, recarve, slab_ident, split_slot
from orchestra._objects.store import ObjectStore

pytestmark = pytest.mark.timeout(30)

KiB, MiB = 1 << 10, 1 << 20
WRITER, READER = 5, 6


@pytest.fixture
def store() -> Iterator[ObjectStore]:
    s = ObjectStore(1, "unit", 64 * MiB, pool_idle_s=10.0)
    clock = [100.0]
    s.now = lambda: clock[0]
    s.clock = clock   # type: ignore[attr-defined]
    try:
        yield s
    finally:
        s.close()


def test_a_slab_carved_again_keeps_the_new_slots_that_lie_on_warm_pages():
    # 73 warm slots of 112 KiB (8,372,224 bytes) hold six of 1.25 MiB whole; the tail
    # past the sixth may hold pages and is given back.
    keep, holes = recarve(112 * KiB, [i * 112 * KiB for i in range(73)], 1280 * KiB)
    assert keep == list(range(6)) and holes == [(6 * 1280 * KiB, SLAB - 6 * 1280 * KiB)]
    # Warm slots 0-9 and 20-29 of 64 KiB: a 1 MiB slot lies wholly on neither run, so
    # both it and the next are given back where they touch warm pages; none is kept.
    warm = [i * 64 * KiB for i in [*range(10), *range(20, 30)]]
    keep, holes = recarve(64 * KiB, warm, MiB)
    assert keep == [] and holes == [(0, MiB), (MiB, MiB)]
    # Nothing warm: nothing to keep or give back.
    assert recarve(64 * KiB, [], MiB) == ([], [])


def _fill(store: ObjectStore, size: int, n: int, conn: int = WRITER) -> list[str]:
    names = []
    for i in range(n):
        seg = store.create(conn, b"o%d" % i, size)
        mm = open_segment(store.dir, seg)
        mm[:size] = b"x" * size
        mm.close()
        assert store.seal(seg.name)
        names.append(seg.name)
    return names


def test_an_empty_slab_is_carved_again_under_a_new_name_for_another_class(store):
    small = _fill(store, 60 * KiB, 128)          # one slab: 128 slots of 64 KiB
    first = split_slot(small[0])[0]
    assert {split_slot(n)[0] for n in small} == {first} and first.endswith(".1")
    store.pin(READER, [small[3]])
    store.unpin(READER, [small[3]])
    for name in small:
        store.free(name)
    assert store.used == 0 and store.pooled == 128 * 64 * KiB
    store.dropped.clear()
    seg = store.create(WRITER, b"big", MiB)       # no pooled slot of its class: carved
    again = split_slot(seg.name)[0]
    assert seg.reused and again == slab_ident(first) + ".2"
    assert not os.path.exists(segment_path(store.dir, first))
    assert os.path.exists(segment_path(store.dir, again))
    # Every process that mapped an old slot is told (the reader too); the writer's map
    # of the whole slab stays good, so its file is not named.
    told = set(store.dropped)
    assert told == {(WRITER, n) for n in small} | {(READER, small[3])}
    assert store.used == MiB and store.pooled == 7 * MiB   # the other slots warm


def test_a_slab_that_holds_no_page_and_no_object_is_removed_and_its_mappers_told(store):
    names = _fill(store, 60 * KiB, 3)
    slab = split_slot(names[0])[0]
    for name in names:
        store.free(name)
    store.dropped.clear()
    store.clock[0] += 11                          # past the pool's idle time
    assert store.trim_pool() == 3 * 64 * KiB
    assert slab not in store.slabs and not os.path.exists(segment_path(store.dir, slab))
    assert (WRITER, slab) in store.dropped        # its map of the whole slab goes
    assert store.used == store.pooled == 0 and not store.segs
