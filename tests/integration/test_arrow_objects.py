"""Objects as Arrow IPC streams in shared memory, on a real local cluster: Arrow tables
and DataFrames come back as views of the segment (no copy, no growth of the reader's
memory), a segment is a stream any Arrow reader opens, a damaged one is an error that
names the object, small values stay inline."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import _helpers as h
import orchestra
from _probes import in_segment, segment_span
from orchestra._runtime import context as _context
from orchestra.exceptions import DeserializationError

pytestmark = pytest.mark.timeout(90)

T = 60


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _table(rows: int) -> pa.Table:
    return pa.table({"i": np.arange(rows), "f": np.linspace(0, 1, rows),
                     "s": pa.array([f"r{k % 100}" for k in range(rows)])})


def _frame(rows: int) -> pd.DataFrame:
    return pd.DataFrame({"i": np.arange(rows), "f": np.linspace(0, 1, rows),
                         "b": np.arange(rows) % 3 == 0, "u": np.arange(rows, dtype=np.uint16)})


def test_a_table_put_comes_back_equal_as_a_view_of_its_segment(cluster):
    table = _table(300_000).replace_schema_metadata({"source": "test"})
    got = orchestra.get(orchestra.put(table), timeout=T)
    assert got.equals(table) and got.schema.metadata == {b"source": b"test"}
    for name in ("i", "f", "s"):
        assert in_segment(got.column(name).chunk(0).buffers()[1].address)


def test_getting_a_table_made_by_a_task_maps_it_without_copying_it(cluster):
    ref = h.make_table.remote(3_000_000)
    orchestra.wait([ref], timeout=T)
    before = _rss()
    got = orchestra.get(ref, timeout=T)
    grown = _rss() - before
    assert got.nbytes > 50 << 20
    assert grown < got.nbytes // 20, f"RSS grew by {grown} bytes reading {got.nbytes}"
    assert in_segment(got.column("f").chunk(0).buffers()[1].address)
    assert got.column("i").to_numpy()[-1] == 3_000_000 - 1


def test_a_task_reads_a_table_argument_where_it_lies(cluster):
    table = _table(200_000)
    total, in_place = orchestra.get(h.column_sum_in_place.remote(table, "f"), timeout=T)
    assert total == pytest.approx(float(np.linspace(0, 1, 200_000).sum()))
    assert in_place


def test_a_dataframe_round_trips_exactly_and_its_columns_are_views(cluster):
    df = _frame(200_000)
    ref = orchestra.put(df)
    got = orchestra.get(ref, timeout=T)
    pd.testing.assert_frame_equal(got, df, check_exact=True)
    assert in_segment(got["f"].to_numpy().__array_interface__["data"][0])
    total, in_place = orchestra.get(h.column_sum_in_place.remote(ref, "i"), timeout=T)
    assert total == float(df["i"].sum()) and in_place
    back = orchestra.get(h.identity.remote(ref), timeout=T)   # a task's result, too
    pd.testing.assert_frame_equal(back, df, check_exact=True)


def test_a_dataframe_that_does_not_convert_without_loss_round_trips_exactly(cluster):
    df = pd.DataFrame({"o": [object.__name__, 1, 2.5] * 50_000,
                       "c": pd.Categorical(["x", "y", "z"] * 50_000)},
                      index=pd.MultiIndex.from_arrays([np.arange(150_000), ["k"] * 150_000]))
    got = orchestra.get(h.identity.remote(df), timeout=T)
    pd.testing.assert_frame_equal(got, df, check_exact=True)


@pytest.mark.parametrize("make", [
    lambda: _table(100_000).to_batches()[0],
    lambda: pa.chunked_array([np.arange(100_000), np.arange(50_000)]),
    lambda: pa.array(np.linspace(0, 1, 100_000)),
], ids=["RecordBatch", "ChunkedArray", "Array"])
def test_arrow_values_keep_their_type_through_put_and_tasks(cluster, make):
    value = make()
    for got in (orchestra.get(orchestra.put(value), timeout=T),
                orchestra.get(h.identity.remote(value), timeout=T)):
        assert type(got) is type(value) and got.equals(value)


def test_a_small_table_stays_inline(cluster):
    table = _table(100)
    ref = orchestra.put(table)
    assert orchestra.get(ref, timeout=T).equals(table)
    assert _context._client.results[ref.binary()].WhichOneof("data") == "inline"
    assert ref.binary() not in cluster.objects() or not cluster.objects()[ref.binary()].in_shared_memory


_FOREIGN_READER = r"""
import hashlib, json, mmap, sys
import pyarrow as pa
with open(sys.argv[1], "rb") as f:
    mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
table = pa.ipc.open_stream(pa.py_buffer(memoryview(mm)[int(sys.argv[2]):])).read_all()
out = {"kind": table.schema.metadata[b"orchestra.kind"].decode(), "names": table.column_names,
       "rows": table.num_rows, "orchestra": any(m.startswith("orchestra") for m in sys.modules)}
if out["kind"] == "table":
    out["sum_i"] = int(sum(c.to_numpy().sum() for c in table.column("i").chunks))
    out["s_last"] = table.column("s")[-1].as_py()
else:
    out["buffer0"] = hashlib.sha256(table.column("buffer0")[0].as_py()).hexdigest()
print(json.dumps(out))
"""


def _read_without_orchestra(span: tuple[str, int]) -> dict:
    """What pyarrow alone reads of the stream at (file, offset) (a medium object's is a
    slot of a slab: the stream starts at its offset)."""
    # -I: no PYTHONPATH, no user site, no script directory: this process cannot find
    # the tests' orchestra, and imports nothing of it.
    out = subprocess.run([sys.executable, "-I", "-c", _FOREIGN_READER, span[0], str(span[1])],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_a_table_segment_is_read_by_pyarrow_in_a_process_without_orchestra(cluster):
    rows = 250_000
    ref = h.make_table.remote(rows)
    got = _read_without_orchestra(segment_span(ref))
    assert got["kind"] == "table" and got["names"] == ["i", "f", "s"] and not got["orchestra"]
    assert got["rows"] == rows and got["sum_i"] == rows * (rows - 1) // 2
    assert got["s_last"] == f"r{(rows - 1) % 100}"


def test_any_other_large_value_is_a_stream_of_its_pickle_and_buffers(cluster):
    import hashlib
    arr = np.random.default_rng(3).random(100_000)
    ref = orchestra.put(arr)
    got = _read_without_orchestra(segment_span(ref))
    assert got["kind"] == "pickle5" and got["names"] == ["pickle", "pad0", "buffer0"]
    assert got["buffer0"] == hashlib.sha256(arr.tobytes()).hexdigest()


def test_a_damaged_segment_raises_deserialization_error_naming_the_object(cluster):
    ref = h.make_table.remote(200_000)   # made by a task: this process has not read it
    path, offset = segment_span(ref)
    with open(path, "r+b") as f:
        f.seek(offset + 8)
        f.write(b"\x5a" * 256)           # the schema message, past its 8-byte prefix
    with pytest.raises(DeserializationError) as info:
        orchestra.get(ref, timeout=T)
    assert ref.hex() in str(info.value) and "Arrow IPC stream" in str(info.value)
    table = _table(200_000)   # the reader and the cluster carry on
    assert orchestra.get(h.identity.remote(table), timeout=T).equals(table)
