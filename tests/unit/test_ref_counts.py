"""RefCounts: the changes of one process's refs the head must learn, around each frame
its process sends; a driver's puts (seal) before all of them."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestra._objects.refs import _SEAL_BATCH, RefCounts
from orchestra._protocol import pb
from orchestra._protocol import wire as _wire


def _frames(data: bytes) -> list[tuple[int, object]]:
    return _wire.FrameDecoder().feed(data)


def _counts() -> RefCounts:
    return RefCounts(lambda oid: True)   # the head holds a count for every id here


def test_puts_wait_for_a_batch_then_travel_first_with_holds_before_the_frame_and_releases_after():
    refs = _counts()
    with refs.lock:
        full = [refs.seal(pb.ObjectData(object_id=bytes([i]) * 16, inline=b"v"))
                for i in range(_SEAL_BATCH)]
    assert full == [False] * (_SEAL_BATCH - 1) + [True]
    refs.add(b"a" * 16, counted=False)   # an increment
    refs.add(bytes([0]) * 16, counted=True)
    refs.remove(bytes([0]) * 16)          # the first put's last ref goes: a decrement
    assert refs.pending()
    pre, post = refs.take_frames()
    assert not refs.pending()
    kinds = [(k, m) for k, m in _frames(pre + b"" + post)]
    assert [k for k, _ in kinds] == [_wire.OBJECTS, _wire.REF_DELTA, _wire.REF_DELTA]
    assert [d.object_id[0] for d in kinds[0][1].objects] == list(range(_SEAL_BATCH))
    assert list(kinds[1][1].incr) == [b"a" * 16] and not kinds[1][1].decr
    assert list(kinds[2][1].decr) == [bytes([0]) * 16] and not kinds[2][1].incr
    assert refs.take_frames() == (b"", b"")


ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 7)),
    st.tuples(st.just("copy"), st.integers(0, 7)),
    st.tuples(st.just("drop"), st.integers(0, 7)),
    st.tuples(st.just("send"), st.just(0)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_head_hears_of_each_put_before_any_release_of_it_and_counts_right(seq):
    # What the head reads, frame after frame, as a driver puts, copies and drops refs
    # and sends other frames in between: each object sealed before any change of its
    # count, and the counts the head ends with are those the process holds.
    refs = _counts()
    held: dict[bytes, int] = {}
    made: set[bytes] = set()   # a put's id is new
    stream = b""
    for op, i in seq:
        oid = bytes([i + 1]) * 16
        if op == "put" and oid not in made:
            made.add(oid)
            with refs.lock:
                if refs.seal(pb.ObjectData(object_id=oid, inline=b"v")):
                    pre, post = refs.take_frames()
                    stream += pre + post
            refs.add(oid, counted=True)
            held[oid] = 1
        elif op == "copy" and oid in held:
            refs.add(oid, counted=False)
            held[oid] += 1
        elif op == "drop" and oid in held:
            refs.remove(oid)
            held[oid] -= 1
            if not held[oid]:
                del held[oid]
        elif op == "send":
            pre, post = refs.take_frames()
            stream += pre + _wire.encode(_wire.REF_DELTA, pb.RefDelta()) + post
    pre, post = refs.take_frames()
    stream += pre + post
    sealed: set[bytes] = set()
    count: dict[bytes, int] = {}
    for kind, msg in _frames(stream):
        if kind == _wire.OBJECTS:
            for d in msg.objects:
                assert d.object_id not in sealed
                sealed.add(d.object_id)
                count[d.object_id] = 1   # the put's own ref, counted at its seal
        else:
            for oid in msg.incr:
                assert oid in sealed, "a hold of an object the head has not heard of"
                count[oid] += 1
            for oid in msg.decr:
                assert oid in sealed, "a release before the object's seal"
                count[oid] -= 1
    assert {o: n for o, n in count.items() if n} == {o: 1 for o in held}


@pytest.mark.parametrize("n", [1, _SEAL_BATCH - 1])
def test_puts_short_of_a_batch_are_pending_until_taken(n):
    refs = _counts()
    with refs.lock:
        assert not any(refs.seal(pb.ObjectData(object_id=bytes([i]) * 16)) for i in range(n))
    assert refs.pending()
    pre, _ = refs.take_frames()
    (kind, msg), = _frames(pre)
    assert kind == _wire.OBJECTS and len(msg.objects) == n
