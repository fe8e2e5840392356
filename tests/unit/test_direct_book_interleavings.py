"""A driver's direct-call book (orchestra/_direct_core.ResultBook) and the head's core
(SchedulerState) together, under random interleavings (Hypothesis state machine).

The driver decides under its ref lock and sends afterwards, from whichever thread made
the decision: so frames of two threads can reach the head in either order. The machine
keeps each thread's decided, unsent frames in an outbox, and ``deliver`` hands the head
the first frame of any outbox; every other rule is a decision, as orchestra/_runtime/direct.py
makes it:

    call        a direct call queued for a lent worker (ResultBook.sent)
    send        it goes to the worker
    answer      the worker answers it (answered: its data forwarded if it escaped)
    answer_in_shared_memory
                the worker answers with a result in shared memory: the result goes to
                the head on the worker's own connection (which seals it and pushes it
                here), a notice to the driver
    notice      that notice reaches the driver (answered), before or after the push,
                and before or after the head reads the worker's answer
    lose_answer the worker dies before the head read its answer: with its node (the
                head voids what a dead node's workers said), or told dead first and
                its answer read later; the driver, its connection to the worker
                closed, hands the calls answered through the head and not pushed back
                to the head again (ResultBook.unpushed, AdoptCalls.answered), which
                runs them again (the late answer stands, and the run again ends by
                itself)
    resubmit    it goes through the head instead (handed_to_head and the Submit,
                decided and sent as one: _client.CoreClient.send_decided)
    escape      its result is passed to a task through the head (escape: registered
                pending or put, decided and sent as one; then the consumer's Submit,
                which may wait behind other threads' frames; a result answered through
                the head and not pushed back yet: the thread waits for the push first,
                and decides nothing meanwhile)
    drop        the driver drops its ref (last_ref_gone: released at the head or not)

Decided under the ref lock and sent after it, two threads passing one result could
send a task naming it before its registration (the task failed with ObjectLostError):
this machine found that in four steps; escapes and hand-overs are now sent as they are
decided, and the model does so too. A result in shared memory pushed by the head before
the worker's notice came, then passed to a task, was put again: the head took the put
for a second copy and freed the segment the object lived in (the fault soak read another
object's bytes from it); five steps here. The worker answers the head on a connection of
its own: an answer read after its call was handed back and run again (the worker's
death told first) ended the run again's task under it, or made a result the driver had
dropped anew for it (ten steps). A result answered through the head, passed to a task
before the head read that answer, failed that task (the head did not know the object
yet; six steps): the driver now waits for the head's push of it, which comes after
the head read the answer (or ran the call again when the worker died first).

Promises: once every frame is delivered the head counts exactly one hold for each
result the driver holds and the head knows, and none for a result it dropped; no
object the driver holds is freed, nor the segment of any live object; and ``drain``
(run at the end) ends every task, consumers included, none of them failing for an
argument that is alive.
"""
from __future__ import annotations

import collections
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from _sched_helpers import (
    DRIVER,
    Cluster,
    call_msg,
    inline_data,
    inline_msg,
    new_id,
    ref,
    rid,
    segment_msg,
)
from orchestra._head import inbound
from orchestra._head.outbound import data_out
from orchestra._protocol import pb
from orchestra._runtime.direct_core import Call, ResultBook
from orchestra._scheduler.data import ERROR
from orchestra._scheduler.events import TaskDone
from orchestra._scheduler.instructions import FreeSegment, Push, StartWorker

pytestmark = pytest.mark.timeout(120)

THREADS = ("main", "other", "reader", "worker")   # "worker": the lent worker's frames to the head
LENT_WORKER = 99   # the lent worker's connection to the head (results in shared memory)


class Ref:
    def __init__(self, oid: bytes) -> None:
        self._id = oid


class DirectBookWithHead(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = Cluster(cpus=2, max_workers=4)
        self.s = self.c.s
        self.book = ResultBook()
        self.local: dict[bytes, int] = {}          # the driver's refs (ResultBook reads)
        self.user: collections.Counter[bytes] = collections.Counter()   # those the user may drop
        self.results: dict[bytes, Any] = {}        # values here
        self.outbox: dict[str, list[tuple[str, Any]]] = {t: [] for t in THREADS}
        self.queued: dict[bytes, Call] = {}        # direct calls not sent yet
        self.sent: dict[bytes, Call] = {}          # sent to the lent worker, unanswered
        self.via_head: set[bytes] = set()          # resubmitted: the head runs them
        self.consumers: dict[bytes, Any] = {}      # tasks given an escaped result
        self.failed: dict[bytes, bytes] = {}       # task results that came as errors
        self.known: set[bytes] = set()             # ids the head heard of
        self.notices: dict[bytes, Call] = {}       # answered through the head, notice unread
        self.freed: set[tuple[int, str]] = set()   # segments the head freed
        self.to_connect: list[int] = []
        self.peer = "lent"                          # the connection to the lent worker
        self._take()

    # ------------------------------------------------------------ plumbing
    def _take(self) -> None:
        for ins in self.c.take():
            if type(ins) is StartWorker:
                self.to_connect.append(ins.worker_id)
            elif type(ins) is FreeSegment:
                self.freed.add((ins.node_id, ins.key))
            elif type(ins) is Push and ins.conn == DRIVER:
                d = ins.data
                oid = d.object_id
                if d.kind == ERROR:
                    self.failed[oid] = d.payload
                if self.book.pushed(oid, running=oid[:-4] in self.sent):
                    self.outbox["reader"].append(("decr", [oid]))
                if self.local.get(oid):
                    self.results[oid] = data_out(d)   # as the head writes it

    def _deliver(self, kind: str, body: Any) -> None:
        s = self.s
        if kind == "pending":
            s.directory.register_pending(DRIVER, body)
            self.known.update(body)
        elif kind == "objects":
            for d in body:
                s.directory.put(DRIVER, inbound.data_in(d))   # as the head reads it
                self.known.add(d.object_id)
        elif kind == "decr":
            s.directory.ref_delta(DRIVER, [], body)
        elif kind == "submit":
            s.submit(DRIVER, inbound.call_in(body))   # as the head reads it
            self.known.update(rid(body, i) for i in range(body.num_returns))
        elif kind == "done":   # the lent worker's answer through the head
            s.task_done(LENT_WORKER, inbound.task_done(body))   # as the head reads it
            self.known.update(d.object_id for d in body.returns)
        elif kind == "adopt":
            s.adoption.adopt_calls(DRIVER, inbound.adopt_calls(body))
        self._take()

    def _flush(self, thread: str) -> bool:
        """A thread sends what it decided before it decides anything else; False
        while it waits for a push (it decides nothing then)."""
        box = self.outbox[thread]
        while box and not self._waits(thread):
            self.deliver(thread)
        return not box

    def _waits(self, thread: str) -> bool:
        """The thread waits for the push of a result answered through the head."""
        box = self.outbox[thread]
        return bool(box) and box[0][0] == "await" and box[0][1] in self.book.via_head

    def _held(self) -> list[bytes]:
        return sorted(oid for oid, n in self.user.items() if n > 0)

    # ------------------------------------------------------------ decisions
    @rule()
    def call(self) -> None:
        tid = new_id()
        c = Call(tid, b"", [], None, [tid + bytes(4)], "direct", [])
        self.book.sent(c.rids)
        self.local[c.rids[0]] = 1
        self.user[c.rids[0]] = 1
        self.queued[tid] = c

    @precondition(lambda self: self.queued)
    @rule(i=st.integers(0, 50))
    def send(self, i: int) -> None:
        tid = sorted(self.queued)[i % len(self.queued)]
        c = self.sent[tid] = self.queued.pop(tid)
        c.peer = self.peer

    @precondition(lambda self: self.sent)
    @rule(i=st.integers(0, 50))
    def answer(self, i: int) -> None:
        tid = sorted(self.sent)[i % len(self.sent)]
        if tid in self.notices:
            return
        c = self.sent.pop(tid)
        msg = pb.TaskDone(task_id=tid, returns=[inline_msg(c.rids[0], "direct")])
        forward, decr = self.book.answered(c, msg, self.local, self.results, lambda name: b"")
        if forward:
            self.outbox["reader"].append(("objects", forward))
        if decr:
            self.outbox["reader"].append(("decr", decr))

    @precondition(lambda self: self.sent)
    @rule(i=st.integers(0, 50))
    def answer_in_shared_memory(self, i: int) -> None:
        tid = sorted(self.sent)[i % len(self.sent)]
        if tid in self.notices:
            return
        c = self.notices[tid] = self.sent[tid]
        # The worker's TaskDone to the head names the owner: sealed there, pushed here;
        # read by the head in its own time (another connection than the driver's).
        self.outbox["worker"].append(("done", pb.TaskDone(
            task_id=tid, owner=DRIVER, returns=[segment_msg(c.rids[0], f"seg-{tid.hex()}")])))

    @precondition(lambda self: self.outbox["worker"] and not self.notices)
    @rule(voided=st.booleans())
    def lose_answer(self, voided: bool) -> None:
        # The worker died: with its node (``voided``: the head never reads what it still
        # had to say), or its death told first and its answer read later; the driver's
        # connection to it closes (direct.py _loan_lost).
        if voided:
            self.outbox["worker"].clear()
        peer, self.peer = self.peer, f"lent{len(self.peer)}"
        lost = [c for c in self.sent.values() if c.peer == peer]
        for c in lost:
            del self.sent[c.tid]
        self._flush("reader")
        answered = self.book.unpushed(peer)   # decided with the frame (_adopt_frame)
        if not answered and not lost:
            return
        decr = self.book.handed_to_head(lost, self.local)
        calls = [make_call_for(c) for c in (*answered, *lost)]
        self._deliver("adopt", pb.AdoptCalls(worker_id=LENT_WORKER, calls=calls,
                                             answered=[c.tid for c in answered]))
        self.known.update(c.rids[0] for c in (*answered, *lost))
        if decr:
            self._deliver("decr", decr)

    @precondition(lambda self: self.notices)
    @rule(i=st.integers(0, 50))
    def notice(self, i: int) -> None:
        tid = sorted(self.notices)[i % len(self.notices)]
        c = self.notices.pop(tid)
        del self.sent[tid]
        forward, decr = self.book.answered(c, pb.TaskDone(task_id=tid, owner=DRIVER),
                                           self.local, self.results, lambda name: b"")
        if forward:
            self.outbox["reader"].append(("objects", forward))
        if decr:
            self.outbox["reader"].append(("decr", decr))

    @precondition(lambda self: self.queued)
    @rule(i=st.integers(0, 50), thread=st.sampled_from(THREADS[:2]))
    def resubmit(self, i: int, thread: str) -> None:
        if not self._flush(thread):
            return
        tid = sorted(self.queued)[i % len(self.queued)]
        c = self.queued.pop(tid)
        # Handed over and sent as one, under the connection's lock (send_decided): the
        # Submit, then the releases.
        decr = self.book.handed_to_head([c], self.local)
        self._deliver("submit", make_call_for(c))
        if decr:
            self._deliver("decr", decr)
        self.via_head.add(tid)

    @rule(i=st.integers(0, 50), thread=st.sampled_from(THREADS[:2]))
    def escape(self, i: int, thread: str) -> None:
        held = [oid for oid in self._held() if oid[:-4] not in self.consumers]
        if not held:
            return
        oid = held[i % len(held)]
        if not self._flush(thread):
            return
        # Decided and sent as one (send_decided); the consumer's Submit follows, and
        # may wait behind other threads' frames.
        puts, pending = self.book.escape([oid], self.results)
        if pending:
            self._deliver("pending", pending)
        if puts:
            self._deliver("objects", puts)
        g = call_msg("consumer", (ref(oid),))
        self.consumers[g.task_id] = g
        self.local[rid(g)] = 1
        self.local[oid] += 1   # the argument lives until its Submit is sent
        if self.book.unread([oid]):
            # Answered through the head, not pushed back yet: the thread waits for the
            # push (DirectCalls.await_pushes) before it sends the Submit.
            self.outbox[thread].append(("await", oid))
        self.outbox[thread].append(("submit", g))
        self.outbox[thread].append(("release", (oid, rid(g))))

    @rule(i=st.integers(0, 50), thread=st.sampled_from(THREADS[:2]))
    def drop(self, i: int, thread: str) -> None:
        held = self._held()
        if not held:
            return
        oid = held[i % len(held)]
        if not self._flush(thread):
            return
        self.user[oid] -= 1
        self._release(thread, oid)

    def _release(self, thread: str, oid: bytes) -> None:
        self.local[oid] -= 1
        if self.local[oid] == 0:
            del self.local[oid]
            self.results.pop(oid, None)
            if self.book.last_ref_gone(oid) is None:
                self.outbox[thread].insert(0, ("decr", [oid]))

    @precondition(lambda self: any(self.outbox.values()))
    @rule(thread=st.sampled_from(THREADS))
    def deliver(self, thread: str) -> None:
        box = self.outbox[thread]
        if not box or self._waits(thread):
            return
        kind, body = box.pop(0)
        if kind == "await":
            return
        if kind == "release":   # the Submit went: its argument's ref goes, and the
            arg, result = body   # caller has the result's ref (.remote() returned)
            self.user[result] = 1
            self._release(thread, arg)
        else:
            self._deliver(kind, body)

    @precondition(lambda self: self.to_connect)
    @rule()
    def connect(self) -> None:
        wid = self.to_connect.pop(0)
        if wid in self.s.workers:
            self.c.connect(wid)
        self._take()

    @rule(i=st.integers(0, 50))
    def finish(self, i: int) -> None:
        workers = [w for w in self.s.workers.values() if w.conn >= 0 and w.queue]
        if not workers:
            return
        w = workers[i % len(workers)]
        call = w.queue[0].call
        self.s.task_done(w.conn, TaskDone(task_id=call.task_id,
                                             returns=[inline_data(rid(call), "ran")]))
        self._take()

    # ------------------------------------------------------------ promises
    @invariant()
    def a_held_object_the_head_knows_is_not_freed(self) -> None:
        if any(self.outbox.values()):
            return
        for oid in self.local:
            assert oid not in self.known or oid in self.s.objects, \
                f"{oid.hex()} is held here and was freed at the head"

    @invariant()
    def no_live_object_loses_its_segment(self) -> None:
        for oid, o in self.s.objects.items():
            d = o.data
            if d is not None and d.segment is not None:
                assert (d.segment.node_id, d.segment.name) not in self.freed, \
                    f"the segment of {oid.hex()} was freed while the object lives"

    @invariant()
    def once_delivered_the_head_counts_each_held_result_once(self) -> None:
        if any(self.outbox.values()):
            return
        holds = self.s.clients[DRIVER].holds
        for oid, n in holds.items():
            assert n == 1, f"the head counts {n} holds of {oid.hex()}"
            # (or until it pushes it here: the driver releases it then)
            assert self.local.get(oid, 0) > 0 or oid[:-4] in self.sent \
                or oid in self.book.via_head, \
                f"the head holds {oid.hex()} for the driver, which dropped it"

    @invariant()
    def no_task_fails_for_an_argument_that_is_alive(self) -> None:
        assert not self.failed, f"failed: { {k.hex(): v for k, v in self.failed.items()} }"

    def drain(self) -> None:
        for _ in range(500):
            ready = [t for t in THREADS if self.outbox[t] and not self._waits(t)]
            if ready:
                self.deliver(ready[0])
            elif self.queued:
                self.send(0)
            elif self.notices:
                self.notice(0)
            elif self.sent:
                self.answer(0)
            elif self.to_connect:
                self.connect()
            elif any(w.queue for w in self.s.workers.values() if w.conn >= 0):
                self.finish(0)
            else:
                break
        left = {tid.hex(): t.state.value for tid, t in self.s.tasks.items()}
        assert not left, f"tasks that never ended: {left}"
        self.no_task_fails_for_an_argument_that_is_alive()

    def teardown(self) -> None:
        self.drain()


def make_call_for(c: Call) -> Any:
    """The Call a direct call's Submit carries (its task id, one return); it may run
    again (its worker died with its result: lose_answer)."""
    call = call_msg("direct", max_retries=3)
    call.task_id = c.tid
    return call


DirectBookWithHead.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_direct_book_with_the_head = DirectBookWithHead.TestCase
