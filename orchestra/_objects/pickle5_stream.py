"""A pickle5 stream (``serialization``'s own kind of Arrow IPC stream) read without
pyarrow: the reader then touches a few hundred bytes of code and data (the first get
after a large put runs with the caches the copy just flushed: ~120 us through pyarrow's
reader, ~50 us here), and a worker reading numpy arguments never imports pyarrow (~140 ms
on first use). The two messages' flatbuffers are read field by field (Arrow's
format/Message.fbs and Schema.fbs) and checked as pyarrow's full validation checks a
one-row batch: every buffer inside the body, each column's offsets inside its data.
Streams of other kinds are left to pyarrow (read_pickle5 returns None)."""
from __future__ import annotations

import struct

STREAM_MAGIC = b"\xff\xff\xff\xff"   # an Arrow IPC message's continuation marker
KIND = b"orchestra.kind"               # the schema's metadata key: what the stream holds

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U8 = struct.Struct("<B")
_PAIR = struct.Struct("<qq")
_MESSAGE_SCHEMA, _MESSAGE_BATCH = 1, 3      # MessageHeader
_LARGE_BINARY = 19                          # Type
_P5_SCHEMAS: dict[bytes, int] = {}          # schema flatbuffer -> columns, or 0: another kind


class _Table:
    """A flatbuffer table: ``buf`` from ``pos``."""

    __slots__ = ("buf", "pos", "vt", "vt_len")

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vt = pos - _I32.unpack_from(buf, pos)[0]
        if not 0 <= self.vt < len(buf):
            raise ValueError("a flatbuffer table's vtable lies outside its message")
        self.vt_len = struct.unpack_from("<H", buf, self.vt)[0]

    def field(self, i: int) -> int:
        """The position of field ``i``, 0 when absent."""
        at = 4 + 2 * i
        if at + 2 > self.vt_len:
            return 0
        off = struct.unpack_from("<H", self.buf, self.vt + at)[0]
        return self.pos + off if off else 0

    def scalar(self, i: int, fmt: struct.Struct, default: int = 0) -> int:
        at = self.field(i)
        return int(fmt.unpack_from(self.buf, at)[0]) if at else default

    def ref(self, i: int) -> int:
        """Where the table, vector or string that field ``i`` points to starts (0: absent)."""
        at = self.field(i)
        return at + _U32.unpack_from(self.buf, at)[0] if at else 0

    def table(self, i: int) -> _Table | None:
        at = self.ref(i)
        return _Table(self.buf, at) if at else None

    def vector(self, i: int) -> tuple[int, int]:
        """(count, position of the first element) of a vector field; (0, 0) when absent."""
        at = self.ref(i)
        return (_U32.unpack_from(self.buf, at)[0], at + 4) if at else (0, 0)

    def string(self, i: int) -> bytes:
        n, at = self.vector(i)
        if at + n > len(self.buf):
            raise ValueError("a string runs past its message")
        return bytes(self.buf[at: at + n])


def _message(view: memoryview, pos: int) -> tuple[_Table, int]:
    """The Message flatbuffer at ``pos`` (its continuation marker) and where its body
    starts."""
    if view[pos: pos + 4] != STREAM_MAGIC:
        raise ValueError(f"no message at byte {pos}")
    size = _I32.unpack_from(view, pos + 4)[0]
    start = pos + 8
    if size <= 0 or start + size > len(view):
        raise ValueError(f"a message of {size} bytes at byte {pos} runs past the stream")
    meta = view[start: start + size]
    return _Table(meta, _U32.unpack_from(meta, 0)[0]), start + size


def _pickle5_columns(message: _Table, schema_bytes: bytes) -> int:
    """How many columns a pickle5 schema has; 0 for a schema of another kind."""
    known = _P5_SCHEMAS.get(schema_bytes)
    if known is not None:
        return known
    if message.scalar(1, _U8) != _MESSAGE_SCHEMA:
        raise ValueError("the stream does not start with a schema")
    schema = message.table(2)
    if schema is None:
        raise ValueError("the schema message has no schema")
    n_meta, at = schema.vector(2)
    kind = None
    for k in range(n_meta):
        pair = _Table(schema.buf, at + 4 * k + _U32.unpack_from(schema.buf, at + 4 * k)[0])
        if pair.string(0) == KIND:
            kind = pair.string(1)
    columns = 0
    if kind == b"pickle5":
        n_fields, at = schema.vector(1)
        for k in range(n_fields):
            field = _Table(schema.buf, at + 4 * k + _U32.unpack_from(schema.buf, at + 4 * k)[0])
            if field.scalar(2, _U8) != _LARGE_BINARY or field.ref(4) or field.vector(5)[0]:
                raise ValueError("a pickle5 stream holds a column that is not large_binary")
        columns = n_fields
        if columns < 1 or columns % 2 == 0:
            raise ValueError(f"a pickle5 stream of {columns} columns")
    if len(_P5_SCHEMAS) < 64:
        _P5_SCHEMAS[schema_bytes] = columns
    return columns


def read_pickle5(view: memoryview) -> list[memoryview] | None:
    """The columns' values of a pickle5 stream, views of ``view``; None for a stream of
    another kind. ValueError, IndexError or struct.error when it does not parse."""
    first, body = _message(view, 0)
    columns = _pickle5_columns(first, bytes(first.buf))
    if not columns:
        return None
    message, body = _message(view, body)
    if message.scalar(1, _U8) != _MESSAGE_BATCH:
        raise ValueError("the schema is not followed by a record batch")
    batch = message.table(2)
    body_len = message.scalar(3, _I64)
    if batch is None or body_len < 0 or body + body_len > len(view):
        raise ValueError("the record batch's body runs past the stream")
    if batch.scalar(0, _I64) != 1 or batch.field(3):
        raise ValueError("a pickle5 batch has one row, uncompressed")
    n_nodes, nodes = batch.vector(1)
    n_bufs, bufs = batch.vector(2)
    meta = batch.buf
    if n_nodes != columns or n_bufs != 3 * columns or bufs + 16 * n_bufs > len(meta) \
            or nodes + 16 * n_nodes > len(meta):
        raise ValueError(f"a batch of {n_nodes} columns and {n_bufs} buffers for "
                         f"{columns} large_binary columns")
    out = []
    for c in range(columns):
        if _PAIR.unpack_from(meta, nodes + 16 * c) != (1, 0):
            raise ValueError("a pickle5 column holds one value, not null")
        offs_at, offs_len = _PAIR.unpack_from(meta, bufs + 16 * (3 * c + 1))
        data_at, data_len = _PAIR.unpack_from(meta, bufs + 16 * (3 * c + 2))
        if not (0 <= offs_at and offs_len >= 16 and offs_at + 16 <= body_len
                and 0 <= data_at and 0 <= data_len and data_at + data_len <= body_len):
            raise ValueError("a buffer lies outside the record batch's body")
        start, end = _PAIR.unpack_from(view, body + offs_at)
        if not 0 <= start <= end <= data_len:
            raise ValueError(f"a value's offsets {start}..{end} lie outside its "
                             f"{data_len} bytes")
        out.append(view[body + data_at + start: body + data_at + end])
    return out


