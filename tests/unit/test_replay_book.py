"""What a driver sends a restarted head (orchestra/_runtime/replay.py), driven by a
Hypothesis state machine of one driver: small and large puts (a large one's map may be
released, as the store does to spill it), tasks submitted with any of the refs held as
arguments (chains, fans), answers arriving inline or in shared memory in any order, refs
dropped at any moment, sweeps now and then, actor calls with and without
max_task_retries; at every step the head is lost. Refs count
as ObjectRefs do (the book holds those of kept calls' large arguments). Whatever the
order:
- every call sent again names only arguments the restarted head knows by then (values
  put or copied first, returns of calls sent before it), and none whose values were put;
- the returns owned are exactly those the calls sent again will bring;
- the ids lost are exactly those held that can be neither read here, copied, nor made
  again: a large put whose map went, or a value that needs one (through its task's
  arguments, where the driver has no value of them), an actor call's result that came
  in shared memory or that will not come (no retries), or one that needs such a value;
- once every call answered and every ref of the driver is gone, a sweep leaves nothing
  kept and no ref held.
No processes."""
from __future__ import annotations

import collections
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
    """An ObjectRef's counting: one count of its id here while it lives."""

    def __init__(self, driver: Driver, oid: bytes) -> None:
        self._id, self._driver = oid, driver
        driver.local[oid] += 1

    def __del__(self) -> None:
        self._driver.remove(self._id)


def _inline(data: pb.ObjectData | None) -> bool:
    return data is not None and data.WhichOneof("data") != "segment"


class Driver(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        reset_tids()
        self.book = ReplayBook()
        self.results: dict[bytes, pb.ObjectData] = {}
        self.owned: set[bytes] = set()
        self.local: collections.Counter[bytes] = collections.Counter()
        self.book.bind(self.book.lock, self.owned.__contains__, self.results, self.local,
                       lambda oid: Ref(self, oid))
        self.user: dict[bytes, Ref] = {}                 # the user's refs, one per id
        self.args: dict[bytes, tuple[bytes, ...]] = {}   # task id -> its ref arguments
        self.large: set[bytes] = set()                   # puts in shared memory
        self.mapped: set[bytes] = set()                  # ... whose map is still here
        self.seen: set[bytes] = set()    # values here inline once, while a ref held them
        self.pending: list[bytes] = []                   # tasks not answered
        self.frames: dict[bytes, bytes] = {}             # submit frame -> its task id
        self.actor_calls: dict[bytes, bool] = {}         # actor call's task id -> retried

    def remove(self, oid: bytes) -> None:
        """As RefCounts.remove and CoreClient._last_ref_gone (a driver with a book keeps
        its returns owned until they answer)."""
        self.local[oid] -= 1
        if self.local[oid] == 0:
            del self.local[oid]
            self.book.dropped(oid, self.results.pop(oid, None))

    # -------------------------------------------------------------- what a driver does
    @rule(large=st.booleans())
    def put(self, large: bool) -> None:
        oid = _ids.object_id(new_tid(), 0)
        self.results[oid] = (pb.ObjectData(object_id=oid, segment=pb.Segment(name="s", size=1))
                             if large else pb.ObjectData(object_id=oid, inline=b"v"))
        (self.large if large else self.seen).add(oid)
        if large:
            self.mapped.add(oid)
        self.user[oid] = Ref(self, oid)

    @precondition(lambda self: self.mapped)
    @rule(data=st.data())
    def spill(self, data: st.DataObject) -> None:
        """The store released a large put's map here (to spill it)."""
        self.mapped.discard(data.draw(st.sampled_from(sorted(self.mapped))))

    @precondition(lambda self: len(self.pending) < 12)
    @rule(data=st.data(), num_returns=st.integers(1, 2))
    def submit(self, data: st.DataObject, num_returns: int) -> None:
        mine = sorted(self.user)
        args = tuple(data.draw(st.lists(st.sampled_from(mine), max_size=3, unique=True))) \
            if mine else ()
        tid = new_tid()
        call = pb.Call(task_id=tid, num_returns=num_returns,
                       args=[pb.Value(ref=a) for a in args]).SerializeToString()
        self.frames[_codec.submit_frame(call)] = tid
        self.book.add(tid, call, num_returns, [self.user[a] for a in args])
        rids = _ids.return_ids(tid, num_returns)
        self.owned.update(rids)
        for r in rids:
            self.user[r] = Ref(self, r)
        self.args[tid] = args
        self.pending.append(tid)

    @precondition(lambda self: len(self.pending) < 12)
    @rule(data=st.data(), num_returns=st.integers(1, 2), retried=st.booleans())
    def call_actor(self, data: st.DataObject, num_returns: int, retried: bool) -> None:
        """An actor's method, with max_task_retries or not: kept only until it answers
        (its result cannot be made again), and sent again only with retries."""
        mine = sorted(self.user)
        args = tuple(data.draw(st.lists(st.sampled_from(mine), max_size=2, unique=True))) \
            if mine else ()
        template = pb.Call(num_returns=num_returns, actor_id=b"actor", method="m",
                           max_retries=-1 if retried else 0).SerializeToString()
        assert self.book.replays(template) == retried
        tid = new_tid()
        call = pb.Call(task_id=tid, num_returns=num_returns, actor_id=b"actor", method="m",
                       args=[pb.Value(ref=a) for a in args]).SerializeToString()
        self.frames[_codec.submit_frame(call)] = tid
        self.book.add(tid, call, num_returns, [self.user[a] for a in args], False, retried)
        rids = _ids.return_ids(tid, num_returns)
        self.owned.update(rids)
        for r in rids:
            self.user[r] = Ref(self, r)
        self.args[tid] = args
        self.actor_calls[tid] = retried
        self.pending.append(tid)

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), in_memory=st.booleans())
    def answer(self, data: st.DataObject, in_memory: bool) -> None:
        tid = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        for r in _ids.return_ids(tid, 2):
            if r in self.owned:   # as CoreClient._dispatch: stored only when held
                self.owned.discard(r)
                if r in self.local:
                    if not in_memory:
                        self.seen.add(r)
                    self.results[r] = (
                        pb.ObjectData(object_id=r, segment=pb.Segment(name="t", size=1))
                        if in_memory else pb.ObjectData(object_id=r, inline=b"r"))

    @precondition(lambda self: self.user)
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        del self.user[data.draw(st.sampled_from(sorted(self.user)))]

    @rule()
    def sweep(self) -> None:
        self.book.sweep(self.owned.__contains__, self.results, self.local)

    # -------------------------------------------------------------- what must hold
    def needs_lost(self, oid: bytes) -> bool:
        """Its value, made again from what the driver has, needs a large put whose map
        went: a value the driver had inline while a ref here held it does not (held
        still, it is here; named by a call, it was kept with the call)."""
        if oid in self.large:
            return oid not in self.mapped
        tid = _ids.task_of(oid)
        if tid in self.actor_calls and (tid not in self.pending or not self.actor_calls[tid]):
            return True   # answered (its value here is gone), or not kept
        return tid in self.args and any(
            a not in self.seen and self.needs_lost(a) for a in self.args[tid])

    @invariant()
    def the_head_is_lost_now(self) -> None:
        book = ReplayBook()   # a copy: the machine goes on with the book it has
        book.calls, book.values = dict(self.book.calls), dict(self.book.values)
        held = sorted(self.local)
        copied = {oid: self.results[oid] for oid in held if oid in self.mapped}
        plan = book.plan(self.owned.__contains__, self.results, self.local, held, copied)
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
        assert sorted(plan.owned) == sorted(coming)
        expect = {oid for oid in held if not _inline(self.results.get(oid))
                  and oid not in copied and self.needs_lost(oid)}
        # The user's refs exactly; an id only kept calls held is lost, or not held once
        # the calls that cannot run again went.
        assert {oid for oid in plan.lost if oid in self.user} == expect & set(self.user)
        assert plan.lost <= expect
        assert all(r not in self.local for r in plan.release)

    def teardown(self) -> None:
        """Every call answers, every ref of the user goes: nothing stays kept or held."""
        for tid in self.pending:
            for r in _ids.return_ids(tid, 2):
                self.owned.discard(r)
        self.user.clear()
        self.book.sweep(self.owned.__contains__, self.results, self.local)
        assert not self.book.calls and not self.book.values
        assert not self.local, f"refs held after all went: {sorted(self.local)}"


Driver.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestDriverReplay = Driver.TestCase
