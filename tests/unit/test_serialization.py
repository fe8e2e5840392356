"""Serialization: values to bytes and back (pickles inline, Arrow streams in segments),
out-of-band buffers, Arrow data and DataFrames, damaged streams, refs collected while
pickling, and TaskError (no processes, no sockets)."""
from __future__ import annotations

import importlib
import pickle
import sys
import threading
import traceback
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _streams import address_of, read_only_copy, within
from orchestra._objects.pickle5_stream import read_pickle5
from orchestra._objects.serialization import (
    STREAM_MAGIC,
    ArrowValue,
    deserialize,
    dumps_exception,
    dumps_function,
    parse,
    serialize,
)
from orchestra._runtime import context as _context
from orchestra._runtime.object_ref import ObjectRef
from orchestra.exceptions import (
    DeserializationError,
    InfeasibleResourcesError,
    ObjectStoreFullError,
    OrchestraError,
    TaskError,
)

pytestmark = pytest.mark.timeout(30)


def round_trip(value: Any) -> Any:
    return deserialize(serialize(value).to_bytes())


class Point:
    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __repr__(self) -> str:   # the test's id: the same in every process
        return f"Point({self.x}, {self.y})"


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("value", [
    None, True, 0, -1, 2**100, 1.5, float("inf"), "", "text", "ünïcode", b"", b"\x00" * 10,
    [], [1, 2], (1,), {"a": [1, {"b": (2, 3)}]}, {1, 2}, frozenset({3}), complex(1, -1),
    list(range(1000)), {"deep": [[[[[1]]]]]}, Point(1, 2), bytearray(b"abc"),
], ids=repr)
def test_plain_values_round_trip(value):
    got = round_trip(value)
    assert got == value and type(got) is type(value)


def test_a_function_round_trips():
    offset = 10
    fn = round_trip(lambda x: x + offset)
    assert fn(1) == 11


def test_plain_values_carry_no_buffers_and_no_refs():
    ser = serialize({"k": [1, 2, "x"]})
    assert ser.buffers == [] and ser.contained == []
    assert ser.size == len(ser.to_bytes())
    assert ser.to_bytes()[:1] == b"\x80"   # inline: the bare pickle stream


def test_buffers_under_64_kib_are_pickled_in_band():
    arr = np.arange(1000, dtype=np.float64)
    ser = serialize(arr)
    assert ser.buffers == [] and ser.to_bytes()[:1] == b"\x80"
    np.testing.assert_array_equal(round_trip(arr), arr)


def test_a_numpy_array_travels_out_of_band_in_an_arrow_stream():
    arr = np.arange(100_000, dtype=np.float64)
    ser = serialize(arr)
    assert len(ser.buffers) == 1 and ser.buffers[0].nbytes == arr.nbytes
    assert len(ser.pickled) < 1000            # the data is not in the pickle stream
    # Inline: 64-byte aligned; in a segment: at its source's page offset (up to 4 KiB more).
    assert arr.nbytes <= ser.size <= ser.stream_size() < ser.size + 4096
    data = ser.to_bytes()
    assert data[:4] == STREAM_MAGIC and len(data) == ser.size
    np.testing.assert_array_equal(deserialize(data), arr)


def test_a_numpy_array_read_from_shared_memory_is_a_read_only_view():
    arr = np.arange(100_000, dtype=np.int32).reshape(100, 1000)
    view = read_only_copy(serialize(arr))
    got = deserialize(view)
    np.testing.assert_array_equal(got, arr)
    assert not got.flags.writeable
    assert within(got.__array_interface__["data"][0], view)   # a view of the map


def test_out_of_band_buffers_are_64_byte_aligned_at_their_sources_page_offset():
    arrays = [np.ones(70_000, dtype=np.uint8), np.ones(100_000, dtype=np.float64),
              np.ones(200_001, dtype=np.uint8)[1:]]   # a source 1 byte past an allocation
    view = read_only_copy(serialize(arrays))
    base = address_of(view)
    for src, got in zip(arrays, deserialize(view), strict=True):
        at = got.__array_interface__["data"][0] - base
        assert at % 64 == 0
        assert at % 4096 == (src.__array_interface__["data"][0] % 4096) & ~63


def test_a_non_contiguous_array_round_trips():
    arr = np.arange(10_000).reshape(100, 100)[:, ::3]
    np.testing.assert_array_equal(round_trip(arr), arr)


@pytest.mark.parametrize("dtype", ["float32", "int8", "complex128", "bool", "datetime64[ns]"])
@pytest.mark.parametrize("n", [1000, 100_000])
def test_numpy_dtypes_round_trip(dtype, n):
    arr = np.zeros(n, dtype=dtype)
    got = deserialize(read_only_copy(serialize(arr)))
    assert got.dtype == arr.dtype
    np.testing.assert_array_equal(got, arr)


def test_a_pickled_value_is_an_arrow_stream_any_arrow_reader_opens():
    value = {"a": np.arange(50_000, dtype=np.float64), "b": "text"}
    view = read_only_copy(serialize(value))
    table = pa.ipc.open_stream(view).read_all()
    assert table.schema.metadata[b"orchestra.kind"] == b"pickle5"
    assert table.column_names == ["pickle", "pad0", "buffer0"]
    assert table.column("buffer0")[0].as_py() == value["a"].tobytes()
    assert pickle.loads(table.column("pickle")[0].as_py(),
                        buffers=[table.column("buffer0")[0].as_py()])["b"] == "text"


def test_a_large_pickle_without_buffers_is_an_arrow_stream_in_a_segment():
    value = list(range(100_000))
    ser = serialize(value)
    assert ser.to_bytes()[:1] == b"\x80"              # inline form
    assert deserialize(read_only_copy(ser)) == value  # the segment's form: a stream



@pytest.mark.parametrize("make", [
    lambda: [np.arange(3 << 20, dtype=np.int32), np.ones(5 << 20, dtype=np.uint8) * 7, "x"],
    lambda: pa.table({f"c{i}": np.arange(1 << 20, dtype=np.float64) + i for i in range(4)}),
    lambda: pd.DataFrame({f"c{i}": np.arange(1 << 20) * i for i in range(5)}),
], ids=["buffers", "table", "frame"])
def test_a_large_stream_written_on_several_threads_is_the_same_bytes(make, monkeypatch):
    import orchestra._objects.serialization as serialization
    value = make()
    ser = serialize(value)
    assert ser.stream_size() >= serialization._PARALLEL_MIN
    streams = []
    for threads in (1, 4):
        monkeypatch.setattr(serialization, "_COPY_THREADS", threads)
        out = bytearray(ser.stream_size())
        ser.write_into(memoryview(out))
        streams.append(bytes(out))
    assert streams[0] == streams[1]
    got = deserialize(streams[1])
    if isinstance(value, list):
        assert all(np.array_equal(a, b) for a, b in zip(got[:2], value[:2], strict=True)) and got[2] == "x"
    else:
        assert got.equals(value)

# ------------------------------------------------------------------ Arrow data and pandas

def test_a_pyarrow_table_is_written_as_itself_and_read_back_zero_copy():
    table = pa.table({"n": pa.array(np.arange(100_000)), "s": pa.array(["x"] * 100_000),
                      "l": pa.array([[1, 2]] * 100_000)}).replace_schema_metadata({"own": "kept"})
    ser = serialize(table)
    assert isinstance(ser, ArrowValue) and ser.contained == []
    view = read_only_copy(ser)
    got = deserialize(view)
    assert got.equals(table) and got.schema.metadata == {b"own": b"kept"}
    assert within(got.column("n").chunk(0).buffers()[1].address, view)
    # the segment is a plain Arrow stream of the same table
    plain = pa.ipc.open_stream(view).read_all()
    assert plain.schema.metadata[b"orchestra.kind"] == b"table"
    assert plain.drop_columns([]).equals(table)


@pytest.mark.parametrize("value", [
    pa.record_batch({"a": pa.array([1, 2, 3]), "b": pa.array(["x", None, "z"])}),
    pa.chunked_array([pa.array([1, 2]), pa.array([3])]),
    pa.array([1.5, None, 3.5]),
    pa.array(["a", "b"]).dictionary_encode(),
    pa.array([], pa.int32()),
    pa.record_batch({"a": pa.array([], pa.int8())}),
    pa.table({"t": pa.array([1, 2], pa.timestamp("us", tz="UTC"))}),
], ids=lambda v: type(v).__name__)
def test_arrow_values_come_back_as_the_same_type(value):
    ser = serialize(value)
    assert isinstance(ser, ArrowValue)
    for data in (ser.to_bytes(), read_only_copy(ser)):
        got = deserialize(data)
        assert type(got) is type(value) and got.equals(value)


def test_a_stream_of_another_writer_comes_back_as_a_table():
    table = pa.table({"x": [1, 2, 3]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    assert deserialize(sink.getvalue().to_pybytes()).equals(table)


@pytest.mark.parametrize("make", [
    lambda: pd.DataFrame({"f": np.linspace(0, 1, 50_000), "i": np.arange(50_000),
                          "b": np.arange(50_000) % 2 == 0, "u": np.arange(50_000, dtype=np.uint8)}),
    lambda: pd.DataFrame({"f": [1.0, np.nan, 3.0]}, index=pd.Index([10, 20, 30])),
    lambda: pd.DataFrame({"f": np.arange(4.0), "k": np.arange(4)}).set_index("k"),
    lambda: pd.DataFrame({"a": pd.array([1, None, 3], dtype="int64[pyarrow]")}),
    lambda: pd.DataFrame({"s": pd.array(["x", None], dtype="string[pyarrow]")}),
    lambda: pd.DataFrame({"f": np.arange(3.0)}, index=pd.RangeIndex(5, 11, 2, name="row")),
], ids=["numeric", "nan-and-index", "named-index", "arrow-dtype", "arrow-strings", "range"])
def test_a_dataframe_that_converts_without_loss_takes_the_arrow_path(make):
    df = make()
    ser = serialize(df)
    # pandas 2 reads Arrow strings back as python ones: it pickles them instead
    pandas_2_strings = str(df.dtypes.iloc[0]) == "string" and pd.__version__ < "3"
    assert isinstance(ser, ArrowValue) or pandas_2_strings
    view = read_only_copy(ser)
    got = deserialize(view)
    pd.testing.assert_frame_equal(got, df, check_exact=True)
    assert got.index.equals(df.index) and type(got.index) is type(df.index)
    kind = pa.ipc.open_stream(view).read_all().schema.metadata[b"orchestra.kind"]
    assert kind == (b"pickle5" if pandas_2_strings else b"pandas")


def test_numeric_dataframe_columns_are_read_zero_copy():
    df = pd.DataFrame({f"c{i}": np.arange(100_000, dtype=np.float64) + i for i in range(3)})
    view = read_only_copy(serialize(df))
    got = deserialize(view)
    for name in df.columns:
        column = got[name].to_numpy()
        assert within(column.__array_interface__["data"][0], view)
        assert not column.flags.writeable


@pytest.mark.parametrize("make", [
    lambda: pd.DataFrame({"o": [object(), 1]}).assign(o=lambda d: d.o.astype(str)),
    lambda: pd.DataFrame({"c": pd.Categorical(["x", "y"] * 5)}),
    lambda: pd.DataFrame({"i": [1, 2]}, index=pd.MultiIndex.from_tuples([(1, "a"), (2, "b")])),
    lambda: pd.DataFrame({("a", "b"): [1, 2]}),
    lambda: pd.DataFrame({1: [1, 2]}),
    lambda: pd.DataFrame({"h": np.zeros(3, dtype=np.float16)}),
    lambda: pd.DataFrame({"t": pd.to_datetime(["2024-01-01", "2024-01-02"])}),
    lambda: pd.DataFrame({"i": [1, 2]}, index=pd.Index(["a", "b"], dtype=object)),
    lambda: pd.DataFrame({"i": np.arange(3)}).rename_axis(columns="cols"),
], ids=["objects", "categorical", "multiindex", "tuple-names", "int-names", "float16",
        "datetime", "object-index", "named-columns"])
def test_other_dataframes_are_pickled_and_round_trip_exactly(make):
    df = make()
    df.attrs = {} if len(df.columns) else df.attrs
    ser = serialize(df)
    got = deserialize(read_only_copy(ser))
    pd.testing.assert_frame_equal(got, df, check_exact=True)


def test_a_dataframe_with_attrs_keeps_them():
    df = pd.DataFrame({"f": np.arange(3.0)})
    df.attrs["unit"] = "m"
    got = round_trip(df)
    assert got.attrs == {"unit": "m"}
    pd.testing.assert_frame_equal(got, df)


# ------------------------------------------------------------------ damaged streams

@pytest.mark.parametrize("value", [np.arange(50_000.0), pa.table({"x": np.arange(50_000)})],
                         ids=["pickle5", "table"])
@pytest.mark.parametrize("damage", ["truncated", "schema", "batch-header"])
def test_a_stream_that_does_not_parse_raises_deserialization_error(value, damage):
    ser = serialize(value)
    data = bytearray(ser.stream_size())
    ser.write_into(memoryview(data))
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "schema":
        data[8:200] = b"\x5a" * 192
    else:
        at = data.index(STREAM_MAGIC, 4) + 8   # the record batch's metadata
        data[at: at + 96] = b"\xee" * 96
    with pytest.raises(DeserializationError) as info:
        deserialize(bytes(data), "object 00ff")
    assert "object 00ff" in str(info.value)



# ------------------------------------------------------------------ the pickle5 reader by hand

def _stream(value: Any) -> bytes:
    ser = serialize(value)
    out = bytearray(ser.stream_size())
    ser.write_into(memoryview(out))
    return bytes(out)


def _by_pyarrow(data: bytes) -> list[bytes]:
    batch = pa.ipc.open_stream(data).read_next_batch()
    batch.validate(full=True)
    return [column[0].as_py() for column in batch.columns]


@given(st.lists(st.one_of(st.binary(max_size=64),
                          st.integers(0, 200_000).map(lambda n: np.arange(n, dtype=np.uint8))),
                max_size=5))
@settings(max_examples=60, deadline=None)
def test_the_hand_reader_gives_the_columns_pyarrow_reads(values):
    data = _stream(values)
    ours = read_pickle5(memoryview(data))
    assert ours is not None and [bytes(v) for v in ours] == _by_pyarrow(data)
    got = deserialize(data)
    assert len(got) == len(values) and all(
        np.array_equal(a, b) if isinstance(b, np.ndarray) else a == b
        for a, b in zip(got, values, strict=True))


def test_the_hand_reader_leaves_other_kinds_to_pyarrow():
    assert read_pickle5(memoryview(_stream(pa.table({"x": np.arange(10)})))) is None


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_a_damaged_pickle5_stream_raises_deserialization_error_or_reads(data):
    # Any byte of the two messages' metadata changed: the reader either says the
    # stream is damaged or reads values inside it, never another error.
    stream = bytearray(_stream([np.arange(70_000, dtype=np.uint8), b"abc"]))
    meta_end = stream.index(STREAM_MAGIC, 4)
    meta_end = meta_end + 8 + int.from_bytes(stream[meta_end + 4: meta_end + 8], "little")
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, meta_end + 16))
        stream[at] = data.draw(st.integers(0, 255))
    try:
        parsed = parse(memoryview(bytes(stream)), "object 00ff")
    except DeserializationError as exc:
        assert "object 00ff" in str(exc)
        return
    if parsed.kind == b"pickle5":
        assert all(isinstance(v, memoryview) for v in parsed.data)


def test_reading_a_numpy_value_does_not_import_pyarrow(tmp_path):
    import subprocess
    (tmp_path / "value.stream").write_bytes(_stream([np.arange(100_000), "x"]))
    code = (
        "import sys, numpy as np\n"
        "from orchestra._objects.serialization import deserialize\n"
        "value = deserialize(open(sys.argv[1], 'rb').read())\n"
        "assert value[0].sum() == sum(range(100_000)) and value[1] == 'x'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyarrow'))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "value.stream")],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    assert out.strip() == "[]"

# ------------------------------------------------------------------ refs inside values

class FakeClient:
    """Stands in for CoreClient: counts refs the way ObjectRef asks it to."""

    def __init__(self) -> None:
        self.counts: dict[bytes, int] = {}
        self.lost: str | None = None   # the cluster is alive

    def add_ref(self, oid: bytes, counted: bool) -> None:
        self.counts[oid] = self.counts.get(oid, 0) + 1

    def remove_ref(self, oid: bytes) -> None:
        self.counts[oid] -= 1


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    fake = FakeClient()
    monkeypatch.setattr(_context, "_client", fake)
    return fake


def test_refs_pickled_inside_a_value_are_collected(client):
    a, b, c = (ObjectRef(bytes([i]) * 16, client) for i in (1, 2, 3))
    ser = serialize({"list": [a, (b,)], "obj": Point(c, 0)})
    assert ser.contained == [a.binary(), b.binary(), c.binary()]


def test_a_value_without_refs_collects_none(client):
    assert serialize(Point(1, 2)).contained == []


def test_collection_of_nested_serializations_stays_apart(client):
    inner_ref, outer_ref = ObjectRef(b"i" * 16, client), ObjectRef(b"o" * 16, client)
    seen: list[list[bytes]] = []

    class SerializesOnPickle:
        def __reduce__(self):
            seen.append(serialize([inner_ref]).contained)
            return (list, ())

    ser = serialize([outer_ref, SerializesOnPickle()])
    assert seen == [[inner_ref.binary()]]
    assert ser.contained == [outer_ref.binary()]


def test_refs_come_back_as_refs_counted_in_this_process(client):
    ref = ObjectRef(b"r" * 16, client)
    data = serialize([ref]).to_bytes()
    [got] = deserialize(data)
    assert isinstance(got, ObjectRef) and got == ref
    assert client.counts[ref.binary()] == 2


def test_collection_is_per_thread(client):
    results: dict[str, list[bytes]] = {}
    barrier = threading.Barrier(2)

    class Slow:
        def __init__(self, name: str) -> None:
            self.name = name

        def __reduce__(self):
            barrier.wait(5)
            return (str, (self.name,))

    def work(name: str) -> None:
        ref = ObjectRef(name.encode() * 16, client)
        results[name] = serialize([ref, Slow(name)]).contained

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert results == {"a": [b"a" * 16], "b": [b"b" * 16]}


# ------------------------------------------------------------------ what cannot be pickled

@pytest.mark.parametrize("value, named", [
    (threading.Lock(), "lock"),
    ([1, threading.Lock()], "list"),
    ({"gen": (i for i in range(3))}, "dict"),
])
def test_an_unpicklable_value_raises_type_error_naming_it(value, named):
    with pytest.raises(TypeError, match=named) as info:
        serialize(value)
    assert "cloudpickle" in str(info.value)           # the cause
    assert "inside the task" in str(info.value)       # the remedy


def test_the_type_error_for_a_huge_value_is_short():
    with pytest.raises(TypeError) as info:
        serialize([threading.Lock()] + list(range(100_000)))
    assert len(str(info.value)) < 1000


def _refuse() -> None:
    raise RuntimeError("refused to unpickle")


class RefusesToUnpickle:
    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse, ())


def test_a_value_that_cannot_be_unpickled_raises_deserialization_error_naming_the_cause():
    data = serialize(RefusesToUnpickle()).to_bytes()
    with pytest.raises(DeserializationError) as info:
        deserialize(data)
    message = str(info.value)
    assert "RuntimeError: refused to unpickle" in message           # the cause
    assert "raised in _refuse()" in message and __file__ in message   # where
    assert "import" in message                                      # the remedy
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_value_of_a_module_that_cannot_be_imported_raises_deserialization_error():
    # Same length: pickle frames the strings it holds.
    data = pickle.dumps(Point(1, 2)).replace(b"test_serialization", b"no_such_module_xyz")
    with pytest.raises(DeserializationError, match="No module named 'no_such_module_xyz'"):
        deserialize(data)


def test_an_unpicklable_function_raises_type_error_naming_it():
    lock = threading.Lock()

    def uses_lock() -> None:
        with lock:
            pass

    with pytest.raises(TypeError, match="uses_lock"):
        dumps_function(uses_lock)


def test_a_function_of_an_importable_module_is_pickled_by_name():
    blob = dumps_function(traceback.format_exc)
    assert len(blob) < 500
    assert pickle.loads(blob) is traceback.format_exc


_USER_MODULE = """
import orchestra

@orchestra.remote
def triple(x):
    return 3 * x
"""
_USER_MODULE_NAME = "orchestra_unit_usermod"


@pytest.fixture
def user_module(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A user's module on sys.path holding a @remote function."""
    (tmp_path / f"{_USER_MODULE_NAME}.py").write_text(_USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, _USER_MODULE_NAME, raising=False)
    module = importlib.import_module(_USER_MODULE_NAME)
    yield module
    sys.modules.pop(_USER_MODULE_NAME, None)


def test_a_remote_function_of_a_module_is_pickled_by_name(user_module):
    fn = user_module.triple._fn
    assert pickle.loads(dumps_function(fn)) is fn   # the module's own: file, lines, globals


def test_a_function_whose_module_cannot_be_imported_loads_by_value(user_module, monkeypatch,
                                                                   tmp_path):
    blob = dumps_function(user_module.triple._fn)
    monkeypatch.delitem(sys.modules, _USER_MODULE_NAME)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    loaded = pickle.loads(blob)
    assert loaded(2) == 6 and _USER_MODULE_NAME not in sys.modules


# ------------------------------------------------------------------ TaskError

def _raised(exc: BaseException) -> tuple[BaseException, str]:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - the test wants every kind
        return caught, traceback.format_exc()


class TwoArgError(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code


@pytest.mark.parametrize("exc", [
    ValueError("bad value"), KeyError("missing"), ZeroDivisionError("zero"),
    FileNotFoundError(2, "no such file"), MemoryError("oom"), TwoArgError(7, "detail"),
    ObjectStoreFullError("store full"), InfeasibleResourcesError("too much"),
], ids=lambda e: type(e).__name__)
def test_task_error_wrap_is_an_instance_of_the_original_class(exc):
    cause, tb = _raised(exc)
    err = TaskError.wrap("mod.fn", tb, cause, 4121)
    assert isinstance(err, TaskError) and isinstance(err, type(exc))
    assert err.cause is cause and err.pid == 4121 and err.function_name == "mod.fn"
    assert str(exc) in str(err) and tb in str(err)
    assert "mod.fn" in str(err) and "pid=4121" in str(err)


def test_task_error_wrap_can_be_caught_as_the_original_class():
    cause, tb = _raised(ValueError("caught by type"))
    with pytest.raises(ValueError, match="caught by type"):
        raise TaskError.wrap("fn", tb, cause, 1)


@pytest.mark.parametrize("exc", [
    ValueError("bad value"), TwoArgError(7, "detail"), MemoryError("oom"),
    FileNotFoundError(2, "no such file"),
], ids=lambda e: type(e).__name__)
def test_task_error_pickles_and_keeps_class_message_and_traceback(exc):
    cause, tb = _raised(exc)
    err = TaskError.wrap("mod.fn", tb, cause, 4121)
    back = pickle.loads(dumps_exception(err))
    assert isinstance(back, TaskError) and isinstance(back, type(exc))
    assert str(back) == str(err)
    assert back.traceback_str == tb and back.pid == 4121 and back.function_name == "mod.fn"
    assert type(back.cause) is type(exc) and str(back.cause) == str(exc)


def test_a_task_error_class_is_made_once_per_exception_class():
    a = TaskError.wrap("f", "", ValueError("a"), 1)
    b = TaskError.wrap("g", "", ValueError("b"), 2)
    assert type(a) is type(b)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)], ids=repr)
def test_base_exceptions_are_wrapped_as_a_plain_task_error(exc):
    err = TaskError.wrap("fn", "tb", exc, 1)
    assert type(err) is TaskError and err.cause is exc


def test_a_task_error_escaping_an_outer_task_keeps_the_innermost_class():
    inner = TaskError.wrap("inner", "tb1", ValueError("x"), 1)
    outer = TaskError.wrap("outer", "tb2", inner, 2)
    assert type(outer) is type(inner)          # TaskError(ValueError): no class nesting
    assert isinstance(outer, ValueError) and outer.cause is inner
    assert "tb1" in str(outer) and "tb2" in str(outer)
    back = pickle.loads(dumps_exception(outer))
    assert isinstance(back, ValueError) and isinstance(back.cause, ValueError)


def test_a_plain_task_error_escaping_an_outer_task_stays_plain():
    inner = TaskError("inner", "tb1", None, 1)
    assert type(TaskError.wrap("outer", "tb2", inner, 2)) is TaskError


def test_an_exception_pickle_cannot_rebuild_falls_back_to_its_text():
    class Unrebuildable(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a}/{b}")

    cause, tb = _raised(Unrebuildable(1, 2))
    err = TaskError.wrap("fn", tb, cause, 1)
    back = pickle.loads(dumps_exception(err))
    assert isinstance(back, TaskError)
    assert "Unrebuildable: 1/2" in str(back) and back.traceback_str == tb


def test_dumps_exception_of_an_unpicklable_plain_exception_keeps_its_text():
    class Holds(Exception):
        pass

    exc = Holds("with a lock")
    exc.lock = threading.Lock()
    back = pickle.loads(dumps_exception(exc))
    assert isinstance(back, RuntimeError) and "with a lock" in str(back)


def test_orchestra_errors_share_one_base():
    for cls in (TaskError, ObjectStoreFullError, InfeasibleResourcesError):
        assert issubclass(cls, OrchestraError)
    assert issubclass(ObjectStoreFullError, MemoryError)
    assert issubclass(InfeasibleResourcesError, ValueError)


def test_serializing_while_another_thread_imports_pyarrow_waits_for_it(tmp_path):
    # pyarrow is in sys.modules from the start of its import (~0.1 s): a put on another
    # thread then found a module without Table ("partially initialized module").
    import subprocess
    code = (
        "import sys, threading, numpy as np\n"
        "from orchestra._objects.serialization import serialize\n"
        "t = threading.Thread(target=lambda: __import__('pyarrow')); t.start()\n"
        "errors = []\n"
        "while t.is_alive():\n"
        "    try:\n"
        "        serialize([np.ones(10), 'x'])\n"
        "    except Exception as e:\n"
        "        errors.append(repr(e))\n"
        "t.join()\n"
        "print(len(errors), errors[:1])\n")
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        assert out.startswith("0 "), out


def test_the_inline_size_depends_on_the_value_not_on_where_its_buffers_lie():
    # A segment places each large buffer at its source's offset within a page (a fast
    # copy); the inline form does not, so the inline threshold sees the same size for
    # the same value wherever it lies in memory (a 100 KB array went inline or not by
    # its address before).
    backing = np.zeros(12500 + 4096 // 8)
    sizes, streams = set(), set()
    for shift in range(0, 4096 // 8, 37):
        view = backing[shift:shift + 12500]
        view[:] = 1.0
        ser = serialize(view)
        sizes.add(ser.size)
        streams.add(ser.stream_size())
        raw = ser.to_bytes()
        assert len(raw) == ser.size
        assert np.array_equal(deserialize(memoryview(raw)), view)
    assert len(sizes) == 1 and sizes.pop() < 100 * 1024, "a 100 KB array's inline size varies"
    assert len(streams) > 1   # its stream does follow the source's page offset
