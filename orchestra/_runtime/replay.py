"""What a driver sends a restarted head so that its work goes on: the tasks it submitted
that are still needed, and the small values it holds. No I/O (_runtime/reconnect.py sends).

    submit (through the head or to a lent worker) --> ReplayBook.add: the Call kept
    every few submissions --> sweep: a kept call goes once none of its returns is needed
    the head is lost and started again --> plan(): the values to put again (inline ones
        held here), the calls to submit again (in submission order, each once its
        arguments are known again), the returns to release after, the refs lost

A return is needed while (a) its task has not answered (the return is still owned, or
its direct call is in flight), or (b) its value is not here inline and a ref to it is
held here, or a kept call names it as an argument (lineage: a chain whose driver keeps
only its last ref runs again from its root). So a kept call whose results came back
inline and are held goes at the next sweep: the values themselves are what the driver
puts again. A small value here that a kept call names as an argument is kept with
the call (``values``), even once its refs here went (the root of a chain, a step's
value).

An actor's method call (``Kept.lineage`` False) is kept only until it answers (b does
not apply: the actor's state has moved on since). One with ``max_task_retries`` in
flight when the head died is sent again, in its order among the other calls, and the
restarted head queues it for the actor (a detached one is there again; another is
not, and the call raises ActorDiedError). One without retries (``Kept.replay``
False) is not: its result, if it had not come, is lost; it is kept for its small
values (a kept call may name them once they came).

Values in shared memory held here and mapped here (a large put, a result read) are
copied into new segments of the restarted head (``copied``; _runtime/reconnect.py makes
them). A kept call holds refs to its arguments in shared memory (``Kept.large``: a large
value passed by value is put first, and its ref went once the call was sent), so that
they can be copied; a sweep runs as well when those have grown by SWEEP_BYTES. What
cannot come back: values in shared memory that are not mapped here (the store released
the map to spill it) and that no kept call makes (a result of an actor
call that answered in shared memory, or had not answered and has no retries, refs
that other processes made): ``lost`` holds the ids held here that the
restarted head does not know, and a get of one raises ObjectLostError naming the lost
head.

A return stays owned until its task answered, even once the refs here went (the head
tells a driver it outlives when a return freed at its seal was its own: objects.py
``tell_owner_freed``): a task submitted and forgotten (its ref dropped at once) is kept
until it answered, and runs again on a restarted head if it had not.

Rule: the book belongs to the client's ref lock (``RefCounts.lock``): add, sweep and
plan run under it, as do the changes of the maps they read (results, owned, refs).
"""
from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from .. import _ids
from .._protocol import codec as _codec
from .._protocol import pb

# A sweep runs when the book has grown by this many calls since the last one (and at
# least doubled): amortized O(1) per submission; or when the arguments in shared memory
# it keeps alive have grown by this many bytes.
SWEEP_EVERY = 4096
SWEEP_BYTES = 256 << 20


class Kept(NamedTuple):
    call: bytes               # the serialized Call, as submitted
    num_returns: int
    args: tuple[bytes, ...]   # the ids of its ref arguments, in order
    # Refs to its arguments in shared memory (a large value passed by value is put
    # first): they live while the call is kept, so that a restarted head gets a copy.
    large: tuple[Any, ...] = ()
    size: int = 0             # their bytes
    # Runs again to make its values once it answered (a task); False: kept only until
    # it answers (an actor's method: the actor's state moved on since).
    lineage: bool = True
    # Sent again to a restarted head if it has not answered (False: an actor's method
    # without max_task_retries, which may have run; kept for its small values only).
    replay: bool = True


class Plan(NamedTuple):
    puts: list[pb.ObjectData]     # values held here, put again under their ids
    submits: list[bytes]          # SUBMIT frames, in submission order
    release: list[bytes]          # returns of those submits that nothing here holds
    owned: list[bytes]            # returns of those submits, their values to come
    lost: set[bytes]              # ids held here that no put or submit brings back


def _never(oid: bytes) -> bool:
    return False


def _no_ref(oid: bytes) -> Any:
    raise RuntimeError("ReplayBook.bind() was not called")


def inline(data: pb.ObjectData | None) -> bool:
    """A value this process has in full (inline bytes, or a task's error)."""
    return data is not None and data.WhichOneof("data") != "segment"


class ReplayBook:
    """The calls a driver kept (see the module docstring)."""

    __slots__ = ("calls", "values", "lost", "swept_at", "large_bytes", "swept_bytes", "lock",
                 "answering", "results", "held", "hold")

    def __init__(self) -> None:
        self.calls: dict[bytes, Kept] = {}   # task id -> its call (insertion: submission order)
        # Small values (puts, values pushed here) that kept calls name as arguments: kept
        # even when the refs here go (the root of a chain whose driver keeps its last ref).
        self.values: dict[bytes, pb.ObjectData] = {}
        self.lost: set[bytes] = set()
        self.swept_at = 0
        self.large_bytes = self.swept_bytes = 0   # Kept.size of the calls kept
        # The client's (bind): its ref lock, and what a sweep reads.
        self.lock: AbstractContextManager[object] = contextlib.nullcontext()
        self.answering: Callable[[bytes], bool] = _never
        self.results: Mapping[bytes, pb.ObjectData] = {}
        self.held: Mapping[bytes, int] = {}
        self.hold: Callable[[bytes], Any] = _no_ref

    def bind(self, lock: AbstractContextManager[object], answering: Callable[[bytes], bool],
             results: Mapping[bytes, pb.ObjectData], held: Mapping[bytes, int],
             hold: Callable[[bytes], Any]) -> None:
        """The client whose calls are kept now: ``answering(oid)``, its task has not
        answered; ``results``, the values here; ``held``, the count of refs here per id;
        ``hold(oid)``, a new ref of its own (one more count)."""
        self.lock, self.answering, self.results, self.held = lock, answering, results, held
        self.hold = hold

    @staticmethod
    def replays(template: bytes) -> bool:
        """A call of the actor method of ``template`` is sent again: it has
        max_task_retries (it may run again on the actor)."""
        return pb.Call.FromString(template).max_retries != 0   # ~1 us: a template is small

    def add(self, tid: bytes, call: bytes, num_returns: int, refs: Sequence[Any],
            lineage: bool = True, replay: bool = True) -> None:
        """Keep a submitted call (``refs``: its ref arguments); sweep now and then.
        ``lineage``: False for an actor's method (kept only until it answers);
        ``replay``: False for one without retries (not sent again)."""
        calls = self.calls
        args = tuple(r._id for r in refs)
        values = self.values
        large: list[Any] = []
        size = 0
        for r in refs:
            data = self.results.get(r._id)
            if data is None:
                continue
            if data.WhichOneof("data") == "segment":
                large.append(self.hold(r._id))
                size += data.segment.size
            elif r._id not in values:
                values[r._id] = data
        calls[tid] = Kept(call, num_returns, args, tuple(large), size, lineage, replay) \
            if large or not lineage else Kept(call, num_returns, args)
        self.large_bytes += size
        if (len(calls) >= self.swept_at + SWEEP_EVERY and len(calls) >= 2 * self.swept_at) \
                or self.large_bytes >= self.swept_bytes + SWEEP_BYTES:
            with self.lock:
                self.sweep(self.answering, self.results, self.held)

    def sweep(self, answering: Callable[[bytes], bool], results: Mapping[bytes, pb.ObjectData],
              held: Mapping[bytes, int]) -> None:
        doomed, _ = self._sweep(answering, results, held)
        del doomed   # their refs to large arguments go last (each re-enters the book)

    def _sweep(self, answering: Callable[[bytes], bool], results: Mapping[bytes, pb.ObjectData],
               held: Mapping[bytes, int]) -> tuple[list[Kept], collections.Counter[bytes]]:
        """Drop the calls none of whose returns is needed. ``answering(oid)``: its task has
        not answered; ``results``: the values here; ``held``: the count of refs here per
        id."""
        calls = self.calls
        named: set[bytes] = set()   # arguments of the kept calls submitted later
        gone: list[bytes] = []
        values = self.values
        # Counts held by the large-argument refs of calls going now: not holds that
        # keep the call making them (their own calls come later in this pass).
        going: collections.Counter[bytes] = collections.Counter()
        for tid, k in reversed(calls.items()):   # consumers come after their producers
            rids = _ids.return_ids(tid, k.num_returns)
            if any(answering(r) or (k.lineage and r not in values and not inline(results.get(r))
                                    and (held.get(r, 0) > going[r] or r in named))
                   for r in rids):
                named.update(k.args)
                continue
            gone.append(tid)
            going.update(r._id for r in k.large)
            for r in rids:   # its value here stands for the call: kept while named
                if r in named and r not in values:
                    data = results.get(r)
                    if inline(data):   # always, for a task (else it was needed)
                        assert data is not None
                        values[r] = data
        doomed = [calls.pop(tid) for tid in gone]
        for oid in [oid for oid in values if oid not in named]:
            del values[oid]
        self._swept()
        return doomed, going   # the calls dropped (the caller lets them go), their holds

    def _swept(self) -> None:
        self.swept_at = len(self.calls)
        self.large_bytes = self.swept_bytes = sum(k.size for k in self.calls.values())

    def plan(self, answering: Callable[[bytes], bool], results: Mapping[bytes, pb.ObjectData],
             held: Mapping[bytes, int], holding: list[bytes],
             copied: Mapping[bytes, pb.ObjectData] | None = None) -> Plan:
        """What to send a restarted head (see the module docstring); ``holding``: every id
        held here; ``copied``: values in shared memory held here, copied into new
        segments (large puts, results read here). The book keeps the calls submitted
        again, with their returns now owned by the new connection."""
        doomed, going = self._sweep(answering, results, held)
        holding = [oid for oid in holding if held.get(oid, 0) > going[oid]]
        puts = [results[oid] for oid in holding if inline(results.get(oid))]
        puts.extend((copied or {}).values())
        known = {d.object_id for d in puts}
        puts.extend(d for oid, d in self.values.items() if oid not in known)
        known.update(self.values)
        submits: list[bytes] = []
        owned: list[bytes] = []
        release = [oid for oid in self.values if oid not in held]
        for tid, k in list(self.calls.items()):
            rids = _ids.return_ids(tid, k.num_returns)
            if all(r in known for r in rids):   # its values are put again: nothing to run
                continue
            if not k.replay or not all(a in known for a in k.args):   # lost: so is the call
                doomed.append(self.calls.pop(tid))
                going.update(r._id for r in k.large)
                continue
            submits.append(_codec.submit_frame(k.call))
            owned.extend(r for r in rids if r not in known)
            known.update(rids)
            release.extend(r for r in rids if r not in held)
        # An actor's handle: the restarted head has the actor (detached) or not.
        lost = {oid for oid in holding if oid not in known and not _ids.is_actor_id(oid)
                and held.get(oid, 0) > going[oid]}
        self.lost |= lost
        self._swept()
        del doomed   # their refs to large arguments go once ``lost`` is known
        return Plan(puts, submits, release, owned, lost)

    def dropped(self, oid: bytes, data: pb.ObjectData | None) -> bool:
        """The last ref here to ``oid`` went (``data``: its value here, if any). A small
        return of a kept call stays with the call (a kept call may name it; the next
        sweep sees). True when ``oid`` was one of the lost ids (the head holds no count
        of it for this process)."""
        if data is not None and oid[:_ids.TASK_ID_LEN] in self.calls \
                and data.WhichOneof("data") != "segment":
            self.values[oid] = data
        if oid in self.lost:
            self.lost.discard(oid)
            return True
        return False
