"""Arrow streams of pickle5 values written from a template: the bytes pyarrow wrote for
the last value of the same layout, less the value's own data.

A pickle5 stream (serialization.py) is its schema message, one record batch's metadata,
then the body: each column's offsets, the pickle, each pad and buffer. For a given
layout (the pickle's length, each buffer's length and pad) every byte but the pickle's
and the buffers' is the same. pyarrow writes a stream in ~20 us, its data copied in a
few; a 100 KB array's put then pays more for the writer than for the copy. So the
first stream of a layout is written by pyarrow and read back into a Template (its
other bytes, ~1 KB, and where the data goes); the next of that layout copies those
bytes and the data. A template is kept only when the data read back lies exactly
where the layout says: a pyarrow that lays streams out otherwise is never trusted.

The cache is a plain dict that any thread reads and adds to (one operation each; two
threads making the same template make equal ones), emptied when it reaches
_TEMPLATES_MAX layouts.
"""
from __future__ import annotations

from collections.abc import Sequence

Layout = tuple[int, tuple[int, ...], tuple[int, ...]]   # pickle, buffer lengths, pads

_TEMPLATES_MAX = 128
# Streams from this size are written by pyarrow alone: the copy outweighs the writer
# (and from 4 MiB pyarrow copies large buffers on threads). Below it a template saves
# ~60-80 us of a 1 MiB array's put (~300 us into fresh memory).
LARGEST = 4 << 20
# learn() checks a region of data up to this size whole; a larger one at its start,
# middle and end (_EDGE bytes each), which a stream laid out otherwise fails as well,
# without two more copies of the data on a put of a new layout.
_CHECK_WHOLE = 64 << 10
_EDGE = 4096


class Template:
    """A stream's bytes other than its data: ``gaps`` (offset, bytes) and ``total``."""

    __slots__ = ("gaps", "pickle_at", "buffers_at", "total")

    def __init__(self, gaps: list[tuple[int, bytes]], pickle_at: int,
                 buffers_at: tuple[int, ...], total: int) -> None:
        self.gaps = gaps
        self.pickle_at = pickle_at
        self.buffers_at = buffers_at
        self.total = total

    def write(self, dest: memoryview, pickled: bytes, buffers: Sequence[memoryview]) -> None:
        for at, chunk in self.gaps:
            dest[at:at + len(chunk)] = chunk
        dest[self.pickle_at:self.pickle_at + len(pickled)] = pickled
        for at, b in zip(self.buffers_at, buffers, strict=True):
            dest[at:at + b.nbytes] = b


_TEMPLATES: dict[Layout, Template] = {}


def find(layout: Layout) -> Template | None:
    return _TEMPLATES.get(layout)


def learn(layout: Layout, written: memoryview, pickled: bytes,
          buffers: Sequence[memoryview], pickle_at: int, buffers_at: tuple[int, ...],
          total: int) -> None:
    """Keep the template of ``written`` (a stream of ``layout`` that pyarrow just wrote)
    if its data lies at ``pickle_at`` and ``buffers_at`` (buffers: flat byte views, as
    PickleBuffer.raw() gives)."""
    regions = [(pickle_at, memoryview(pickled))] + list(zip(buffers_at, buffers, strict=True))
    gaps = []
    pos = 0
    for at, data in sorted(regions, key=lambda r: r[0]):
        if at < pos or at + data.nbytes > total or not _lies_at(written, at, data):
            return   # not the layout this module knows
        if at > pos:
            gaps.append((pos, bytes(written[pos:at])))
        pos = at + data.nbytes
    if pos < total:
        gaps.append((pos, bytes(written[pos:total])))
    if len(_TEMPLATES) >= _TEMPLATES_MAX:
        _TEMPLATES.clear()
    _TEMPLATES[layout] = Template(gaps, pickle_at, buffers_at, total)


def _lies_at(written: memoryview, at: int, data: memoryview) -> bool:
    """Whether ``data`` (a flat byte view) is what ``written`` holds from ``at``: all of
    it when small, else its start, middle and end."""
    n = data.nbytes
    if n <= _CHECK_WHOLE:
        return written[at:at + n].tobytes() == data.tobytes()
    mid = (n // 2) & ~7
    return all(written[at + lo:at + lo + _EDGE].tobytes() == data[lo:lo + _EDGE].tobytes()
               for lo in (0, mid, n - _EDGE))
