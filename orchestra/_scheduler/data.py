"""An object's value as the scheduler knows it: where its bytes are (inline in a
message, a segment of a node's store, a file it was spilled to) or that it stands for
an error, and the refs it holds. No I/O, no protocol.

    a frame with ObjectData (TaskDone, Objects, GeneratorItem, a node's report)
        --> the head's edge (_head/inbound.py: data_in) --> Data(..., wire=that message)
        --> sealed, pushed, handed to tasks as arguments by the scheduler
        --> the edge writes ``wire`` as it came (_head/outbound.py: data_out), or a
            message made from the fields when the scheduler made the value (an error, a
            copy on another node, a value spilled to a file, a placement group's "ready")

Why the message rides along: an ObjectData made again from the fields costs ~3.5 us
(inline) to ~5.6 us (in a segment) more than the message kept (measured on this
machine), on every result a head forwards; the scheduler never reads ``wire``, and a
value it makes has none. Reading the fields it needs costs the edge ~1-2 us per value.
A received inline value's bytes stay in ``wire`` (reading them copies them: ~70 us for
100 KB); an error's pickled exception is read into ``payload`` (the tasks it is an
argument of fail with it), as are the bytes of the values the scheduler makes.

Segment and Data are NamedTuples (immutable, compared by value: instructions.py says
what they cost). A value moved (spilled, its copy made the primary one) is a new Data.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

# Data.kind: where the value is.
INLINE = "inline"     # its bytes travel in the messages that carry it
SEGMENT = "segment"   # in shared memory (or spilled to a file), on one node
ERROR = "error"       # an exception a get raises (TaskError, ObjectLostError, ...)


class Segment(NamedTuple):
    """Where a value's bytes are on node ``node_id``: the store's segment ``name``
    (``size`` bytes of the object in a file of ``capacity``), or the spill file
    ``path`` once the store moved it to disk. ``allocated``, ``reused``: the writer's
    notes, carried for the readers' maps."""

    name: str
    size: int
    node_id: int
    capacity: int = 0
    path: str = ""
    allocated: int = 0
    reused: bool = False

    def key(self) -> tuple[int, str]:
        """The node and the store's key for it (what FreeSegment names)."""
        return (self.node_id, self.path or self.name)


class Data(NamedTuple):
    """Object ``object_id``'s value: ``kind`` INLINE, SEGMENT (``segment``) or ERROR;
    ``contained``: the ids of refs pickled inside it (held while it lives). ``payload``:
    an error's pickled exception (the tasks it is an argument of fail with it), or the
    bytes of an inline value the scheduler made (a received one's stay in ``wire``);
    ``wire``: the message a received value came in, forwarded unchanged."""

    object_id: bytes
    kind: str
    segment: Segment | None = None
    contained: Sequence[bytes] = ()
    payload: bytes = b""
    wire: Any = None


def inline(object_id: bytes, value: bytes, contained: Sequence[bytes] = ()) -> Data:
    """A value the scheduler made, whose bytes travel in messages."""
    return Data(object_id, INLINE, None, contained, value)


def error_value(object_id: bytes, exc: bytes, contained: Sequence[bytes] = ()) -> Data:
    """An error value (``exc``: the pickled exception a get raises)."""
    return Data(object_id, ERROR, None, contained, exc)


def at(object_id: bytes, segment: Segment, contained: Sequence[bytes] = ()) -> Data:
    """The value in ``segment`` (a copy, or where the store moved it)."""
    return Data(object_id, SEGMENT, segment, contained)


def error_of(data: Data) -> bytes:
    """The pickled exception of an error value; b"" for any other."""
    return data.payload if data.kind == ERROR else b""
