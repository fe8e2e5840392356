"""A reader keeps its map of a segment across the objects the segment holds (the store
pools segments: a worker reading each new large argument put in the same memory finds
its pages mapped already), bounded, and closes it once the store removes the segment
(a map of a removed segment would keep its memory)."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import orchestra
from _probes import counting_creates, wait_store_empty, wait_until
from orchestra._objects.io import _RMAPS_MAX
from orchestra.exceptions import WorkerCrashedError
from orchestra.util import state

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
    # The next object of that size goes into the same (pooled) segment once the last one
    # is freed (the call's arguments are released after its answer, through the head):
    # the worker reads the new bytes through the map it kept.
    for value in (2.0, 3.0):
        wait_until(lambda: _store_used() == 0, 10, "the last object freed")
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


@orchestra.remote(max_retries=0)
def read_then_die(a: np.ndarray) -> None:
    float(a[::4096].sum())   # mapped, its pages faulted in
    time.sleep(0.3)          # the pin reaches the store (the client flushes every few ms)
    os.kill(os.getpid(), signal.SIGKILL)


def _store_used() -> int:
    return int(state.cluster_summary()["store"]["used"])


def test_a_worker_killed_while_it_maps_an_object_leaves_no_pin(start_cluster):
    # The store drops the pins of a connection that goes: killed mid-read, the worker's
    # map must neither keep the segment (retired forever) nor let it go under a reader.
    start_cluster(num_cpus=1, object_store_memory=64 * MiB)
    n = (16 * MiB) // 8
    ref = orchestra.put(np.ones(n))
    with pytest.raises(WorkerCrashedError):
        orchestra.get(read_then_die.remote(ref), timeout=T)
    assert orchestra.get(total.remote(ref), timeout=T) == n   # the next worker reads it
    view = orchestra.get(ref, timeout=T)
    del ref
    assert _store_used() > 0 and view.sum() == n               # held by the driver's view
    del view
    wait_until(lambda: _store_used() == 0, 10, "the store freed the object",
               lambda: f"{_store_used()} bytes still held")
    # The memory is the store's again: a put of the same size goes into it.
    ref = orchestra.put(np.full(n, 2.0))
    assert orchestra.get(total.remote(ref), timeout=T) == 2.0 * n


# ------------------------------------------------------------------ a put's read, kept

def test_a_put_keeps_its_read_for_the_first_get_and_frees_it_with_the_ref(start_cluster):
    # A put parses what it wrote, as a get would, and keeps it (a pinned view) for the
    # get that often follows: the value is the same, over the same shared memory, and the
    # kept view goes with the last ref, read or not.
    start_cluster(num_cpus=1, object_store_memory=96 * MiB)
    n = (16 * MiB) // 8
    unread = orchestra.put(np.full(n, 3.0))
    ref = orchestra.put(np.arange(n, dtype=np.float64))
    value = orchestra.get(ref, timeout=T)
    assert value[0] == 0 and value[-1] == n - 1 and not value.flags.writeable
    assert orchestra.get(ref, timeout=T).__array_interface__["data"][0] == \
        value.__array_interface__["data"][0]
    assert orchestra.get(total.remote(unread), timeout=T) == 3.0 * n
    del unread, ref
    assert value.sum() == n * (n - 1) / 2                     # the view outlives the ref
    wait_until(lambda: 0 < _store_used() < 32 * MiB, 10, "the unread object freed",
               lambda: f"{_store_used()} bytes held")
    del value
    wait_until(lambda: _store_used() == 0, 10, "every object freed",
               lambda: f"{_store_used()} bytes still held")


def test_puts_beyond_the_store_spill_their_kept_reads_and_read_back(start_cluster):
    # Every put pins its kept read: the store asks the driver to let go of the least
    # recently used ones to spill them (as for maps a get kept); each reads back intact.
    start_cluster(num_cpus=1, object_store_memory=64 * MiB)
    n = (16 * MiB) // 8
    refs = [orchestra.put(np.full(n, float(i))) for i in range(8)]
    assert orchestra.get(refs[-1], timeout=T)[0] == 7.0
    for i, ref in enumerate(refs):
        got = orchestra.get(ref, timeout=T)
        assert got[0] == got[-1] == float(i)
        del got
    assert orchestra.get([total.remote(r) for r in refs], timeout=T) == \
        [float(i) * n for i in range(8)]
    del refs, ref
    wait_until(lambda: _store_used() == 0, 10, "the store's memory returned",
               lambda: f"{_store_used()} bytes still held")


def test_a_dataframe_put_and_got_is_the_same_frame_over_shared_memory(start_cluster):
    pd = pytest.importorskip("pandas")
    start_cluster(num_cpus=1, object_store_memory=128 * MiB)
    rows = 1_000_000
    for k in range(3):   # the first of a schema is converted by pyarrow, the next by hand
        df = pd.DataFrame({f"c{i}": np.arange(rows, dtype=np.float64 if i % 2 else np.int64) + k
                           for i in range(4)})
        ref = orchestra.put(df)
        got = orchestra.get(ref, timeout=T)
        pd.testing.assert_frame_equal(got, df, check_exact=True)
        again = orchestra.get(ref, timeout=T)
        pd.testing.assert_frame_equal(again, df, check_exact=True)
        assert again["c0"].to_numpy().__array_interface__["data"][0] == \
            got["c0"].to_numpy().__array_interface__["data"][0]
        assert orchestra.get(frame_total.remote(ref), timeout=T) == float(df["c1"].sum())
        del got, again, ref


@orchestra.remote
def frame_total(df) -> float:
    return float(df["c1"].sum())


# ------------------------------------------------------------------ memory given back when idle

def _session_shm_bytes() -> int:
    """Bytes of the files in this session's segment directory (shared memory held)."""
    from orchestra._runtime import context as _context
    folder = _context._client.shm_dir
    return sum(os.stat(os.path.join(folder, n)).st_size for n in os.listdir(folder))


def test_an_idle_store_gives_its_kept_memory_back_and_a_put_after_works(start_cluster,
                                                                        monkeypatch):
    # Freed segments are kept for reuse while objects come and go, and given back once
    # nothing took them for ORCHESTRA_OBJECT_POOL_IDLE_S: no shared memory held at rest,
    # and no process keeps a map of what was given back (a map would keep its memory).
    monkeypatch.setenv("ORCHESTRA_OBJECT_POOL_IDLE_S", "1")
    start_cluster(num_cpus=1, object_store_memory=256 * MiB)
    n = (32 * MiB) // 8
    for value in (1.0, 2.0, 3.0):   # the same segment each time: kept while in use
        ref = orchestra.put(np.full(n, value))
        assert orchestra.get(total.remote(ref), timeout=T) == value * n
        del ref
        wait_until(lambda: _store_used() == 0, 10, "the object freed")
    summary = state.cluster_summary()["store"]
    assert summary["pooled"] >= 32 * MiB and _session_shm_bytes() >= 32 * MiB, summary
    assert orchestra.get(segment_maps.remote(), timeout=T), "the worker kept no map to drop"
    wait_until(lambda: _session_shm_bytes() == 0, 15, "the idle store gave its memory back",
               lambda: f"{_session_shm_bytes()} bytes still in the session's segments")
    assert state.cluster_summary()["store"]["pooled"] == 0
    wait_until(lambda: not orchestra.get(segment_maps.remote(), timeout=T), 10,
               "the worker closed its map of the segment given back")
    assert not _segment_maps() and not _segment_maps(removed=True), \
        "the driver kept a map of the segment given back"
    # A put after the idle time gets fresh memory, and round-trips exactly.
    value = np.arange(n, dtype=np.float64)
    ref = orchestra.put(value)
    assert orchestra.get(total.remote(ref), timeout=T) == float(value.sum())
    assert np.array_equal(orchestra.get(ref, timeout=T), value)


@pytest.mark.parametrize("name", ["ORCHESTRA_OBJECT_POOL_IDLE_S", "ORCHESTRA_OBJECT_WARM_RESERVE",
                                  "ORCHESTRA_MEMORY_USAGE_THRESHOLD"])
def test_a_bad_memory_setting_is_refused_by_init_naming_it(monkeypatch, name):
    orchestra.shutdown()
    monkeypatch.setenv(name, "soon")
    with pytest.raises(ValueError, match=f"{name}='soon'"):
        orchestra.init(num_cpus=1)
    assert not orchestra.is_initialized()


# ------------------------------------------------------------------ spare segments

@orchestra.remote
def medium(i: int) -> np.ndarray:
    return np.arange(25_000, dtype=np.float64) + i   # 200 KB: a segment of its own


@pytest.mark.parametrize("node_process", [False, True], ids=["in-head", "node-process"])
def test_repeated_medium_puts_go_into_spares_without_asking_and_give_them_back(
        start_cluster, node_process):
    # A process putting objects of one size class again and again is handed spare
    # segments of it: its next puts go in without a round trip, the seal names their
    # objects; the spares it no longer uses go back to the store.
    from orchestra._runtime import context as _context
    start_cluster(num_cpus=1, object_store_memory=256 * MiB,
                  _system_config={"node_process": True} if node_process else None)
    client = _context._client
    values = [np.arange(25_000, dtype=np.float64) * i for i in range(40)]
    with counting_creates(client) as (creates, _):
        refs = [orchestra.put(v) for v in values]
    assert len(creates) <= 10 and max(creates) > 0, f"a create per put: {creates}"
    assert client.objects.spare_bytes > 0
    assert all(np.array_equal(got, v) for got, v in zip(orchestra.get(refs, timeout=T), values, strict=True))
    assert orchestra.get([total.remote(r) for r in refs], timeout=T) == \
        [float(v.sum()) for v in values]
    # A worker's results go into its spares the same way.
    made = orchestra.get([medium.remote(i) for i in range(40)], timeout=T)
    assert all(np.array_equal(m, np.arange(25_000, dtype=np.float64) + i)
               for i, m in enumerate(made))
    del refs, made
    wait_store_empty(client)


def test_a_put_that_needs_the_room_gets_the_spares_back_at_once(start_cluster):
    # Spares count as used while a process holds them: a put that finds no room asks
    # their holders for them (RELEASE_MAPS), and goes in, instead of failing with
    # ObjectStoreFullError (or waiting for them to go back idle, 2 s).
    from orchestra._runtime import context as _context
    start_cluster(num_cpus=1, object_store_memory=64 * MiB)
    refs = [orchestra.put(np.arange(25_000, dtype=np.float64) * i) for i in range(20)]
    held = _context._client.objects.spare_bytes
    assert held > 0
    del refs
    big = np.ones((60 * MiB) // 8)   # a 64 MiB size class: the whole store
    ref = orchestra.put(big)
    assert _context._client.objects.spare_bytes == 0
    assert orchestra.get(total.remote(ref), timeout=T) == big.size
