"""The Pool's decisions (orchestra/_libs/pool_book.py) under random interleavings
(Hypothesis), no processes: chunks added, calls sent and answered in any order (a
result, or the process's death), processes replaced, close and terminate, with one to
three processes and with or without maxtasksperchild.

Invariants after every step: every chunk is in exactly one place (waiting, in one call
out, or answered) and answered at most once; no slot holds more calls than its limit;
no process is given more chunks than maxtasksperchild; a replaced process's calls count
no more against its slot; the pump leaves nothing waiting while a slot has room (no
stall); after terminate nothing is sent and every chunk not answered is handed back
once to fail; a closed pool that drains is drained."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from orchestra._libs.pool_book import RUN, TERMINATE, PoolBook

pytestmark = pytest.mark.timeout(120)


class PoolMachine(RuleBasedStateMachine):
    @initialize(processes=st.integers(1, 3), cap=st.one_of(st.none(), st.integers(1, 4)),
                in_flight=st.integers(1, 3), group_max=st.integers(1, 5))
    def start(self, processes: int, cap: int | None, in_flight: int, group_max: int) -> None:
        self.book = PoolBook(processes, cap, in_flight=in_flight, group_max=group_max)
        self.cap, self.limit = cap, in_flight
        self.next_chunk = 0
        self.where: dict[int, str] = {}        # chunk -> waiting / out / answered / failed
        self.out: dict[int, tuple[int, list[int]]] = {}   # call -> (slot, chunks)
        self.sent_to: dict[tuple[int, int], int] = {}     # (slot, generation) -> chunks sent
        self.call_gen: dict[int, tuple[int, int]] = {}    # call -> (slot, generation)

    def _pump(self) -> None:
        for call, slot, entries in self.book.pump():
            assert self.book.state != TERMINATE, "sent after terminate"
            chunks = [e[1] for e in entries]
            for c in chunks:
                assert self.where[c] == "waiting", f"chunk {c} sent while {self.where[c]}"
                self.where[c] = "out"
            self.out[call] = (slot, chunks)
            key = (slot, self.book.generation[slot])
            self.call_gen[call] = key
            self.sent_to[key] = self.sent_to.get(key, 0) + len(chunks)

    # ------------------------------------------------------------ rules
    @rule(n=st.integers(1, 12))
    def add(self, n: int) -> None:
        for _ in range(n):
            c = self.next_chunk
            self.next_chunk += 1
            if self.book.state != RUN:
                with pytest.raises(ValueError, match="not running"):
                    self.book.add(("result", c, "fn", [c], False))
                return
            self.book.add(("result", c, "fn", [c], False))
            self.where[c] = "waiting"
        self._pump()

    @precondition(lambda self: getattr(self, "out", None))
    @rule(data=st.data(), died=st.booleans())
    def answer(self, data: st.DataObject, died: bool) -> None:
        call = data.draw(st.sampled_from(sorted(self.out)))
        slot, chunks = self.out.pop(call)
        got = self.book.done(call, died)
        if self.book.state == TERMINATE:
            assert got is None
            return
        assert got is not None
        entries, replace, got_slot = got
        assert got_slot == slot and [e[1] for e in entries] == chunks
        for c in chunks:
            assert self.where[c] == "out"
            self.where[c] = "answered"
        if replace:
            current = self.call_gen[call] == (slot, self.book.generation[slot] - 1)
            assert current, "a replaced process's old call replaced its slot again"
            assert died or (self.cap is not None and
                            self.sent_to[self.call_gen[call]] >= self.cap), \
                "replaced a process that neither died nor reached maxtasksperchild"
        self._pump()

    @rule()
    def close(self) -> None:
        self.book.close()

    @rule()
    def terminate(self) -> None:
        pending = self.book.terminate()
        chunks = [e[1] for e in pending]
        assert len(chunks) == len(set(chunks))
        assert set(chunks) == {c for c, w in self.where.items() if w in ("waiting", "out")}
        for c in chunks:
            self.where[c] = "failed"
        # Calls still out come back, and are no longer the book's.
        assert self.book.terminate() == []

    # ------------------------------------------------------------ invariants
    @invariant()
    def each_chunk_in_one_place(self) -> None:
        if not hasattr(self, "book"):
            return
        waiting = [e[1] for e in self.book.queue]
        out = [e[1] for entries, _, _ in self.book.calls.values() for e in entries]
        assert len(waiting) + len(out) == len(set(waiting) | set(out))
        assert set(waiting) == {c for c, w in self.where.items() if w == "waiting"}
        assert set(out) == {c for c, w in self.where.items() if w == "out"} or \
            self.book.state == TERMINATE

    @invariant()
    def limits_hold(self) -> None:
        if not hasattr(self, "book"):
            return
        book = self.book
        for slot, n in enumerate(book.in_flight):
            assert 0 <= n <= self.limit
            current = [c for c, (s, g) in self.call_gen.items()
                       if c in book.calls and s == slot and g == book.generation[slot]]
            assert n == len(current), "a slot counts calls that are not its process's"
        if self.cap is not None:
            assert all(n <= self.cap for n in self.sent_to.values()), \
                "a process was given more chunks than maxtasksperchild"

    @invariant()
    def no_stall(self) -> None:
        if not hasattr(self, "book") or self.book.state == TERMINATE or not self.book.queue:
            return
        book = self.book
        for slot, n in enumerate(book.in_flight):
            room = self.limit if self.cap is None else min(self.limit, self.cap - book.ran[slot])
            assert n >= room, "chunks wait while a process has room"
        assert book.calls, "chunks wait and nothing is out to make room"

    @invariant()
    def drained_when_done(self) -> None:
        if not hasattr(self, "book"):
            return
        if not any(w in ("waiting", "out") for w in self.where.values()):
            assert self.book.drained()


PoolMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ORCHESTRA_HYPOTHESIS_EXAMPLES", "150")),
    stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
test_the_pools_decisions_under_random_interleavings = PoolMachine.TestCase


def test_many_waiting_chunks_go_several_to_a_call_and_the_last_one_by_one() -> None:
    book = PoolBook(2, None, in_flight=2, group_max=16)
    for c in range(200):
        book.add(("r", c, "fn", [c], False))
    sizes = [len(entries) for _, _, entries in book.pump()]
    assert sizes[0] == 12 and len(sizes) == 4   # 200 // (4 * 2 * 2)
    while book.calls:
        call = min(book.calls)
        book.done(call, False)
        sizes += [len(entries) for _, _, entries in book.pump()]
    assert sum(sizes) == 200 and sizes[-1] == 1
