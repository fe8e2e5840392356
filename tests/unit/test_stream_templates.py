"""Streams written from a template (stream_templates): byte for byte what pyarrow
writes for the same value, whatever the destination held before, and a template is
never kept for data that does not lie where the layout says; arrays of plain data are
pickled without cloudpickle (no processes, no sockets)."""
from __future__ import annotations

import pickle

import cloudpickle
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestra._objects import stream_templates
from orchestra._objects.serialization import deserialize, serialize

KIB = 1024


def _written(ser, garbage: int) -> bytes:
    """``ser``'s stream written over a buffer full of ``garbage``."""
    size = ser.stream_size()
    dest = bytearray([garbage]) * (size + 4096)
    ser.write_into(memoryview(dest))
    return bytes(dest[:size])


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.one_of(st.integers(64 * KIB, 300 * KIB), st.integers(900 * KIB, 1300 * KIB)),
                    min_size=1, max_size=3),
       shift=st.integers(0, 511), extra=st.binary(max_size=200), seed=st.integers(0, 2**32 - 1))
def test_a_stream_from_a_template_is_what_pyarrow_writes(sizes, shift, extra, seed):
    rng = np.random.default_rng(seed)
    backing = np.zeros(sum(sizes) + 8 * 512 + 64, dtype=np.uint8)
    pos = shift * 8
    arrays = []
    for n in sizes:
        arrays.append(backing[pos:pos + n])
        pos += n + 8
    value = {"arrays": arrays, "extra": extra}
    stream_templates._TEMPLATES.clear()
    backing[:] = rng.integers(0, 256, backing.size, dtype=np.uint8)
    first = serialize(value)
    layout = first._places()[0]
    _written(first, 0xAA)                     # pyarrow writes it, the template is learnt
    if first.stream_size() >= stream_templates.LARGEST:
        assert stream_templates.find(layout) is None
        return
    assert stream_templates.find(layout) is not None

    backing[:] = rng.integers(0, 256, backing.size, dtype=np.uint8)   # same layout, new data
    again = serialize(value)
    assert again._places()[0] == layout
    from_template = _written(again, 0x55)
    stream_templates._TEMPLATES.clear()
    by_pyarrow = _written(serialize(value), 0x33)
    assert from_template == by_pyarrow
    got = deserialize(memoryview(from_template))
    assert got["extra"] == extra
    for a, b in zip(got["arrays"], arrays, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n", [20_000, 300_000], ids=["checked-whole", "checked-at-edges"])
def test_a_template_is_not_kept_when_the_data_lies_elsewhere(n):
    stream_templates._TEMPLATES.clear()
    arr = np.arange(n, dtype=np.float64)
    ser = serialize(arr)
    layout, pickle_at, places, total = ser._places()
    dest = memoryview(bytearray(total))
    ser.write_into(dest)
    stream_templates._TEMPLATES.clear()
    wrong = tuple(p + 8 for p in places)
    stream_templates.learn(layout, dest, ser.pickled, ser.buffers, pickle_at, wrong, total)
    assert stream_templates.find(layout) is None
    stream_templates.learn(layout, dest, ser.pickled, ser.buffers, pickle_at + 8, places, total)
    assert stream_templates.find(layout) is None
    stream_templates.learn(layout, dest, ser.pickled, ser.buffers, pickle_at, places, total)
    assert stream_templates.find(layout) is not None


def test_the_cache_of_templates_stays_bounded():
    stream_templates._TEMPLATES.clear()
    backing = np.ones(70_000 + 8 * 600, dtype=np.uint8)
    for shift in range(0, 8 * 600, 8):   # each page offset (rounded to 64) is a layout
        ser = serialize(backing[shift:shift + 70_000 + shift // 8])
        _written(ser, 0)
        assert len(stream_templates._TEMPLATES) <= stream_templates._TEMPLATES_MAX


@pytest.mark.parametrize("make", [
    lambda: np.arange(30_000, dtype=np.float64),
    lambda: np.arange(30_000, dtype=np.int16).reshape(100, 300, order="F"),
    lambda: np.zeros(20_000, dtype=[("a", "<i8"), ("b", "<f4")]),
    lambda: np.array(["abc", "de"] * 10_000),
    lambda: np.arange(100_000)[::3],
    lambda: np.array(2.5),
])
def test_arrays_of_plain_data_are_pickled_without_cloudpickle(make, monkeypatch):
    arr = make()

    def refuse(*args, **kwargs):
        raise AssertionError("cloudpickle used for an array of plain data")
    monkeypatch.setattr(cloudpickle, "dumps", refuse)
    ser = serialize(arr)
    got = deserialize(memoryview(_written(ser, 0x77)) if ser.buffers else ser.to_bytes())
    assert got.dtype == arr.dtype and got.shape == arr.shape
    np.testing.assert_array_equal(got, arr)


def test_an_array_of_objects_still_goes_through_cloudpickle():
    arr = np.array([lambda x: x + 1, 2], dtype=object)   # a lambda pickle cannot name
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(arr, 5)
    got = deserialize(serialize(arr).to_bytes())
    assert got[0](1) == 2 and got[1] == 2
