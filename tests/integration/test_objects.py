"""Objects on a real local cluster: put/get, shared memory without copies, reference
counting, and the bound on the object store."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import _helpers as h
import orchestra
from _probes import in_segment, wait_until
from orchestra.exceptions import ObjectStoreFullError

pytestmark = pytest.mark.timeout(60)

T = 30
BIG = 4 << 20   # well above the 64 KiB inline threshold


def _oid(ref: orchestra.ObjectRef) -> bytes:
    return ref.binary()


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("value", [
    None, 0, -7, 3.5, "text", b"bytes", True, [1, [2, 3]], (1, "a"), {"k": {"n": [1]}},
    {1, 2, 3}, frozenset({"x"}), complex(1, 2), b"x" * (1 << 20), list(range(100_000)),
    h.Box([1, 2]), h.CustomError(1, "as a value"),
], ids=lambda v: type(v).__name__)
def test_put_get_round_trips_any_picklable_value(cluster, value):
    got = orchestra.get(orchestra.put(value), timeout=T)
    if isinstance(value, h.Box):
        assert isinstance(got, h.Box) and got.content == value.content
    elif isinstance(value, Exception):
        assert type(got) is type(value) and str(got) == str(value)
    else:
        assert got == value and type(got) is type(value)


def test_a_value_defined_by_a_lambda_round_trips(cluster):
    fn = orchestra.get(orchestra.put(lambda x: x * 3), timeout=T)
    assert fn(2) == 6


def test_a_task_returns_values_through_the_store(cluster):
    arr = orchestra.get(h.make_array.remote(1_000_000), timeout=T)   # 8 MB: a segment
    assert arr.dtype == np.int64 and arr[-1] == 999_999
    assert orchestra.get(h.identity.remote({"a": 1}), timeout=T) == {"a": 1}


def test_put_of_a_ref_is_refused(cluster):
    with pytest.raises(TypeError, match="ObjectRef"):
        orchestra.put(orchestra.put(1))


# ------------------------------------------------------------------ inline and segments

def _shared_memory_objects(cluster) -> set[bytes]:
    return {oid for oid, o in cluster.objects().items() if o.in_shared_memory}


def test_small_values_travel_inline(cluster):
    ref = orchestra.put(b"x" * 1000)
    assert not cluster.objects()[_oid(ref)].in_shared_memory
    result = h.identity.remote(b"y" * 1000)
    orchestra.get(result, timeout=T)
    assert not cluster.objects()[_oid(result)].in_shared_memory


def test_large_values_are_written_once_to_the_store(cluster):
    arr = np.ones(BIG // 8)
    ref = orchestra.put(arr)
    info = cluster.objects()[_oid(ref)]
    assert info.in_shared_memory and info.size >= arr.nbytes
    before = _shared_memory_objects(cluster)
    # Passing the ref to tasks, and getting it, writes it nowhere else.
    assert orchestra.get([h.array_sum.remote(ref) for _ in range(4)], timeout=T) == [arr.size] * 4
    orchestra.get(ref, timeout=T)
    orchestra.get(ref, timeout=T)
    # (objects of earlier tests may still be freed meanwhile: only new ones count)
    assert _shared_memory_objects(cluster) - before == set()


def test_a_large_task_result_is_written_to_the_store(cluster):
    ref = h.make_array.remote(BIG // 8)
    orchestra.get(ref, timeout=T)
    assert cluster.objects()[_oid(ref)].in_shared_memory


def test_a_large_argument_passed_by_value_goes_through_the_store(cluster):
    arr = np.arange(BIG // 8, dtype=np.float64)
    assert orchestra.get(h.array_sum.remote(arr), timeout=T) == float(arr.sum())


# ------------------------------------------------------------------ zero copy

def test_a_large_numpy_array_comes_back_read_only_from_shared_memory(cluster):
    ref = orchestra.put(np.arange(BIG // 8, dtype=np.int64))
    a = orchestra.get(ref, timeout=T)
    b = orchestra.get(ref, timeout=T)
    assert not a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1
    assert np.shares_memory(a, b)   # two gets, one mapping: no copy
    assert _ends_in_mmap(a)


def _ends_in_mmap(arr: np.ndarray) -> bool:
    """The array's data lies in a segment's file mapped here (no copy in the heap)."""
    return in_segment(arr.__array_interface__["data"][0])


def test_a_task_sees_a_large_numpy_argument_read_only(cluster):
    ref = orchestra.put(np.ones(BIG // 8))
    info = orchestra.get(h.array_info.remote(ref), timeout=T)
    assert info == {"writeable": False, "sum": BIG // 8, "nbytes": BIG}


def test_a_view_outlives_the_ref_it_came_from(cluster):
    n = BIG // 8
    ref = orchestra.put(np.full(n, 5, dtype=np.int64))
    oid = _oid(ref)
    arr = orchestra.get(ref, timeout=T)
    del ref
    gc.collect()
    cluster.wait_freed(oid)
    # Objects of the same size may reuse freed memory, but not memory still viewed.
    others = [orchestra.put(np.full(n, 9, dtype=np.int64)) for _ in range(3)]
    assert orchestra.get(others[-1], timeout=T)[0] == 9
    assert arr.sum() == 5 * n


def test_a_pandas_dataframe_round_trips(cluster):
    df = pd.DataFrame({"a": np.arange(200_000), "b": np.linspace(0, 1, 200_000),
                       "c": ["x", "y"] * 100_000})
    got = orchestra.get(orchestra.put(df), timeout=T)
    pd.testing.assert_frame_equal(got, df)
    assert _ends_in_mmap(got["a"].to_numpy())   # numeric columns are views of the segment


def test_a_pandas_dataframe_round_trips_through_a_task(cluster):
    df = pd.DataFrame({"a": np.arange(200_000), "b": np.ones(200_000)})
    got = orchestra.get(h.identity.remote(df), timeout=T)
    pd.testing.assert_frame_equal(got, df)


def test_an_arrow_table_comes_back_from_shared_memory(cluster):
    table = pa.table({"a": pa.array(np.arange(500_000)), "s": pa.array(["v"] * 500_000)})
    ref = orchestra.put(table)
    got = orchestra.get(ref, timeout=T)
    assert got.equals(table)
    again = orchestra.get(ref, timeout=T)
    first = got.column("a").chunk(0).buffers()[1]
    second = again.column("a").chunk(0).buffers()[1]
    assert first.address == second.address   # both views of one mapping, no copy


# ------------------------------------------------------------------ reference counting

def test_dropping_the_last_ref_frees_the_object(cluster):
    ref = orchestra.put(np.ones(BIG // 8))
    oid = _oid(ref)
    assert oid in cluster.objects()
    del ref
    cluster.wait_freed(oid)


def test_dropping_a_task_result_frees_it(cluster):
    ref = h.make_array.remote(BIG // 8)
    orchestra.get(ref, timeout=T)
    oid = _oid(ref)
    del ref
    cluster.wait_freed(oid)


def test_a_copy_of_a_ref_keeps_the_object(cluster):
    ref = orchestra.put("kept")
    copy = [ref]
    oid = _oid(ref)
    del ref
    gc.collect()
    assert orchestra.get(copy[0], timeout=T) == "kept"
    assert oid in cluster.objects()


def test_a_queued_task_keeps_its_argument_alive(cluster, gates):
    gate = gates()
    blocker = h.gated.remote(gate, 1.0)
    arg = orchestra.put(np.full(BIG // 8, 2.0))
    oid = _oid(arg)
    result = h.add.remote(blocker, arg)   # waits for blocker, holding arg
    del arg
    gc.collect()
    assert cluster.objects()[oid].refcount >= 1
    gate.open()
    assert orchestra.get(result, timeout=T).sum() == 3.0 * (BIG // 8)
    cluster.wait_freed(oid)   # the finished task let go of it


def test_a_ref_inside_an_object_keeps_the_inner_object_alive(cluster):
    inner = orchestra.put(np.ones(BIG // 8))
    inner_id = _oid(inner)
    outer = orchestra.put({"inner": inner})
    outer_id = _oid(outer)
    del inner
    gc.collect()
    got = orchestra.get(outer, timeout=T)["inner"]
    assert orchestra.get(got, timeout=T).sum() == BIG // 8
    del got
    assert inner_id in cluster.objects()
    del outer
    cluster.wait_freed(outer_id)
    cluster.wait_freed(inner_id)


def test_a_ref_made_in_a_worker_and_returned_in_a_list_lives_with_the_list(cluster):
    outer = h.put_inside.remote(BIG)
    [inner] = orchestra.get(outer, timeout=T)
    assert orchestra.get(inner, timeout=T).sum() == 7 * BIG
    inner_id = _oid(inner)
    del inner, outer
    cluster.wait_freed(inner_id)


def test_refs_from_many_threads_are_counted(cluster):
    refs: list[orchestra.ObjectRef] = []
    lock = threading.Lock()

    def work() -> None:
        for i in range(50):
            r = orchestra.put(i)
            with lock:
                refs.append(r)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(T)
    assert sorted(orchestra.get(refs, timeout=T)) == sorted(list(range(50)) * 4)
    ids = [_oid(r) for r in refs]
    refs.clear()
    gc.collect()
    for oid in ids:
        cluster.wait_freed(oid)


@pytest.mark.timeout(120)
def test_putting_200_mb_thirty_times_runs_in_a_1_gib_store(start_cluster):
    c = start_cluster(num_cpus=1, object_store_memory=1 << 30)
    chunk = np.ones(200 * 1000 * 1000 // 8)
    ids = []
    for _ in range(30):
        ref = orchestra.put(chunk)
        ids.append(_oid(ref))
        del ref
    wait_until(lambda: not set(ids) & set(c.objects()), 10, "every object freed")
    wait_until(lambda: c.segment_bytes() <= 1 << 30, 10, "segments within the 1 GiB store")


# ------------------------------------------------------------------ the store's bound

def test_a_value_larger_than_the_store_raises_object_store_full_error(start_cluster):
    start_cluster(num_cpus=1, object_store_memory=32 << 20)
    with pytest.raises(ObjectStoreFullError) as info:
        orchestra.put(np.ones((40 << 20) // 8))
    message = str(info.value)
    assert "40.0 MiB" in message and "32.0 MiB" in message
    assert "object_store_memory" in message
    assert isinstance(info.value, MemoryError)


def test_a_store_full_of_objects_in_use_raises_object_store_full_error_until_dropped(start_cluster):
    # A value read from the store maps its segment: it cannot be spilled to disk.
    c = start_cluster(num_cpus=1, object_store_memory=32 << 20)
    first = orchestra.put(np.ones((20 << 20) // 8))
    in_use = orchestra.get(first, timeout=T)
    with pytest.raises(ObjectStoreFullError,
                       match=r"full: .* of 32\.0 MiB .* 20\.0 MiB more needed; .* in use"):
        orchestra.put(np.ones((20 << 20) // 8))
    oid = _oid(first)
    del first, in_use
    c.wait_freed(oid)
    again = orchestra.put(np.ones((20 << 20) // 8))
    assert orchestra.get(again, timeout=T).sum() == (20 << 20) // 8


def test_a_put_right_after_dropping_the_only_large_object_finds_its_room(start_cluster):
    start_cluster(num_cpus=1, object_store_memory=32 << 20)
    value = np.ones((20 << 20) // 8)
    ref = orchestra.put(value)
    for _ in range(3):   # the client's background flush may win the race once, not thrice
        del ref
        ref = orchestra.put(value)
    assert orchestra.get(ref, timeout=T).sum() == value.size


def _maps_of_removed_segments() -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if "/dev/shm/orchestra-" in line and "(deleted)" in line]


def test_a_writer_closes_its_maps_of_segments_the_store_removed(start_cluster):
    # A writer keeps the map of each segment it filled (the next put into it is a plain
    # memcpy); a map of a removed segment would keep its memory alive.
    start_cluster(num_cpus=1, object_store_memory=64 << 20)
    for n in (8, 20, 40):   # each size evicts the pooled segments of the one before
        ref = orchestra.put(np.ones((n << 20) // 8))
        assert orchestra.get(ref, timeout=T).sum() == (n << 20) // 8
        del ref
    kept = [orchestra.put(np.full((20 << 20) // 8, i)) for i in range(4)]   # spills one
    assert [orchestra.get(r, timeout=T)[0] for r in kept] == [0, 1, 2, 3]
    wait_until(lambda: not _maps_of_removed_segments(), 10,
               "the driver closed its maps of removed segments")


def test_a_task_result_too_large_for_the_store_raises_at_get(start_cluster):
    start_cluster(num_cpus=1, object_store_memory=32 << 20)
    with pytest.raises(ObjectStoreFullError):
        orchestra.get(h.make_array.options(max_retries=0).remote((40 << 20) // 8), timeout=T)


# ------------------------------------------------------------------ bad calls

def test_an_unpicklable_argument_fails_at_remote_naming_it(cluster):
    lock = threading.Lock()
    with pytest.raises(TypeError, match="lock") as info:
        h.identity.remote(lock)
    assert "pickl" in str(info.value)


def test_an_unpicklable_argument_inside_a_container_fails_at_remote(cluster):
    with pytest.raises(TypeError, match="lock"):
        h.identity.remote({"k": [threading.Lock()]})


def test_an_unpicklable_put_fails_naming_it(cluster):
    with pytest.raises(TypeError, match="lock"):
        orchestra.put(threading.Lock())


@pytest.mark.parametrize("not_a_ref", [1, "ref", None, b"\x00" * 16])
def test_get_of_something_that_is_not_a_ref_raises_type_error(cluster, not_a_ref):
    with pytest.raises((TypeError, ValueError)):
        orchestra.get(not_a_ref)


def test_get_of_a_list_holding_a_non_ref_raises_type_error(cluster):
    with pytest.raises(TypeError):
        orchestra.get([orchestra.put(1), 2])
