"""Medium objects live as slots of slab files, several to a file (_objects/slabs.py): the
memory objects of one size freed serves objects of another, a reader that learnt a
slot's name before its slab was carved again asks the head, and slabs spill whole."""
from __future__ import annotations

import os

import numpy as np
import pytest

import orchestra
from _probes import segment_span, wait_store_empty

pytestmark = pytest.mark.timeout(120)

T = 30
MiB = 1 << 20


def _shm_bytes(folder: str) -> int:
    """Bytes of memory the files of the session's directory hold (their pages)."""
    return sum(os.stat(os.path.join(folder, n)).st_blocks * 512 for n in os.listdir(folder)
               if os.path.isfile(os.path.join(folder, n)))


@orchestra.remote
def first(a: np.ndarray) -> float:
    return float(a[0])


def test_memory_freed_by_small_objects_serves_larger_ones(start_cluster):
    """400 objects of 100 KB (40 MB in six slabs), freed; then 1 MiB ones are written
    into those pages, carved again: the session's shared memory grows by far less
    than their 37.5 MiB (with a file per segment it grew by that, the freed files
    kept)."""
    from orchestra._runtime import context as _context
    start_cluster(num_cpus=1, object_store_memory=256 * MiB)
    client = _context._client
    small = [orchestra.put(np.full(12_500, i, dtype=np.float64)) for i in range(400)]
    del small
    wait_store_empty(client)
    before = _shm_bytes(client.shm_dir)
    assert before >= 38 * MiB, f"the freed objects' memory was given back: {before}"
    values = [np.full(MiB // 8, i, dtype=np.float64) for i in range(30)]
    refs = [orchestra.put(v) for v in values]
    grown = _shm_bytes(client.shm_dir) - before
    # (What grows: the pages of each old slot past its 100 KB, never written, ~9 per
    # new object, and the first puts' before spares came from carved slabs.)
    assert grown < 16 * MiB, f"1 MiB puts met fresh memory: {grown >> 20} MiB more"
    assert orchestra.get([first.remote(r) for r in refs], timeout=T) == [float(i) for i in range(30)]
    assert all(np.array_equal(g, v) for g, v in zip(orchestra.get(refs, timeout=T), values, strict=True))
    del refs
    wait_store_empty(client)


def test_a_reader_holding_a_slot_of_a_slab_carved_again_reads_its_own_object(start_cluster):
    """A value read zero-copy from a slot keeps its bytes while the slab's other objects
    go and the slab is carved again for another size (its slot is live: the slab is not
    empty until the view goes); once it goes, the slab's pages serve the new size."""
    from orchestra._runtime import context as _context
    start_cluster(num_cpus=1, object_store_memory=128 * MiB)
    client = _context._client
    refs = [orchestra.put(np.full(12_500, i, dtype=np.float64)) for i in range(70)]
    held = orchestra.get(refs[5], timeout=T)          # a view of slot 5
    path, _ = segment_span(refs[5])
    del refs
    big = [orchestra.put(np.full(MiB // 8, 7, dtype=np.float64)) for _ in range(8)]
    assert held[0] == 5 and held[-1] == 5 and os.path.exists(path)
    assert segment_span(big[0])[0] != path   # not carved again under a live view
    del held, big
    wait_store_empty(client)


def test_medium_objects_spill_by_whole_slabs_and_read_back(start_cluster):
    """A store of 48 MiB and 120 MB of 1 MiB objects: slabs spill whole; every value
    reads back, and tasks read them."""
    from orchestra._runtime import context as _context
    c = start_cluster(num_cpus=1, object_store_memory=48 * MiB)
    client = _context._client
    values = [np.full(MiB // 8, i, dtype=np.float64) for i in range(120)]
    refs = [orchestra.put(v) for v in values]
    store = c.store()
    assert store.used <= 48 * MiB and store.spilled_objects >= 120 - 48
    spilled = [c.objects()[r.binary()].spilled for r in refs]
    assert any(spilled) and not all(spilled)
    got = orchestra.get(refs, timeout=T)
    assert all(g[0] == i and g[-1] == i for i, g in enumerate(got))
    del got
    assert orchestra.get([first.remote(r) for r in refs[::10]], timeout=T) == \
        [float(i) for i in range(0, 120, 10)]
    del refs
    wait_store_empty(client)
