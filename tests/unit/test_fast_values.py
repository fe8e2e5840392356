"""The shorter ways to a value a process learns: numpy arrays made as numpy's unpickling
makes them (serialization._ARRAYS), and DataFrames made from their columns' buffers as
pyarrow's to_pandas makes them (_objects/frames.py). Each is checked against the long
way on the same stream: the same type, dtype, shape, strides, flags, names and values,
over the same memory."""
from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _streams import read_only_copy, within
from orchestra._objects import frames, serialization
from orchestra._objects.serialization import deserialize, parse, serialize

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fresh_memos() -> Iterator[None]:
    """Each test starts with nothing learnt (the memos are the process's)."""
    saved = dict(serialization._ARRAYS), dict(frames._TEMPLATES)
    serialization._ARRAYS.clear()
    frames._TEMPLATES.clear()
    yield
    serialization._ARRAYS.clear()
    serialization._ARRAYS.update(saved[0])
    frames._TEMPLATES.clear()
    frames._TEMPLATES.update(saved[1])


def _same_array(fast: np.ndarray, slow: np.ndarray) -> None:
    assert type(fast) is type(slow) is np.ndarray
    assert fast.dtype == slow.dtype and fast.shape == slow.shape and fast.strides == slow.strides
    for flag in ("C_CONTIGUOUS", "F_CONTIGUOUS", "WRITEABLE", "ALIGNED", "OWNDATA"):
        assert fast.flags[flag] == slow.flags[flag], flag
    assert fast.tobytes() == slow.tobytes()
    assert fast.__array_interface__["data"][0] == slow.__array_interface__["data"][0]


ARRAYS = {
    "float64": lambda: np.random.default_rng(0).random(20_000),
    "int32-2d": lambda: np.arange(40_000, dtype=np.int32).reshape(200, 200),
    "float32-fortran": lambda: np.asfortranarray(np.ones((300, 100), dtype=np.float32)),
    "3d-fortran": lambda: np.asfortranarray(np.arange(60_000.0).reshape(30, 40, 50)),
    "big-endian": lambda: np.arange(20_000, dtype=">i4"),
    "structured": lambda: np.zeros(10_000, dtype=[("a", "<i4"), ("b", "<f8")]),
    "int8-column": lambda: np.asfortranarray(np.ones((100_000, 1), dtype=np.int8)),
    "complex": lambda: np.ones(10_000, dtype=np.complex128),
    "bool": lambda: np.arange(100_000) % 3 == 0,
    "one-row": lambda: np.ones((1, 20_000)),
    "one-column-fortran": lambda: np.asfortranarray(np.ones((20_000, 1))),
    "size-1-axes": lambda: np.asfortranarray(np.ones((1, 300, 1, 100))),
}


@pytest.mark.parametrize("make", ARRAYS.values(), ids=ARRAYS.keys())
def test_an_array_is_made_as_numpy_unpickles_it(make):
    value = make()
    view = read_only_copy(serialize(value))   # the put learns it, unless size-1 axes
    parsed = parse(view, "x")                   # leave numpy's order to its unpickling
    slow = pickle.loads(parsed.data[0], buffers=parsed.data[2::2])
    if parsed.ready is None:
        assert value.ndim > 1 and value.flags.c_contiguous and value.flags.f_contiguous
        parsed.value()                          # a reader learns it then
        parsed = parse(view, "x")
    assert parsed.ready is not None
    fast = parsed.value()
    _same_array(fast, slow)
    assert within(fast.__array_interface__["data"][0], view)
    assert np.array_equal(fast, value) or value.dtype.kind == "V" and fast.tobytes() == value.tobytes()


def test_a_reader_learns_an_array_from_its_first_unpickling():
    value = np.arange(50_000, dtype=np.int16).reshape(250, 200)
    view = read_only_copy(serialize(value))
    serialization._ARRAYS.clear()   # as in a process that did not put it
    first = parse(view, "x")
    assert first.ready is None
    slow = first.value()
    assert first.ready is not None   # the next value() of this parse is made by hand too
    again = parse(view, "x")
    assert again.ready is not None
    _same_array(again.value(), slow)
    _same_array(first.value(), slow)


class Sub(np.ndarray):
    pass


def _not_a_view(buffer: pickle.PickleBuffer) -> np.ndarray:
    return np.ones(7)


class Shaped:
    """One out-of-band buffer whose unpickling makes an array that is not a view of it."""

    def __init__(self) -> None:
        self.data = np.zeros(100_000, dtype=np.uint8)

    def __reduce_ex__(self, protocol: int) -> Any:
        return (_not_a_view, (pickle.PickleBuffer(self.data),))


@pytest.mark.parametrize("value", [
    np.arange(20_000.0).view(Sub),
    [np.arange(20_000.0)],
    Shaped(),
], ids=["subclass", "in-a-list", "not-a-view"])
def test_other_values_with_one_buffer_are_always_unpickled(value):
    view = read_only_copy(serialize(value))
    for _ in range(2):   # the first read would learn, the second would use it
        parsed = parse(view, "x")
        assert parsed.ready is None
        got = parsed.value()
        if isinstance(value, Sub):
            assert type(got) is Sub
        elif isinstance(value, Shaped):
            assert type(got) is np.ndarray and got.tolist() == [1.0] * 7
        else:
            assert type(got) is list and np.array_equal(got[0], value[0])
    assert serialization._ARRAYS == {}


# ------------------------------------------------------------------ DataFrames

NUMBERS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
           np.uint64, np.float32, np.float64]
OTHERS = {
    "bool": lambda n: np.arange(n) % 2 == 0,
    "str": lambda n: pd.array([f"s{i}" for i in range(n)], dtype="str")
    if pd.__version__ >= "3" else np.arange(n, dtype=np.int64),
    "arrow-int": lambda n: pd.array(list(range(n)), dtype="int64[pyarrow]"),
    "arrow-nulls": lambda n: pd.array([None if i % 3 else i for i in range(n)],
                                      dtype="float64[pyarrow]"),
}


def _reference(view: memoryview) -> pd.DataFrame:
    """What pyarrow's own conversion makes of the stream."""
    table = pa.ipc.open_stream(view).read_all()
    meta = {k: v for k, v in table.schema.metadata.items() if not k.startswith(b"orchestra.")}
    return table.replace_schema_metadata(meta).to_pandas(split_blocks=True, use_threads=False)


def _same_frame(got: pd.DataFrame, want: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got, want, check_exact=True, check_index_type=True,
                                  check_column_type=True, check_flags=True)
    assert type(got.columns) is type(want.columns) and got.columns.dtype == want.columns.dtype
    assert got.columns.name == want.columns.name and got.index.name == want.index.name
    assert type(got.index) is type(want.index) and got.attrs == want.attrs
    for name in got.columns:
        a, b = got[name].to_numpy(), want[name].to_numpy()
        assert a.flags.writeable == b.flags.writeable


@st.composite
def frames_(draw: st.DrawFn) -> pd.DataFrame:
    rows = draw(st.integers(0, 40))
    numbers = draw(st.lists(st.sampled_from(NUMBERS), min_size=1, max_size=6))
    data: dict[str, Any] = {f"c{i}": (np.arange(rows) * (i + 1)).astype(t)
                            for i, t in enumerate(numbers)}
    for name in draw(st.lists(st.sampled_from(sorted(OTHERS)), max_size=1)):
        data[name] = OTHERS[name](rows)
    start = draw(st.integers(-5, 5))
    step = draw(st.sampled_from([1, 2, -1, 3]))
    name = draw(st.sampled_from([None, "row"]))
    index = pd.RangeIndex(start, start + step * rows, step, name=name)
    return pd.DataFrame(data, index=index)


@pytest.mark.skipif(pd.__version__ < "3", reason="pandas 2 has no create_dataframe_from_blocks: "
                    "every DataFrame takes pyarrow's conversion")
@settings(max_examples=60, deadline=None)
@given(frames_())
def test_a_dataframe_made_by_hand_is_the_one_pyarrow_makes(df):
    frames._TEMPLATES.clear()
    ser = serialize(df)
    assert isinstance(ser, serialization.ArrowValue)
    view = read_only_copy(ser)
    want = _reference(view)
    first = deserialize(view)   # pyarrow's conversion, learnt from
    _same_frame(first, want)
    parsed = parse(view, "x")
    numeric = all(isinstance(t, np.dtype) and t.kind in "iuf" for t in df.dtypes)
    if not numeric:
        assert parsed.ready is None
    elif len(df):   # an empty one may be either way: no buffer to compare with
        assert parsed.ready is not None
    again = parsed.value()
    _same_frame(again, want)
    pd.testing.assert_frame_equal(again, df, check_exact=True)
    if numeric and len(df):
        for name in again.columns:
            assert within(again[name].to_numpy().__array_interface__["data"][0], view)


@pytest.mark.skipif(pd.__version__ < "3", reason="pandas 2: no frames made by hand")
def test_names_set_on_one_frame_do_not_reach_the_next():
    view = read_only_copy(serialize(pd.DataFrame({"a": np.arange(10.0), "b": np.arange(10)})))
    deserialize(view)
    one = deserialize(view)
    assert parse(view, "x").ready is not None
    one.columns.name = "cols"
    one.index.name = "rows"
    two = deserialize(view)
    assert two.columns.name is None and two.index.name is None
    assert list(two.columns) == ["a", "b"]


@pytest.mark.skipif(pd.__version__ < "3", reason="pandas 2: no frames made by hand")
def test_a_table_that_does_not_fit_its_schemas_template_takes_pyarrows_path():
    df = pd.DataFrame({"a": np.arange(6, dtype=np.int64), "b": np.arange(6.0)})
    view = read_only_copy(serialize(df))
    deserialize(view)   # the template of this schema is learnt
    assert parse(view, "x").ready is not None
    # The same schema and metadata, but the int column has nulls, and then two chunks.
    table = pa.ipc.open_stream(view).read_all()
    nulls = table.set_column(0, table.schema.field(0),
                             pa.array([0, None, 2, 3, None, 5], type=pa.int64()))
    chunked = pa.concat_tables([table.slice(0, 3), table.slice(3)])
    for other in (nulls, chunked):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, other.schema) as writer:
            writer.write_table(other)
        stream = memoryview(sink.getvalue().to_pybytes())
        parsed = parse(stream, "x")
        assert parsed.ready is None
        _same_frame(parsed.value(), _reference(stream))
    assert deserialize(view)["a"].tolist() == list(range(6))
