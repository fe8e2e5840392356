"""Values to bytes and back: cloudpickle (pickle protocol 5), and Arrow IPC streams for
every object in shared memory.

Two forms, told apart by their first bytes:

    inline (small values, in messages): the bare pickle stream (starts with the PROTO
        opcode 0x80); buffers under 64 KiB are pickled in band.
    stream (objects in shared memory, and inline values holding a large buffer): an
        Arrow IPC stream (starts with the continuation marker 0xFFFFFFFF), its schema's
        metadata ``orchestra.kind`` saying what it holds:
          table / record_batch / chunked_array / array: that Arrow value, its own data;
          pandas: a DataFrame that converts to Arrow without loss (``pandas`` metadata);
          pickle5: any other value, one record batch of one row, large_binary columns
              | pickle | pad0 | buffer0 | pad1 | buffer1 | ...
              the pickle stream, then each out-of-band buffer (numpy arrays, ...), each
              64-byte aligned in the segment (the pad columns place them) and, from
              64 KiB, at the same offset within a page as its source, rounded down to
              64 bytes: the copy then runs at memcpy speed (~3x slower otherwise).

pyarrow writes and reads every stream (``pyarrow.ipc.open_stream`` over a segment's
bytes, from its offset in its file, gives the same table back, orchestra or not).
deserialize(view) over a read-only map of a segment returns Arrow data, DataFrame
columns and numpy arrays that are views of shared memory, with no copy; the map stays
alive while any of them lives.
"""
from __future__ import annotations

import os
import pickle
import struct
import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cloudpickle

from ..exceptions import DeserializationError
from . import frames, stream_templates
from .pickle5_stream import KIND, STREAM_MAGIC, read_pickle5

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

ALIGN = 64
_PAD = b"orchestra.pad"         # spaces: moves a table's data to a better offset
_OWN_KEYS = (KIND, _PAD)
_PLACE_MIN = 1 << 20           # tables from this size are placed (see _DryRun)
_OUT_OF_BAND_MIN = 64 * 1024   # smaller buffers are pickled in band
# Values up to this travel inline in messages by default (cfg inline_threshold); larger
# ones, through a segment, are put faster (measured in docs/objects.md).
INLINE_MAX = 64 * 1024
_PAGE = 4096
_OFFSETS = 16                  # a one-row large_binary column's offsets buffer
_EOS = 8                       # the stream's end marker
_OFFSETS_OF = struct.Struct("<qq")

# Exact types whose pickle never needs cloudpickle (no code, no __main__ classes).
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})
_PLAIN_CONTAINERS = frozenset({list, tuple, dict})

_collect = threading.local()


def _pad8(n: int) -> int:
    return (n + 7) & ~7


class Serialized:
    """A value ready to be copied inline or into a segment.

    ``size``: bytes of its inline form (what the inline threshold is compared with);
    ``stream_size()``: bytes of its Arrow stream, the size of its segment;
    ``contained``: ids of the ObjectRefs pickled inside it."""

    __slots__ = ("contained", "size")

    contained: list[bytes]
    size: int

    def to_bytes(self) -> bytes:
        """The inline form."""
        raise NotImplementedError

    def stream_size(self) -> int:
        raise NotImplementedError

    def write_into(self, dest: memoryview) -> None:
        """Write the Arrow stream into ``dest`` (writable, at least stream_size() bytes)."""
        raise NotImplementedError


class PickledValue(Serialized):
    """A pickle stream and its out-of-band buffers (each at least 64 KiB)."""

    __slots__ = ("pickled", "buffers", "_plan")

    def __init__(self, pickled: bytes, buffers: list[memoryview], contained: list[bytes]) -> None:
        self.pickled = pickled
        self.buffers = buffers
        self.contained = contained
        self._plan: tuple[pa.Schema, list[pa.Array], int] | None = None   # a segment's
        # The inline form's buffers are 64-byte aligned only: its size depends on the
        # value alone, not on where its buffers happen to lie in memory (a value just
        # under the threshold went inline or not by its source's page offset).
        self.size = self._inline_size() if buffers else len(pickled)

    def to_bytes(self) -> bytes:
        if not self.buffers:
            return self.pickled
        out = bytearray(self.size)
        self.write_into(memoryview(out), page=False)
        return bytes(out)

    def stream_size(self) -> int:
        if self.buffers and self._plan is None:
            layout, _, _, total = self._places()
            if stream_templates.find(layout) is not None:
                return total
        return self._layout()[2]

    def write_into(self, dest: memoryview, page: bool = True) -> None:
        """Write the Arrow stream into ``dest``; a value of a layout written before
        (under 1 MiB) from its template (stream_templates), ~3 us instead of ~20."""
        import pyarrow as pa
        if page and self.buffers:
            layout, pickle_at, buffers_at, total = self._places()
            template = stream_templates.find(layout)
            if template is not None:
                template.write(dest, self.pickled, self.buffers)
                return
        schema, columns, total = self._layout(page)
        sink = _sink(dest)
        with pa.ipc.new_stream(sink, schema) as writer:
            writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=schema))
        if sink.tell() != total:   # the layout below no longer matches pyarrow's writer
            raise RuntimeError(f"the Arrow stream of a value took {sink.tell()} bytes where "
                               f"{total} were planned: pyarrow {pa.__version__} lays out "
                               "IPC streams differently; orchestra needs an update for it")
        if page and self.buffers and total < stream_templates.LARGEST:
            stream_templates.learn(layout, dest, self.pickled, self.buffers, pickle_at,
                                   buffers_at, total)

    def _inline_size(self) -> int:
        """_layout(page=False)'s stream size, without making its columns."""
        pos = _pickle_schema(len(self.buffers))[1] + _OFFSETS + _pad8(len(self.pickled))
        for b in self.buffers:
            start = pos + 2 * _OFFSETS
            pos = start + (-start % ALIGN) + _pad8(b.nbytes)
        return pos + _EOS

    def _places(self, page: bool = True) -> tuple[stream_templates.Layout, int,
                                                  tuple[int, ...], int]:
        """(layout, where the pickle goes, where each buffer goes, stream size): each
        buffer 64-byte aligned in the stream and, from 64 KiB (``page``: in a segment),
        at its source's offset within a page (rounded down to 64 bytes)."""
        import pyarrow as pa
        pickle_at = _pickle_schema(len(self.buffers))[1] + _OFFSETS
        pos = pickle_at + _pad8(len(self.pickled))
        pads = []
        places = []
        for b in self.buffers:
            start = pos + 2 * _OFFSETS   # past the pad column's and this column's offsets
            if page and b.nbytes >= _OUT_OF_BAND_MIN:
                pad = (((pa.py_buffer(b).address % _PAGE) & ~(ALIGN - 1)) - start) % _PAGE
            else:
                pad = -start % ALIGN
            pads.append(pad)
            places.append(start + pad)
            pos = start + pad + _pad8(b.nbytes)
        layout = (len(self.pickled), tuple(b.nbytes for b in self.buffers), tuple(pads))
        return layout, pickle_at, tuple(places), pos + _EOS

    def _layout(self, page: bool = True) -> tuple[pa.Schema, list[pa.Array], int]:
        """(schema, columns, stream size), placed as _places says. A segment's is kept
        (stream_size, then write_into); the inline form's is made once, by to_bytes."""
        if page and self._plan is not None:
            return self._plan
        import pyarrow as pa
        layout, _, _, total = self._places(page)
        columns = [_one_value(pa.py_buffer(self.pickled))]
        for b, pad in zip(self.buffers, layout[2], strict=True):
            columns.append(_one_value(pa.py_buffer(_ZEROS[:pad])))
            columns.append(_one_value(pa.py_buffer(b)))
        plan = (_pickle_schema(len(self.buffers))[0], columns, total)
        if page:
            self._plan = plan
        return plan


class ArrowValue(Serialized):
    """Arrow data (a Table or RecordBatch standing for what was put) written as itself."""

    __slots__ = ("data",)

    def __init__(self, data: pa.Table | pa.RecordBatch, kind: bytes) -> None:
        import pyarrow as pa
        meta = dict(data.schema.metadata or {})
        meta[KIND] = kind
        self.data = data.replace_schema_metadata(meta)   # no copy of the columns
        self.contained = []
        if data.nbytes < _PLACE_MIN:
            mock = pa.MockOutputStream()   # counts the bytes, copies none
            self._write(mock)
            self.size = mock.size()
            return
        dry = _DryRun()
        self._write(pa.PythonFile(dry, mode="w"))
        self.size = dry.pos
        shift = dry.best_shift()
        if shift:
            before = self.data.schema.serialize().size
            meta[_PAD] = _pad_for(self.data.schema, shift)
            self.data = data.replace_schema_metadata(meta)
            self.size += self.data.schema.serialize().size - before

    def _write(self, sink: pa.NativeFile) -> None:
        import pyarrow as pa
        with pa.ipc.new_stream(sink, self.data.schema) as writer:
            if isinstance(self.data, pa.RecordBatch):
                writer.write_batch(self.data)
            else:
                writer.write_table(self.data)

    def to_bytes(self) -> bytes:
        import pyarrow as pa
        out = pa.BufferOutputStream()
        self._write(out)
        return bytes(out.getvalue().to_pybytes())

    def stream_size(self) -> int:
        return self.size

    def write_into(self, dest: memoryview) -> None:
        self._write(_sink(dest))


def _sink(dest: memoryview) -> pa.FixedSizeBufferWriter:
    """A writer into ``dest`` that copies each buffer from _PARALLEL_MIN bytes on
    _COPY_THREADS threads (pyarrow's CPU pool): a put of a 1 GiB table takes 76 ms
    instead of 146 (two cores), and a single copy under ~200 MB stays on one core at
    ~7.7 GB/s (glibc's non-temporal stores start at that size on such machines)."""
    import pyarrow as pa
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(dest))
    if dest.nbytes >= _PARALLEL_MIN and _COPY_THREADS > 1:
        sink.set_memcopy_threads(_COPY_THREADS)
        sink.set_memcopy_threshold(_PARALLEL_MIN)
    return sink


def _copy_threads() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


_PARALLEL_MIN = 4 << 20
_COPY_THREADS = _copy_threads()


class _DryRun:
    """A sink for pyarrow's stream writer that copies nothing: it notes where each large
    buffer would land in the stream and where its source lies."""

    def __init__(self) -> None:
        self.pos = 0
        self.large: list[tuple[int, int, int]] = []   # (position, source address, bytes)
        self.closed = False

    def write(self, data: bytes | memoryview | pa.Buffer) -> None:
        n = len(data)
        if n >= _OUT_OF_BAND_MIN and hasattr(data, "address"):
            self.large.append((self.pos, data.address, n))
        self.pos += n

    def best_shift(self) -> int:
        """How far to move the whole body (a multiple of 8, under a page) so that most
        bytes land 64-byte aligned at their source's offset within a page, rounded down
        to 64 bytes: the copy then runs at memcpy speed."""
        votes: dict[int, int] = {}
        for pos, address, n in self.large:
            shift = (((address % _PAGE) & ~(ALIGN - 1)) - pos) % _PAGE
            votes[shift] = votes.get(shift, 0) + n
        return max(votes, key=votes.__getitem__) if votes else 0

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos


def _pad_for(schema: pa.Schema, shift: int) -> bytes:
    """A value for the schema's padding key that makes its message ``shift`` bytes
    longer, modulo a page (flatbuffers round strings up: a few lengths are tried)."""
    base = schema.serialize().size
    for n in range(max(0, shift - 48), shift + 64):
        grown = schema.with_metadata({**schema.metadata, _PAD: b" " * n}).serialize().size
        if (grown - base) % _PAGE == shift:
            return b" " * n
    return b""


_ZEROS = bytes(_PAGE)
_SCHEMAS: dict[int, tuple[pa.Schema, int]] = {}


def _one_value(data: pa.Buffer) -> pa.Array:
    """A large_binary array of one value: ``data`` (a pyarrow Buffer), not copied."""
    import pyarrow as pa
    offsets = pa.py_buffer(_OFFSETS_OF.pack(0, data.size))
    return pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, data])


def _pickle_schema(n: int) -> tuple[pa.Schema, int]:
    """The schema of a pickle5 stream with ``n`` buffers, and where its body starts
    (the bytes of the schema message and of the batch's metadata): the same for every
    stream with ``n`` buffers, so it is measured once, on empty values."""
    got = _SCHEMAS.get(n)
    if got is None:
        import pyarrow as pa
        names = ["pickle"] + [f"{p}{i}" for i in range(n) for p in ("pad", "buffer")]
        schema = pa.schema([pa.field(name, pa.large_binary(), nullable=False) for name in names],
                           metadata={KIND: b"pickle5"})
        empty = [_one_value(pa.py_buffer(b"")) for _ in names]
        mock = pa.MockOutputStream()
        with pa.ipc.new_stream(mock, schema) as writer:
            writer.write_batch(pa.RecordBatch.from_arrays(empty, schema=schema))
        got = _SCHEMAS[n] = (schema, mock.size() - _EOS - _OFFSETS * len(names))
    return got


def _is_plain(value: Any, depth: int = 0) -> bool:
    t = type(value)
    if t in _PLAIN:
        return True
    if depth > 2 or t not in _PLAIN_CONTAINERS or len(value) > 16:
        return False
    if t is dict:
        return all(type(k) in _PLAIN and _is_plain(v, depth + 1) for k, v in value.items())
    return all(_is_plain(v, depth + 1) for v in value)


def serialize(value: object) -> Serialized:
    """Serialize ``value``; raises TypeError naming the value when it cannot be pickled."""
    if _is_plain(value):
        return PickledValue(pickle.dumps(value, 5), [], [])
    arrow = _as_arrow(value)
    if arrow is not None:
        return arrow
    buffers: list[memoryview] = []
    contained: list[bytes] = []
    outer = getattr(_collect, "refs", None)
    _collect.refs = contained

    def on_buffer(buf: pickle.PickleBuffer) -> bool:
        try:
            raw = buf.raw()
        except BufferError:  # non-contiguous: let pickle copy it in band
            return True
        if raw.nbytes < _OUT_OF_BAND_MIN:
            return True      # cheaper copied than framed
        buffers.append(raw)
        return False

    try:
        pickled: bytes | None = None
        np = sys.modules.get("numpy")
        if np is not None and type(value) is np.ndarray and not value.dtype.hasobject:  # type: ignore[attr-defined]
            # An array of plain data: pickle's own Pickler (~7 us where cloudpickle's
            # takes ~18); cloudpickle below for a dtype pickle cannot name.
            try:
                pickled = pickle.dumps(value, 5, buffer_callback=on_buffer)
            except Exception:   # noqa: BLE001 - cloudpickle says what is wrong, if anything
                buffers.clear()
        if pickled is None:
            pickled = cloudpickle.dumps(value, protocol=5, buffer_callback=on_buffer)
    except Exception as exc:
        if "'generator'" in str(exc):   # the value, or one inside it
            hint = ("Arguments and results must be picklable by cloudpickle, and a "
                    "generator is not: pass list(gen) instead, or "
                    "make the generator inside the task (a task that yields its items is "
                    "a generator task: num_returns=\"streaming\").")
        else:
            hint = ("Arguments and results must be picklable by cloudpickle; pass a plain "
                    "value, or create the unpicklable object (lock, socket, open file) "
                    "inside the task instead.")
        raise TypeError(f"could not serialize {_describe(value)}: {type(exc).__name__}: "
                        f"{exc}. {hint}") from exc
    finally:
        _collect.refs = outer
    if len(buffers) == 1 and pickled not in _ARRAYS:
        _note_array(pickled, value, buffers[0], unpickled=False)
    return PickledValue(pickled, buffers, contained)


# An ndarray's pickle (its data out of band) -> (dtype, shape, order): how numpy's own
# unpickling (numpy's _frombuffer) makes the array over its buffer. A get then makes it
# with frombuffer + reshape, ~30 us instead of ~100 us through pickle.loads with the
# caches cold (right after the copy of a large put). Learnt from the arrays this process
# pickles and unpickles: the same pickle bytes make the same array. Any thread adds to
# it (one dict operation each; two threads learning the same bytes learn the same thing).
_ARRAYS: dict[bytes, tuple[np.dtype, tuple[int, ...], str]] = {}
_ARRAYS_MAX = 256


def _note_array(pickled: bytes, value: Any, buffer: memoryview, *, unpickled: bool) -> None:
    """Learn ``pickled`` when ``value`` is a plain ndarray that is exactly ``buffer``'s
    bytes, strides included: its pickle, read with that buffer, makes it again.
    ``unpickled``: value is what numpy's unpickling made (else the array pickled, whose
    size-1 axes' strides numpy's choice of order may change: such arrays are learnt
    where they are read)."""
    np = sys.modules.get("numpy")
    if np is None or type(value) is not np.ndarray or len(_ARRAYS) >= _ARRAYS_MAX:
        return
    flags = value.flags
    if value.nbytes != buffer.nbytes or not (flags.c_contiguous or flags.f_contiguous) \
            or value.ctypes.data != np.frombuffer(buffer, np.uint8).ctypes.data \
            or (flags.c_contiguous and flags.f_contiguous and value.ndim > 1 and not unpickled):
        return
    for order in ("C", "F"):
        if np.frombuffer(buffer, value.dtype).reshape(value.shape, order=order).strides \
                == value.strides:
            _ARRAYS[bytes(pickled)] = (value.dtype, value.shape, order)
            return


def _as_arrow(value: object) -> ArrowValue | None:
    """Arrow data, and DataFrames that convert to Arrow without loss, as ArrowValues
    (looked up only where the process has imported pyarrow or pandas)."""
    # In sys.modules does not mean imported: another thread may be importing it (a put
    # of an array imports pyarrow to write it). The import statement waits for that.
    if "pyarrow" in sys.modules:
        import pyarrow as pa
        if isinstance(value, pa.Table):
            return ArrowValue(value, b"table")
        if isinstance(value, pa.RecordBatch):
            return ArrowValue(value, b"record_batch")
        if isinstance(value, pa.ChunkedArray):
            return ArrowValue(pa.table({"array": value}), b"chunked_array")
        if isinstance(value, pa.Array):
            return ArrowValue(pa.table({"array": value}), b"array")
    if "pandas" in sys.modules:
        import pandas as pd
    else:
        pd = None
    if pd is not None and type(value) is pd.DataFrame:
        table = _frame_as_table(value)
        if table is not None:
            return ArrowValue(table, b"pandas")
    return None


def _frame_as_table(df: pd.DataFrame) -> pa.Table:
    """The DataFrame as an Arrow table when it comes back from one exactly (dtypes,
    index, column names); None otherwise (it is pickled instead)."""
    import pandas as pd
    cols = df.columns
    if df.attrs or type(cols) is not pd.Index or cols.name is not None or not cols.is_unique \
            or not all(type(c) is str for c in cols):
        return None
    if not all(_lossless(t) for t in df.dtypes):
        return None
    index = df.index
    if type(index) is not pd.RangeIndex and not (
            type(index) is pd.Index and _lossless(index.dtype)
            and (index.name is None or (type(index.name) is str and index.name not in cols))):
        return None
    import pyarrow as pa
    keep_index = type(index) is not pd.RangeIndex   # a RangeIndex is kept as metadata
    try:
        schema = pa.Schema.from_pandas(df, preserve_index=True if keep_index else None)
    except (pa.ArrowException, TypeError, ValueError):
        return None
    columns = [df[name] for name in cols] + ([index] if keep_index else [])
    try:
        # Column by column: numbers stay in the DataFrame's memory (from_pandas copied
        # them: 330 ms for 10 columns of 10 million rows), and NaN stays NaN.
        return pa.Table.from_arrays([_column_array(c) for c in columns], schema=schema)
    except (pa.ArrowException, TypeError, ValueError):
        try:
            return pa.Table.from_pandas(df, preserve_index=True if keep_index else None,
                                        nthreads=1)
        except (pa.ArrowException, TypeError, ValueError):
            return None


def _column_array(values: pd.Series | pd.Index) -> pa.Array:
    """A Series or Index as Arrow data: numpy numbers without a copy (booleans are
    packed into bits), Arrow-backed ones as they are."""
    import numpy as np
    import pyarrow as pa
    if isinstance(values.dtype, np.dtype):
        return pa.array(values.to_numpy(), from_pandas=False)
    return pa.array(values)


def _lossless(dtype: np.dtype | pd.api.extensions.ExtensionDtype) -> bool:
    """A column dtype that comes back from Arrow as it was: numpy booleans and numbers
    in native byte order (not float16), and pandas' Arrow-backed dtypes (ArrowDtype,
    and strings stored in Arrow: pandas 3's default ``str``)."""
    import numpy as np
    import pandas as pd
    if isinstance(dtype, np.dtype):
        return dtype.byteorder in "=|" and (
            dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize >= 4))
    # Arrow strings come back as such from pandas 3 on (pandas 2 makes them python ones).
    return isinstance(dtype, pd.ArrowDtype) or (
        isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow"
        and int(pd.__version__.split(".")[0]) >= 3)


def note_contained_ref(object_id: bytes) -> None:
    """Called by ObjectRef.__reduce__: the ref is pickled inside the value being serialized."""
    refs = getattr(_collect, "refs", None)
    if refs is not None:
        refs.append(object_id)


def deserialize(data: bytes | memoryview, what: str = "a value") -> Any:
    """The value of an inline form or an Arrow stream (``what`` names it in errors).
    Raises DeserializationError naming the cause: a stream that does not parse, a class
    this process cannot import, a __reduce__ or __setstate__ that raised (the original
    error as __cause__)."""
    view = memoryview(data)
    if view[:4] == STREAM_MAGIC:
        return parse(view, what).value()
    try:
        return pickle.loads(view)
    except Exception as exc:
        # Bare, the user's error (RuntimeError from a __reduce__, ModuleNotFoundError)
        # reached get() with nothing saying that a result failed to unpickle, or where.
        raise deserialization_error(exc, what, "this process") from exc


class Parsed:
    """An Arrow stream, parsed: value() builds the value over the stream's memory. A
    reader keeps it with its map, so a second get of the object parses nothing."""

    __slots__ = ("kind", "data", "what", "ready")

    def __init__(self, kind: bytes | None, data: list[memoryview] | pa.Table | pa.RecordBatch,
                 what: str, ready: Any = None) -> None:
        self.kind = kind   # orchestra.kind
        self.data = data   # pickle5: [pickle, pad0, buffer0, ...]; else the table or batch
        self.what = what
        # A shorter way to the value, when this process knows one: an ndarray's
        # (dtype, shape, order) (_ARRAYS), a DataFrame's frames.Ready.
        self.ready = ready

    def value(self) -> Any:
        ready = self.ready
        try:
            if self.kind == b"pickle5":
                if ready is not None:
                    import numpy as np
                    dtype, shape, order = ready
                    return np.frombuffer(self.data[2], dtype).reshape(shape, order=order)
                value = pickle.loads(self.data[0], buffers=self.data[2::2])
                numpy = sys.modules.get("numpy")
                if len(self.data) == 3 and numpy is not None and type(value) is numpy.ndarray:
                    self._learn_array(value)   # other values: nothing to learn, each get
                return value
            if ready is not None:
                return frames.build(ready)
            if self.kind == b"pandas":
                df, self.ready = frames.convert(self.data)
                return df
            return _from_table(self.data, self.kind)
        except Exception as exc:
            raise deserialization_error(exc, self.what, "this process") from exc

    def _learn_array(self, value: object) -> None:
        pickled = bytes(self.data[0])
        if pickled not in _ARRAYS:
            _note_array(pickled, value, self.data[2], unpickled=True)
        self.ready = _ARRAYS.get(pickled)


_SCHEMA_CACHE: dict[bytes, pa.Schema] = {}


def parse(view: memoryview, what: str) -> Parsed:
    """Parse and validate the Arrow stream in ``view`` (no copy of its data);
    DeserializationError naming ``what`` when it does not parse."""
    try:
        columns = read_pickle5(view)
    except (ValueError, IndexError, struct.error) as exc:
        raise _unreadable(what, exc) from exc
    if columns is not None:
        return Parsed(b"pickle5", columns, what,
                      _ARRAYS.get(bytes(columns[0])) if len(columns) == 3 else None)
    import pyarrow as pa
    import pyarrow.ipc  # noqa: F401 - pa.ipc
    buf = pa.py_buffer(view)
    try:
        reader = pa.BufferReader(buf)
        schema = _schema(pa.ipc.read_message(reader))
        meta = schema.metadata or {}
        kind = meta.get(KIND)
        if kind == b"pickle5":
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(reader), schema)
            batch.validate(full=True)   # one row: checks every offset against its data
            return Parsed(kind, [_value_of(column) for column in batch.columns], what)
        data = _read_batches(buf, reader, schema, meta, kind)
        return Parsed(kind, data, what, frames.ready(data) if kind == b"pandas" else None)
    except (pa.ArrowException, OSError, ValueError, IndexError, EOFError) as exc:
        raise _unreadable(what, exc) from exc


def _unreadable(what: str, exc: BaseException) -> DeserializationError:
    return DeserializationError(
        f"could not deserialize {what} in this process (pid={os.getpid()}): its data is "
        f"not a valid Arrow IPC stream ({type(exc).__name__}: {exc}). The object's bytes "
        "were changed after it was written: put it again.")




def _read_batches(buf: pa.Buffer, reader: pa.BufferReader, schema: pa.Schema,
                  meta: dict[bytes, bytes], kind: bytes | None) -> pa.Table | pa.RecordBatch:
    """The table (the batch, for a record_batch stream) after the schema message, with
    the schema's metadata less orchestra's own keys. Message by message: pyarrow's
    stream reader costs ~50 us more in Python around it; it reads streams with
    dictionaries (their batches come before the data's)."""
    import pyarrow as pa
    own = {k: v for k, v in meta.items() if k not in _OWN_KEYS}
    clean = schema.with_metadata(own) if own else schema.remove_metadata()
    if any("dictionary<" in str(field.type) for field in schema):
        stream = pa.ipc.open_stream(buf)
        data = stream.read_next_batch() if kind == b"record_batch" else stream.read_all()
        data.validate()
        return data.replace_schema_metadata(own or None)
    batches = []
    while True:
        try:
            message = pa.ipc.read_message(reader)
        except EOFError:
            break
        batch = pa.ipc.read_record_batch(message, clean)
        batch.validate()
        if kind == b"record_batch":
            return batch
        batches.append(batch)
    if kind == b"record_batch":
        raise ValueError("the stream holds no record batch")
    return pa.Table.from_batches(batches, schema=clean)


def _value_of(column: pa.Array) -> memoryview:
    """The one value of a large_binary column, a view of the stream's bytes (a scalar's
    as_buffer() would copy it)."""
    _, offsets, data = column.buffers()
    start, end = _OFFSETS_OF.unpack_from(offsets)
    return memoryview(data)[start:end] if data is not None else memoryview(b"")


def _schema(message: pa.ipc.Message) -> pa.Schema:
    """The schema of a schema message; pickle5 schemas are parsed once per process."""
    import pyarrow as pa
    key = message.metadata.to_pybytes()
    schema = _SCHEMA_CACHE.get(key)
    if schema is None:
        schema = pa.ipc.read_schema(message)
        if (schema.metadata or {}).get(KIND) == b"pickle5" and len(_SCHEMA_CACHE) < 64:
            _SCHEMA_CACHE[key] = schema
    return schema


def _from_table(table: pa.Table | pa.RecordBatch, kind: bytes | None) -> Any:
    """The value a table (or record batch) read from a stream stands for; a stream of
    another writer: the table itself."""
    import pyarrow as pa
    if kind == b"pandas":
        return frames.convert(table)[0]
    if kind in (None, b"table", b"record_batch"):
        return table
    if kind == b"chunked_array":
        return table.column(0)
    if kind == b"array":
        column = table.column(0)
        return column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks) \
            if column.num_chunks else pa.array([], type=column.type)
    raise ValueError(f"unknown {KIND.decode()} {kind!r}")


def deserialization_error(exc: BaseException, what: str, where: str) -> DeserializationError:
    """The DeserializationError for ``exc``, raised while unpickling ``what`` in ``where``."""
    origin = ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename != __file__ and not f.filename.startswith("<frozen")]
    if frames:
        origin = f" (raised in {frames[-1].name}() at {frames[-1].filename}:{frames[-1].lineno})"
    return DeserializationError(
        f"could not deserialize {what} in {where} (pid={os.getpid()}): {type(exc).__name__}: "
        f"{exc}{origin}. Unpickling imports the module of each class in the value and runs "
        "its __reduce__/__setstate__ in the process that reads it: define the classes in a "
        "module that process can import, and make their unpickling work there.")


def dumps_function(fn: Callable[..., object]) -> bytes:
    from .code_source import dumps_by_value
    try:
        # File names and source lines kept, for remote tracebacks (_objects/code_source.py).
        by_value = dumps_by_value(fn)
    except Exception as exc:
        raise TypeError(
            f"could not serialize remote function {_function_name(fn)}: {type(exc).__name__}: "
            f"{exc}. A remote function must be picklable by cloudpickle: move objects "
            "it captures (locks, clients, open files) inside the function.") from exc
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "<locals>" not in qualname \
            and _find_function(module, qualname) is fn:
        # By name, so the worker imports the user's module: @remote puts a RemoteFunction
        # in the module where the function was, which hid it from cloudpickle's own
        # by-name check, and a copy by value lost the file and source lines of remote
        # tracebacks ("<dynamic-code>") and copied the module's globals.
        return pickle.dumps(_FunctionByName(module, qualname, by_value), protocol=5)
    return by_value


def _find_function(module: str, qualname: str) -> Any:
    """The function at module.qualname in this process, unwrapped from its RemoteFunction."""
    import sys

    obj: object = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    # A RemoteFunction says what it wraps (asked by name: this module is imported by
    # _remote_function, and importing it back would make a cycle).
    wrapped = getattr(obj, "orchestra_wrapped", None)
    return wrapped() if callable(wrapped) else obj


class _FunctionByName:
    __slots__ = ("module", "qualname", "by_value")

    def __init__(self, module: str, qualname: str, by_value: bytes) -> None:
        self.module, self.qualname, self.by_value = module, qualname, by_value

    def __reduce__(self) -> tuple[Any, ...]:
        return (_load_function, (self.module, self.qualname, self.by_value))


def _load_function(module: str, qualname: str, by_value: bytes) -> Any:
    import importlib
    try:
        importlib.import_module(module)
        fn = _find_function(module, qualname)
    except Exception:  # noqa: BLE001 - not importable here: the copy made by value
        fn = None
    return fn if callable(fn) else cloudpickle.loads(by_value)


def dumps_exception(exc: BaseException) -> bytes:
    """Pickle an exception for an error object; falls back to its text when it can't."""
    try:
        data = cloudpickle.dumps(exc, protocol=5)
        pickle.loads(data)  # the reader must be able to rebuild it too
        return data
    except Exception:
        from ..exceptions import TaskError
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if isinstance(exc, TaskError):
            fallback: BaseException = TaskError(exc.function_name, exc.traceback_str, None, exc.pid)
        else:
            fallback = RuntimeError(f"unpicklable exception {text}")
        return cloudpickle.dumps(fallback, protocol=5)


def _function_name(fn: object) -> str:
    """``module.qualname()`` of a function (its repr for another callable)."""
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(qualname, str):
        return _describe(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{qualname}()" if module else f"{qualname}()"


def _describe(value: object) -> str:
    r = repr(value)
    if len(r) > 120:
        r = r[:117] + "..."
    return f"{type(value).__qualname__} {r}"
