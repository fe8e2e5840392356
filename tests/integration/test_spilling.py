"""Live objects beyond object_store_memory spill to disk and come back transparently."""
from __future__ import annotations

import os

import numpy as np
import pytest

import _helpers as h
import orchestra
from _probes import wait_until
from orchestra._api.local_head import store_memory
from orchestra.exceptions import ObjectStoreFullError

pytestmark = pytest.mark.timeout(90)

T = 30
MiB = 1 << 20
STORE = 64 * MiB
PIECE = 16 * MiB


def _piece(i: int) -> np.ndarray:
    return np.full(PIECE // 8, i, dtype=np.int64)


def _intact(value: np.ndarray, i: int) -> bool:
    return value.shape == (PIECE // 8,) and bool((value == i).all())


def _spilled(c, refs) -> list[bool]:
    objects = c.objects()
    return [objects[r.binary()].spilled for r in refs]


def test_three_times_the_store_of_live_objects_spills_and_reads_back_intact(start_cluster):
    c = start_cluster(num_cpus=1, object_store_memory=STORE)
    refs = [orchestra.put(_piece(i)) for i in range(3 * STORE // PIECE)]

    store = c.store()
    assert store.used <= STORE
    assert store.spilled_objects >= len(refs) - STORE // PIECE
    n = store.spilled_objects   # each holds the piece and a pickle header
    assert n * PIECE < store.spilled_bytes < n * (PIECE + 8192)
    assert len(c.spill_files()) == store.spilled_objects
    assert any(_spilled(c, refs)) and not all(_spilled(c, refs))

    for i, ref in enumerate(refs):          # the driver reads each back...
        assert _intact(orchestra.get(ref, timeout=T), i)
    sums = orchestra.get([h.array_sum.remote(r) for r in refs], timeout=T)   # ...and so do tasks
    assert sums == [float(i * (PIECE // 8)) for i in range(len(refs))]

    del refs, ref
    wait_until(lambda: c.spill_files() == [], 10, "spill files removed once the refs are gone")
    wait_until(lambda: c.store().used == 0, 10, "the store's memory returned")
    store = c.store()
    assert (store.spilled_bytes, store.spilled_objects) == (0, 0)
    assert c.segment_bytes() <= STORE


def test_task_results_beyond_the_store_spill_and_come_back(start_cluster):
    start_cluster(num_cpus=1, object_store_memory=STORE)
    n = PIECE // 8
    refs = [h.make_array.remote(n) for _ in range(8)]
    orchestra.wait(refs, num_returns=len(refs), timeout=T)
    for ref in refs:
        value = orchestra.get(ref, timeout=T)
        assert value[0] == 0 and value[-1] == n - 1
        del value


def test_the_least_recently_used_object_spills_first(start_cluster):
    c = start_cluster(num_cpus=1, object_store_memory=STORE)   # room for three pieces
    first, second, third = (orchestra.put(_piece(i)) for i in range(3))
    assert _intact(orchestra.get(first, timeout=T), 0)   # read: now the most recent
    assert _spilled(c, [first, second, third]) == [False, False, False]
    fourth = orchestra.put(_piece(3))                     # one must go: `second`
    assert _spilled(c, [first, second, third, fourth]) == [False, True, False, False]
    assert _intact(orchestra.get(second, timeout=T), 1)


def test_objects_read_before_still_spill_once_their_values_are_gone(start_cluster):
    # The driver keeps the map of each object it read, for a fast second get; the store
    # asks for it back when it needs the room.
    c = start_cluster(num_cpus=1, object_store_memory=STORE)   # room for three pieces
    refs = [orchestra.put(_piece(i)) for i in range(3)]
    assert [_intact(orchestra.get(r, timeout=T), i) for i, r in enumerate(refs)] == [True] * 3
    fourth = orchestra.put(_piece(3))
    assert _spilled(c, [*refs, fourth]) == [True, False, False, False]
    assert [_intact(orchestra.get(r, timeout=T), i) for i, r in enumerate(refs)] == [True] * 3


def test_objects_in_use_are_not_spilled_and_a_full_store_says_so(start_cluster):
    c = start_cluster(num_cpus=1, object_store_memory=STORE)
    refs = [orchestra.put(_piece(i)) for i in range(STORE // PIECE - 1)]
    values = [orchestra.get(r, timeout=T) for r in refs]   # mapped: cannot move to disk
    with pytest.raises(ObjectStoreFullError) as info:
        orchestra.put(np.ones(2 * PIECE // 8))
    message = str(info.value)
    assert "more needed" in message and "in use" in message and "64.0 MiB" in message
    assert not any(_spilled(c, refs))
    del values                                             # no longer in use: they may go
    big = orchestra.put(np.ones(2 * PIECE // 8))
    assert any(_spilled(c, refs))
    assert orchestra.get(big, timeout=T).sum() == 2 * PIECE // 8


def test_a_spill_that_cannot_write_raises_object_store_full_error_naming_why(start_cluster,
                                                                               tmp_path):
    c = start_cluster(num_cpus=1, object_store_memory=STORE, spill_dir=str(tmp_path))
    session_id = os.path.basename(c.session_dir).removeprefix("orchestra-session-")
    (tmp_path / f"orchestra-spill-{session_id}").write_text("a file where the spill dir goes")
    refs = [orchestra.put(_piece(i)) for i in range(3)]   # the store is full
    with pytest.raises(ObjectStoreFullError) as info:
        orchestra.put(_piece(9))
    message = str(info.value)
    assert "spilling to disk failed" in message and f"orchestra-spill-{session_id}" in message
    assert "16.0 MiB more needed" in message
    assert [_intact(orchestra.get(r, timeout=T), i) for i, r in enumerate(refs)] == [True] * 3


def test_spill_dir_given_to_init_holds_the_files_until_shutdown(start_cluster, tmp_path):
    c = start_cluster(num_cpus=1, object_store_memory=STORE, spill_dir=str(tmp_path))
    refs = [orchestra.put(_piece(i)) for i in range(2 * STORE // PIECE)]
    (spill,) = tmp_path.iterdir()
    assert spill.name.startswith("orchestra-spill-")
    assert len(list(spill.iterdir())) == c.store().spilled_objects > 0
    assert _intact(orchestra.get(refs[0], timeout=T), 0)
    orchestra.shutdown()
    assert list(tmp_path.iterdir()) == []


def test_init_rejects_a_spill_dir_that_is_not_a_directory(no_cluster, tmp_path):
    with pytest.raises(ValueError, match="spill_dir .* is not a directory"):
        orchestra.init(num_cpus=1, spill_dir=str(tmp_path / "missing"))


# ------------------------------------------------------------------ the store's default size

GiB = 1 << 30


def test_the_default_store_is_30_percent_of_ram_when_dev_shm_holds_it():
    assert store_memory(None, ram=16 * GiB, shm_free=8 * GiB) == (int(16 * GiB * 0.3), "")


def test_a_big_enough_dev_shm_bounds_the_store_silently():
    size, warning = store_memory(None, ram=64 * GiB, shm_free=4 * GiB)
    assert size == int(4 * GiB * 0.9) and warning == ""


def test_a_small_dev_shm_is_said_and_the_store_shrinks_to_fit():
    size, warning = store_memory(None, ram=16 * GiB, shm_free=64 * MiB)
    assert size == int(64 * MiB * 0.9)
    assert "/dev/shm has only 64 MiB free" in warning
    assert "spill to disk" in warning and "--shm-size" in warning


def test_asking_for_more_than_dev_shm_has_is_said():
    size, warning = store_memory(8 * GiB, ram=16 * GiB, shm_free=1 * GiB)
    assert size == 8 * GiB
    assert "more than the 1.0 GiB free in /dev/shm" in warning
