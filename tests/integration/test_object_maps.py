"""A reader keeps its map of a segment across the objects the segment holds (the store
pools segments: a worker reading each new large argument put in the same memory finds
its pages mapped already), bounded, and closes it once the store removes the segment
(a map of a removed segment would keep its memory)."""
from __future__ import annotations

import numpy as np
import pytest

import orchestra
from _probes import wait_until
from orchestra._objects.io import _RMAPS_MAX

pytestmark = pytest.mark.timeout(90)

T = 30
MiB = 1 << 20


def _segment_maps(removed: bool = False) -> list[str]:
    """The session's segment files this process maps (``removed``: those unlinked)."""
    with open("/proc/self/maps") as f:
        files = {line.split()[-1] if not line.rstrip().endswith("(deleted)")
                 else line.split()[-2] for line in f
                 if "/dev/shm/orchestra-" in line
                 and line.rstrip().endswith("(deleted)") == removed}
    return sorted(files)


@orchestra.remote
def total(a: np.ndarray) -> float:
    return float(a.sum())


@orchestra.remote
def segment_maps(removed: bool = False) -> list[str]:
    return _segment_maps(removed)


@orchestra.remote
def total_of_all(*arrays: np.ndarray) -> float:
    return float(sum(a[0] for a in arrays))


def test_a_worker_keeps_its_map_of_a_segment_and_reads_the_next_object_in_it(start_cluster):
    start_cluster(num_cpus=1, object_store_memory=64 * MiB)
    n = (8 * MiB) // 8
    ref = orchestra.put(np.ones(n))
    assert orchestra.get(total.remote(ref), timeout=T) == n
    first = orchestra.get(segment_maps.remote(), timeout=T)
    assert len(first) == 1, f"the worker no longer maps the segment it read: {first}"
    del ref
    # The next object of that size goes into the same (pooled) segment: the worker reads
    # the new bytes through the map it kept.
    for value in (2.0, 3.0):
        ref = orchestra.put(np.full(n, value))
        assert orchestra.get(total.remote(ref), timeout=T) == value * n
        assert orchestra.get(segment_maps.remote(), timeout=T) == first
        del ref


def test_a_reader_keeps_a_bounded_number_of_maps(start_cluster):
    start_cluster(num_cpus=1, object_store_memory=256 * MiB)
    refs = [orchestra.put(np.full((256 << 10) // 8, i, dtype=np.float64))
            for i in range(_RMAPS_MAX + 16)]
    assert orchestra.get(total_of_all.remote(*refs), timeout=T) == sum(range(len(refs)))
    del refs
    kept = orchestra.get(segment_maps.remote(), timeout=T)
    assert 0 < len(kept) <= _RMAPS_MAX


def test_a_reader_closes_its_kept_maps_of_segments_the_store_removed(start_cluster):
    start_cluster(num_cpus=1, object_store_memory=64 * MiB)
    for n in (8, 20, 40):   # each size evicts the pooled segments of the one before
        ref = orchestra.put(np.ones((n * MiB) // 8))
        assert orchestra.get(total.remote(ref), timeout=T) == (n * MiB) // 8
        del ref
    kept = [orchestra.put(np.full((20 * MiB) // 8, i)) for i in range(4)]   # spills one
    assert [orchestra.get(total.remote(r), timeout=T) for r in kept] == \
        [i * (20 * MiB) // 8 for i in range(4)]
    del kept
    orchestra.put(np.ones((40 * MiB) // 8))   # evicts what the pool kept
    wait_until(lambda: not orchestra.get(segment_maps.remote(True), timeout=T), 10,
               "the worker closed its maps of removed segments",
               lambda: str(orchestra.get(segment_maps.remote(True), timeout=T)))
    assert not _segment_maps(removed=True), "the driver kept maps of removed segments"
