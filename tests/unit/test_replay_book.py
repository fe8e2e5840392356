"""What a driver sends a restarted head (orchestra/_runtime/replay.py), driven by a
Hypothesis state machine of one driver: small and large puts, tasks submitted with any
of the refs held as arguments (chains, fans), answers arriving inline or in shared
memory in any order, refs dropped at any moment, sweeps now and then; then the head is
lost. Whatever the order:
- every call sent again names only arguments the restarted head knows by then (values
  put first, returns of calls sent before it);
- the ids lost are exactly those held whose value is not here and that need a large put
  (shared memory nothing makes again), directly or through their arguments;
- once every call answered inline and every ref is gone, a sweep leaves nothing kept.
No processes."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from orchestra import _ids
from orchestra._protocol import codec as _codec
from orchestra._protocol import pb
from orchestra._runtime.replay import ReplayBook

pytestmark = pytest.mark.timeout(120)

_tids = itertools.count(1)


def new_tid() -> bytes:
    return b"replay--" + next(_tids).to_bytes(4, "big")


def reset_tids() -> None:
    """Each run draws the same ids (a failure replays the same)."""
    global _tids
    _tids = itertools.count(1)


class Ref:
    """What the book reads of an ObjectRef: its id."""

    def __init__(self, oid: bytes) -> None:
        self._id = oid


class Driver(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        reset_tids()
        self.book = ReplayBook()
        self.results: dict[bytes, pb.ObjectData] = {}
        self.owned: set[bytes] = set()
        self.held: set[bytes] = set()
        self.book.bind(self.book.lock, self.owned.__contains__, self.results, self.held)
        self.args: dict[bytes, tuple[bytes, ...]] = {}   # task id -> its ref arguments
        self.large: set[bytes] = set()                   # puts in shared memory
        self.seen: set[bytes] = set()    # values here inline once, while a ref held them
        self.pending: list[bytes] = []                   # tasks not answered
        self.frames: dict[bytes, bytes] = {}             # submit frame -> its task id

    # -------------------------------------------------------------- what a driver does
    def _new_put(self, large: bool) -> None:
        oid = _ids.object_id(new_tid(), 0)
        self.results[oid] = (pb.ObjectData(object_id=oid, segment=pb.Segment(name="s", size=1))
                             if large else pb.ObjectData(object_id=oid, inline=b"v"))
        if large:
            self.large.add(oid)
        else:
            self.seen.add(oid)
        self.held.add(oid)

    @rule(large=st.booleans())
    def put(self, large: bool) -> None:
        self._new_put(large)

    @precondition(lambda self: len(self.pending) < 12)
    @rule(data=st.data(), num_returns=st.integers(1, 2))
    def submit(self, data: st.DataObject, num_returns: int) -> None:
        held = sorted(self.held)
        args = tuple(data.draw(st.lists(st.sampled_from(held), max_size=3, unique=True))) \
            if held else ()
        tid = new_tid()
        call = pb.Call(task_id=tid, num_returns=num_returns,
                       args=[pb.Value(ref=a) for a in args]).SerializeToString()
        self.frames[_codec.submit_frame(call)] = tid
        self.book.add(tid, call, num_returns, [Ref(a) for a in args])
        rids = _ids.return_ids(tid, num_returns)
        self.owned.update(rids)
        self.held.update(rids)
        self.args[tid] = args
        self.pending.append(tid)

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), in_memory=st.booleans())
    def answer(self, data: st.DataObject, in_memory: bool) -> None:
        tid = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        for r in _ids.return_ids(tid, self.book.calls[tid].num_returns
                                 if tid in self.book.calls else 2):
            if r in self.owned:   # as CoreClient._dispatch: stored only when held
                self.owned.discard(r)
                if r in self.held:
                    if not in_memory:
                        self.seen.add(r)
                    self.results[r] = (
                        pb.ObjectData(object_id=r, segment=pb.Segment(name="t", size=1))
                        if in_memory else pb.ObjectData(object_id=r, inline=b"r"))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        oid = data.draw(st.sampled_from(sorted(self.held)))
        self.held.discard(oid)           # as CoreClient._last_ref_gone
        data = self.results.pop(oid, None)
        self.owned.discard(oid)
        self.book.dropped(oid, data)

    @rule()
    def sweep(self) -> None:
        self.book.sweep(self.owned.__contains__, self.results, self.held)

    # -------------------------------------------------------------- what must hold
    def needs_large(self, oid: bytes) -> bool:
        """Its value, made again from what the driver has, needs a large put: a value
        the driver had inline while a ref here held it does not (held still, it is here;
        named by a call, it was kept with the call)."""
        if oid in self.large:
            return True
        tid = _ids.task_of(oid)
        return tid in self.args and any(
            a not in self.seen and self.needs_large(a) for a in self.args[tid])

    @invariant()
    def the_head_is_lost_now(self) -> None:
        book = ReplayBook()   # a copy: the machine goes on with the book it has
        book.calls, book.values = dict(self.book.calls), dict(self.book.values)
        plan = book.plan(self.owned.__contains__, self.results, self.held, sorted(self.held))
        known = {d.object_id for d in plan.puts}
        put = set(known)
        assert len(known) == len(plan.puts), "a value put twice"
        coming: set[bytes] = set()
        for frame in plan.submits:
            tid = self.frames[frame]
            missing = [a for a in self.args[tid] if a not in known]
            assert not missing, f"a call sent again before its arguments {missing}"
            rids = _ids.return_ids(tid, book.calls[tid].num_returns)
            assert not put.issuperset(rids), "a call run again whose values were put"
            known.update(rids)
            coming.update(r for r in rids if r not in put)
        # Owned: exactly the values the calls sent again will bring (each answers once).
        assert sorted(plan.owned) == sorted(coming)
        expect = {oid for oid in self.held
                  if not _inline(self.results.get(oid)) and self.needs_large(oid)}
        assert plan.lost == expect
        assert all(r not in self.held for r in plan.release)

    def teardown(self) -> None:
        """Every call answers inline, every ref goes: nothing stays kept."""
        for tid in self.pending:
            for r in _ids.return_ids(tid, 2):
                self.owned.discard(r)
        self.held.clear()
        self.results.clear()
        self.book.sweep(self.owned.__contains__, self.results, self.held)
        assert not self.book.calls and not self.book.values


def _inline(data: pb.ObjectData | None) -> bool:
    return data is not None and data.WhichOneof("data") != "segment"


Driver.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestDriverReplay = Driver.TestCase
