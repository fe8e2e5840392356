"""Spare segments made ready ahead (orchestra/_objects/premap.py): real files in a
private directory under /dev/shm, the Premapper's own thread; no cluster."""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orchestra._objects.premap import Premapper
from orchestra._objects.segments import (
    make_session_dir,
    open_segment,
    remove_private_dir,
    segment_path,
)
from orchestra._proto import types_pb2

pytestmark = pytest.mark.timeout(30)

KiB = 1 << 10


@pytest.fixture
def shm_dir() -> Iterator[str]:
    path = make_session_dir("premap")
    yield path
    remove_private_dir(path)


def spare(name: str, capacity: int = 128 * KiB) -> types_pb2.Segment:
    return types_pb2.Segment(name=name, capacity=capacity)


def for_object(seg: types_pb2.Segment, size: int) -> types_pb2.Segment:
    """The spare as a put takes it: its object's size set."""
    taken = types_pb2.Segment()
    taken.CopyFrom(seg)
    taken.size = size
    return taken


def wait_ready(p: Premapper, names: set[str]) -> None:
    deadline = time.monotonic() + 10
    while not names <= set(p.ready):
        assert time.monotonic() < deadline, f"not made ready: {names - set(p.ready)}"
        time.sleep(0.005)


def wait_idle(p: Premapper) -> None:
    """Until the thread has opened (or failed to open) every spare queued."""
    deadline = time.monotonic() + 10
    while p.queue or p.busy:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_a_spare_is_made_and_mapped_ahead_and_its_put_writes_into_the_file(shm_dir: str) -> None:
    p = Premapper(shm_dir)
    p.add([spare("a"), spare("b")], 100 * KiB)
    wait_ready(p, {"a", "b"})
    assert os.path.getsize(segment_path(shm_dir, "a")) == 128 * KiB   # the class's length
    mm = p.take(for_object(spare("a"), 100 * KiB))
    assert mm is not None and len(mm) >= 100 * KiB
    mm[:5] = b"hello"
    mm.close()
    with open(segment_path(shm_dir, "a"), "rb") as f:
        assert f.read(5) == b"hello"
    p.close()
    assert p.ready == {}


def test_a_larger_object_grows_the_map_made_for_a_smaller_one(shm_dir: str) -> None:
    p = Premapper(shm_dir)
    p.add([spare("a")], 20 * KiB)
    wait_ready(p, {"a"})
    mm = p.take(for_object(spare("a"), 120 * KiB))
    assert mm is not None and len(mm) >= 120 * KiB
    mm[120 * KiB - 1:120 * KiB] = b"x"   # every byte of it is writable
    mm.close()
    p.close()


def test_a_spare_the_thread_has_not_reached_is_left_to_the_put(shm_dir: str) -> None:
    p = Premapper(shm_dir)
    with p.cond:   # no thread yet: "a" waits in the queue
        p.queue.append(for_object(spare("a"), 64 * KiB))
    assert p.take(for_object(spare("a"), 64 * KiB)) is None   # the put opens it itself
    p.add([spare("b")], 64 * KiB)   # the thread starts: "a" is no longer its to make
    wait_ready(p, {"b"})
    assert not os.path.exists(segment_path(shm_dir, "a"))
    p.close()


def test_spares_given_back_are_unmapped_and_never_made(shm_dir: str) -> None:
    p = Premapper(shm_dir)
    p.add([spare("a")], 64 * KiB)
    wait_ready(p, {"a"})
    with p.cond:   # (reentrant: the thread cannot take "b" before it is given back)
        p.queue.append(for_object(spare("b"), 64 * KiB))
        p.drop(["a", "b"])
    assert "a" not in p.ready and not p.queue
    time.sleep(0.05)
    assert "b" not in p.ready and not os.path.exists(segment_path(shm_dir, "b"))
    p.close()


def test_a_spare_the_thread_cannot_make_leaves_no_file_and_the_put_opens_it(shm_dir: str) -> None:
    p = Premapper(shm_dir)
    huge = spare("a", capacity=1 << 50)   # no /dev/shm holds it: its allocation fails
    p.add([huge], 1 << 50)
    wait_idle(p)
    assert p.take(for_object(huge, 64 * KiB)) is None
    assert not os.path.exists(segment_path(shm_dir, "a"))
    p.close()


def test_a_spare_reused_from_the_pool_is_mapped_as_it_is(shm_dir: str) -> None:
    """A pooled spare this process keeps no map of (another wrote it: io.py gives the
    premapper only those) is opened, never made again: its bytes and size stay; one
    whose file is gone is not created."""
    path = segment_path(shm_dir, "a")
    with open(path, "wb") as f:
        f.write(b"old." * (32 * KiB))   # 128 KiB, its capacity
    os.chmod(path, 0o600)
    p = Premapper(shm_dir)
    reused, gone = spare("a"), spare("b")
    reused.reused = gone.reused = True
    reused.allocated = 128 * KiB
    p.add([reused, gone], 64 * KiB)
    wait_ready(p, {"a"})
    mm = p.take(for_object(reused, 64 * KiB))
    assert mm is not None and mm[:8] == b"old.old." and os.path.getsize(path) == 128 * KiB
    mm.close()
    wait_idle(p)
    assert p.take(for_object(gone, 64 * KiB)) is None
    assert not os.path.exists(segment_path(shm_dir, "b"))
    p.close()


def test_a_put_waits_for_the_spare_the_thread_is_making(shm_dir: str) -> None:
    p = Premapper(shm_dir)
    with p.cond:   # as if the thread were making "a"
        p.busy = "a"
    got: list[Any] = []
    taker = threading.Thread(target=lambda: got.append(p.take(for_object(spare("a"), 64 * KiB))))
    taker.start()
    time.sleep(0.05)
    assert taker.is_alive() and not got   # it waits, and opens nothing itself
    with p.cond:   # the thread's end of it
        p.ready["a"] = open_segment(shm_dir, for_object(spare("a"), 64 * KiB))
        p.busy = ""
        p.cond.notify_all()
    taker.join(5)
    assert got and got[0] is not None
    got[0].close()
    p.close()


# ---------------------------------------------------------------- interleavings
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule  # noqa: E402


class PremapInterleavings(RuleBasedStateMachine):
    """Spares added, taken by puts and given back in any order while the thread makes
    them: a put always gets a map it can write (the thread's, or its own open), no
    spare's file is created twice (open_segment is O_EXCL), and nothing given back or
    taken stays ready."""

    spares = Bundle("spares")

    def __init__(self) -> None:
        super().__init__()
        self.dir = make_session_dir("premap-h")
        self.p = Premapper(self.dir)
        self.n = 0
        self.gone: set[str] = set()
        self.written: dict[str, int] = {}   # spares a put wrote: name -> its object's size

    @rule(target=spares, size=st.integers(1, 128 * KiB))
    def add(self, size: int) -> str:
        self.n += 1
        name = f"s{self.n}"
        self.p.add([spare(name)], size)
        return name

    @rule(name=spares, size=st.integers(1, 128 * KiB))
    def take(self, name: str, size: int) -> None:
        if name in self.gone:
            return
        self.gone.add(name)
        seg = for_object(spare(name), size)
        mm = self.p.take(seg) or open_segment(self.dir, seg)   # else the put's own
        assert len(mm) >= size
        mm[size - 1:size] = b"x"
        mm.close()
        self.written[name] = size

    @rule(name=spares)
    def give_back(self, name: str) -> None:
        if name not in self.gone:
            self.gone.add(name)
            self.p.drop([name])

    @rule()
    def let_the_thread_run(self) -> None:
        time.sleep(0.002)

    def teardown(self) -> None:
        with self.p.cond:
            while self.p.busy:
                self.p.cond.wait(5)
            assert not set(self.p.ready) & self.gone
        for name, size in self.written.items():   # no one removed or remade a put's file
            with open(segment_path(self.dir, name), "rb") as f:
                f.seek(size - 1)
                assert f.read(1) == b"x", name
        self.p.close()
        remove_private_dir(self.dir)


TestPremapInterleavings = PremapInterleavings.TestCase
TestPremapInterleavings.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
