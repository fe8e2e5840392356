"""The frame decoder (orchestra/_protocol/wire.py FrameDecoder): whatever way a stream of
frames is cut into reads, the same frames come out, in order, each once; a read's buffer
may be reused by the reader right after (decoded messages hold none of it); bad lengths
and kinds are refused."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestra._protocol import pb
from orchestra._protocol import wire as _wire

pytestmark = pytest.mark.timeout(60)


def objects_frame(i: int, size: int) -> tuple[bytes, pb.Objects]:
    msg = pb.Objects(objects=[pb.ObjectData(object_id=i.to_bytes(28, "big"),
                                            inline=bytes([i % 251]) * size)])
    return _wire.encode(_wire.OBJECTS, msg), msg


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 200_000), min_size=1, max_size=12),
       cuts=st.lists(st.integers(1, 300_000), max_size=40), reuse=st.booleans())
def test_any_cutting_of_the_stream_gives_the_same_frames(sizes: list[int], cuts: list[int],
                                                         reuse: bool) -> None:
    frames = [objects_frame(i, n) for i, n in enumerate(sizes)]
    stream = b"".join(f for f, _ in frames)
    dec = _wire.FrameDecoder()
    got: list[tuple[int, object]] = []
    scratch = bytearray(len(stream) + 1)   # one buffer every read goes into, as a socket's
    pos, k = 0, 0
    while pos < len(stream):
        n = min(cuts[k % len(cuts)] if cuts else len(stream), len(stream) - pos)
        k += 1
        if reuse:
            scratch[:n] = stream[pos:pos + n]
            got.extend(dec.feed(memoryview(scratch)[:n]))
            scratch[:n] = b"\xff" * n   # the reader's next read overwrites it
        else:
            got.extend(dec.feed(stream[pos:pos + n]))
        pos += n
    assert got == [(_wire.OBJECTS, m) for _, m in frames]
    assert dec.feed(b"") == []


def test_one_byte_at_a_time() -> None:
    frames = [objects_frame(i, i * 7) for i in range(5)]
    dec = _wire.FrameDecoder()
    got = []
    for b in b"".join(f for f, _ in frames):
        got.extend(dec.feed(bytes([b])))
    assert got == [(_wire.OBJECTS, m) for _, m in frames]


@pytest.mark.parametrize("cut", [1, 3, 4, 6])
def test_a_bad_length_or_kind_is_refused_wherever_the_read_ends(cut: int) -> None:
    for bad, why in ((b"\x00\x00\x00\x00" + b"x" * 8, "bad frame length 0"),
                     (b"\x02\x00\x00\x00\xfe\x00", "unknown frame kind 254")):
        dec = _wire.FrameDecoder()
        with pytest.raises(_wire.ProtocolError, match=why):
            dec.feed(bad[:cut])
            dec.feed(bad[cut:])
