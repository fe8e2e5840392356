"""Direct calls' decisions (orchestra/_runtime/direct_core.py), driven without processes or sockets.

Where a call goes (an actor's route, a lent worker, or back through the head), and who
holds its results (this process alone, or the head too), as the I/O layer
(orchestra/_runtime/direct.py) asks them.
"""
from __future__ import annotations

import collections
import itertools
from typing import Any

import pytest

from orchestra._protocol import pb
from orchestra._runtime.direct_core import (
    LOAN_ASK_S,
    LOAN_DEPTH,
    LOAN_SLOW_S,
    ActorRoute,
    Call,
    Loan,
    ResultBook,
    idle_loans,
    load,
    must_sync,
    plan_loans,
    plan_route,
    slow_loans,
    steal_targets,
    wants_another_loan,
)

pytestmark = pytest.mark.timeout(10)

SHAPE = (("CPU", 1.0),)
PEER = object()
_n = itertools.count(1)


class Ref:
    """What the core reads of an ObjectRef: its id."""

    def __init__(self, oid: bytes) -> None:
        self._id = oid


def call(*args: bytes, hold: int = 0, returns: int = 1) -> Call:
    tid = next(_n).to_bytes(12, "big")
    rids = [tid + i.to_bytes(4, "big") for i in range(returns)]
    return Call(tid, b"call", [Ref(a) for a in args], None, rids, "f",
                [Ref(b"held%d" % i) for i in range(hold)])


def inline(oid: bytes) -> Any:
    return pb.ObjectData(object_id=oid, inline=b"v")


def in_segment(oid: bytes) -> Any:
    return pb.ObjectData(object_id=oid, segment=pb.Segment(name="seg", size=1 << 20))


def failed(oid: bytes) -> Any:
    return pb.ObjectData(object_id=oid, error=b"boom")


def loan(worker_id: int = 1, inflight: int = 0) -> Loan:
    le = Loan(worker_id, 1000 + worker_id, SHAPE)
    le.peer = ("peer", worker_id)
    for _ in range(inflight):
        c = call()
        le.inflight[c.tid] = c
    return le


def route(peer: Any = PEER) -> ActorRoute:
    r = ActorRoute(b"actor")
    r.peer = peer
    return r


def done(c: Call, *, owner: int = 0, cancelled: bool = False) -> Any:
    return pb.TaskDone(task_id=c.tid, owner=owner, cancelled=cancelled,
                       returns=[inline(rid) for rid in c.rids] if not owner and not cancelled else [])


# ------------------------------------------------------------------ actor routes

def test_a_route_goes_direct_only_once_every_call_through_the_head_is_dispatched() -> None:
    r = ActorRoute(b"actor")
    assert not r.direct()             # no address yet
    r.peer = PEER
    r.via_head = 2
    r.dispatched = 1
    assert not r.direct()             # a call sent through the head is not there yet
    r.dispatched = 2
    assert r.direct()


def test_a_route_sends_calls_in_order_while_their_arguments_are_here() -> None:
    r = route()
    first, second, third = call(b"a"), call(b"missing"), call()
    r.queue.extend([first, second, third])
    plan = plan_route(r, {b"a": inline(b"a")})
    assert [c for c, _ in plan.sends[r]] == [first]
    assert plan.sends[r][0][1] == [inline(b"a")]
    assert plan.missing == [b"missing"]
    # The third waits behind the second, even with nothing missing: order holds.
    assert list(r.queue) == [second, third]
    assert list(r.inflight) == [first.tid]
    assert first.peer is PEER


def test_a_call_whose_argument_failed_ends_unsent_with_that_error() -> None:
    r = route()
    c = call(b"bad")
    r.queue.append(c)
    plan = plan_route(r, {b"bad": failed(b"bad")})
    assert plan.failed == [(c, failed(b"bad"))]
    assert not plan.sends and not r.inflight and not r.queue


def test_arguments_in_shared_memory_or_refs_held_inside_keep_the_call_until_released() -> None:
    r = route()
    small, large, holding = call(b"s"), call(b"l"), call(hold=1)
    r.queue.extend([small, large, holding])
    plan_route(r, {b"s": inline(b"s"), b"l": in_segment(b"l")})
    assert (small.release, large.release, holding.release) == (False, True, True)


# ------------------------------------------------------------------ loans

def test_tasks_spread_over_the_least_busy_lent_workers() -> None:
    a, b = loan(1, inflight=2), loan(2)
    q = collections.deque(call() for _ in range(4))
    plan = plan_loans(q, [a, b], {}, now=5.0)
    assert (len(plan.sends[b]), len(plan.sends.get(a, []))) == (3, 1)
    assert load(a) == load(b) == 3
    assert not q
    assert b.idle_since == 5.0


def test_a_lent_worker_takes_at_most_loan_depth_tasks_the_rest_wait_here() -> None:
    a = loan(1)
    q = collections.deque(call() for _ in range(LOAN_DEPTH + 3))
    plan = plan_loans(q, [a], {}, now=0.0)
    assert len(plan.sends[a]) == LOAN_DEPTH
    assert len(q) == 3 and not plan.resubmit


def test_tasks_from_the_head_count_toward_a_lent_workers_load() -> None:
    a, b = loan(1), loan(2)
    a.busy = 1   # it runs a task the head sent before lending it
    q = collections.deque([call()])
    plan = plan_loans(q, [a, b], {}, now=0.0)
    assert list(plan.sends) == [b]


def test_a_task_whose_argument_is_not_here_goes_through_the_head() -> None:
    a = loan(1)
    here, elsewhere = call(b"here"), call(b"elsewhere")
    q = collections.deque([here, elsewhere])
    plan = plan_loans(q, [a], {b"here": inline(b"here")}, now=0.0)
    assert [c for c, _ in plan.sends[a]] == [here]
    assert plan.resubmit == [elsewhere]


def test_with_no_usable_lent_worker_every_queued_task_goes_through_the_head() -> None:
    q = collections.deque([call(), call()])
    expected = list(q)
    plan = plan_loans(q, [], {}, now=0.0)
    assert plan.resubmit == expected and not q


def test_one_more_worker_is_asked_for_when_tasks_wait_at_most_every_loan_ask_s() -> None:
    idle, busy = loan(1), loan(2, inflight=2)
    assert wants_another_loan(3, [idle], last_asked=0.0, now=1.0)
    assert wants_another_loan(0, [busy], last_asked=0.0, now=1.0)   # one queued behind another
    assert not wants_another_loan(0, [idle], last_asked=0.0, now=1.0)
    assert not wants_another_loan(3, [idle], last_asked=1.0, now=1.0 + LOAN_ASK_S / 2)


def test_tasks_queued_behind_a_slow_one_are_taken_back() -> None:
    slow, fresh, alone = loan(1, inflight=3), loan(2, inflight=3), loan(3, inflight=1)
    slow.idle_since = 0.0
    fresh.idle_since = 10.0
    alone.idle_since = 0.0
    assert slow_loans([slow, fresh, alone], now=10.0 + LOAN_SLOW_S / 2) == [slow]
    slow.stealing = True   # asked already
    assert slow_loans([slow], now=100.0) == []


def test_idle_lent_workers_go_back_unless_tasks_of_their_shape_wait() -> None:
    idle, working = loan(1), loan(2, inflight=1)
    idle.idle_since = 0.0
    assert idle_loans([idle, working], queued=0, min_idle_s=0.2, now=1.0) == [idle]
    assert idle_loans([idle, working], queued=0, min_idle_s=0.2, now=0.1) == []
    assert idle_loans([idle, working], queued=2, min_idle_s=0.2, now=1.0) == []
    working.inflight[b"x"] = call()   # two on it: the idle one is about to take one
    assert idle_loans([idle, working], queued=0, min_idle_s=0.2, now=1.0) == []


def test_an_idle_lent_worker_steals_from_every_other_with_tasks() -> None:
    idle, a, b, asked = loan(1), loan(2, inflight=2), loan(3), loan(4, inflight=1)
    asked.stealing = True
    assert steal_targets(idle, [idle, a, b, asked]) == [a]


# ------------------------------------------------------------------ who holds results

def test_a_direct_result_dropped_before_it_left_this_process_needs_no_release() -> None:
    book = ResultBook()
    c = call()
    book.sent(c.rids)
    assert book.last_ref_gone(c.rids[0]) is False
    assert book.last_ref_gone(b"some other object") is None   # not a direct result: release


def test_a_result_escaping_while_its_call_runs_is_registered_pending_and_forwarded() -> None:
    book = ResultBook()
    c = call()
    book.sent(c.rids)
    puts, pending = book.escape(c.rids, results={})
    assert (puts, pending) == ([], c.rids)
    results: dict[bytes, Any] = {}
    forward, decr = book.answered(c, done(c), {c.rids[0]: 1}, results, lambda name: b"")
    assert forward == [inline(c.rids[0])] and decr == []
    assert results[c.rids[0]] == inline(c.rids[0])
    assert book.last_ref_gone(c.rids[0]) is None   # the head holds it now: release there


def test_a_result_escaping_after_its_answer_is_put_with_its_data() -> None:
    book = ResultBook()
    c = call()
    book.sent(c.rids)
    results: dict[bytes, Any] = {}
    book.answered(c, done(c), {c.rids[0]: 1}, results, lambda name: b"")
    assert book.escape(c.rids, results) == ([inline(c.rids[0])], [])
    assert book.escape(c.rids, results) == ([], [])   # once


def test_a_result_the_head_pushed_before_its_answer_came_is_not_put_again_when_it_escapes() -> None:
    # The head sealed it (in shared memory, answered through the head) and holds it for
    # this process; a second put was taken for a second copy, and its segment freed.
    book = ResultBook()
    c = call()
    book.sent(c.rids)
    rid = c.rids[0]
    assert book.pushed(rid, running=True) is False
    assert book.escape(c.rids, {rid: inline(rid)}) == ([], [])
    forward, decr = book.answered(c, done(c, owner=7), {rid: 1}, {}, lambda name: b"")
    assert (forward, decr) == ([], [])
    assert book.last_ref_gone(rid) is None   # the head holds it: released there


def test_an_answer_through_the_head_is_released_once_pushed_when_dropped_meanwhile() -> None:
    book = ResultBook()
    c = call()
    book.sent(c.rids)
    rid = c.rids[0]
    forward, decr = book.answered(c, done(c, owner=7), {rid: 1}, {}, lambda name: b"")
    assert (forward, decr) == ([], [])
    assert book.last_ref_gone(rid) is False    # the head does not hold it yet
    assert book.pushed(rid, running=False) is True   # now it does: release


def test_a_push_before_the_answer_through_the_head_means_the_head_holds_it() -> None:
    book = ResultBook()
    c = call()
    book.sent(c.rids)
    rid = c.rids[0]
    assert book.pushed(rid, running=True) is False
    _, decr = book.answered(c, done(c, owner=7), {}, {}, lambda name: b"")
    assert decr == [rid]   # dropped here already: released at once


def test_a_cancelled_answer_gives_each_return_the_cancel_error() -> None:
    book = ResultBook()
    c = call(returns=2)
    book.sent(c.rids)
    results: dict[bytes, Any] = {}
    book.answered(c, done(c, cancelled=True), {rid: 1 for rid in c.rids}, results, lambda name: b"cancel")
    assert [results[rid].error for rid in c.rids] == [b"cancel", b"cancel"]


def test_calls_handed_to_the_head_release_the_results_dropped_here() -> None:
    book = ResultBook()
    kept, dropped = call(), call()
    book.sent(kept.rids + dropped.rids)
    book.escape(kept.rids, {})   # pending: forwarded on arrival
    decr = book.handed_to_head([kept, dropped], local={kept.rids[0]: 1})
    assert decr == dropped.rids
    assert not book.unregistered and not book.forward


def test_a_call_handed_to_the_head_after_its_result_escaped_releases_nothing_more() -> None:
    # The result was registered pending (one count at the head), then dropped here: that
    # drop released the count already; the Submit or AdoptCalls keeps it, adds none.
    book = ResultBook()
    c = call()
    book.sent(c.rids)
    book.escape(c.rids, {})
    assert book.last_ref_gone(c.rids[0]) is None   # released at the head
    assert book.handed_to_head([c], local={}) == []


def test_arguments_stay_held_until_the_callee_counted_them_in_either_order() -> None:
    book = ResultBook()
    answered_first, released_first, plain = call(hold=1), call(hold=1), call()
    for c in (answered_first, released_first):
        c.release = True
    assert book.keep_args(answered_first) is True
    assert book.release_call(answered_first.tid, running=False) is answered_first
    assert book.release_call(released_first.tid, running=True) is None
    assert book.keep_args(released_first) is False
    assert book.keep_args(plain) is False


def test_a_lost_callee_lets_go_of_the_arguments_it_kept() -> None:
    book = ResultBook()
    c = call(hold=1)
    c.release, c.peer = True, PEER
    book.keep_args(c)
    assert book.peer_lost(PEER) == [c]
    assert book.release_call(c.tid, running=False) is None


def _answered_through_the_head() -> tuple[ResultBook, Call, bytes]:
    """A book whose one direct call was answered through the head (its result held here)."""
    book = ResultBook()
    c = call()
    book.sent(c.rids)
    rid = c.rids[0]
    book.answered(c, done(c, owner=7), {rid: 1}, {}, lambda name: b"")
    return book, c, rid


def test_an_answer_through_the_head_holds_its_arguments_until_the_head_pushes_a_result() -> None:
    # The callee's notice (owner set) can come before the head read its TaskDone, on
    # another connection: arguments released then were freed before the head kept the
    # call's lineage naming them, and rebuilding its result after a node death found
    # them gone (the soak's chains, under node deaths).
    book, c, rid = _answered_through_the_head()
    assert book.awaiting_push == {c.tid: c}   # the call, and so its argument refs, kept
    book.pushed(rid, running=False)
    assert book.awaiting_push == {}


def test_an_answer_through_the_head_after_its_push_holds_nothing() -> None:
    book = ResultBook()
    c = call()
    book.sent(c.rids)
    book.pushed(c.rids[0], running=True)   # the head read the TaskDone already
    book.answered(c, done(c, owner=7), {c.rids[0]: 1}, {}, lambda name: b"")
    assert book.awaiting_push == {}


def test_a_result_answered_through_the_head_is_unread_there_until_it_pushes_it() -> None:
    # A ref to it sent on (a task's argument) waits for the push: the head may not have
    # read the callee's answer yet, which comes on another connection.
    book = ResultBook()
    c, early = call(), call()
    book.sent([*c.rids, *early.rids])
    assert book.unread([*c.rids, *early.rids]) == []   # running: registered if it escapes
    book.answered(c, done(c, owner=7), {c.rids[0]: 1}, {}, lambda name: b"")
    book.pushed(early.rids[0], running=True)   # pushed before its answer came: read there
    book.answered(early, done(early, owner=7), {early.rids[0]: 1}, {}, lambda name: b"")
    assert book.unread([*c.rids, *early.rids]) == c.rids
    book.pushed(c.rids[0], running=False)
    assert book.unread(c.rids) == []


def test_a_direct_call_waits_for_the_head_to_read_puts_it_names_in_shared_memory() -> None:
    class R:
        def __init__(self, oid: bytes) -> None:
            self._id = oid

    seg, small, absent = R(b"s"), R(b"i"), R(b"x")
    results = {b"s": pb.ObjectData(object_id=b"s", segment=pb.Segment(name="n", size=9)),
               b"i": pb.ObjectData(object_id=b"i", inline=b"v")}
    assert must_sync(True, [], [small, seg], results, True)   # located through the head there
    assert not must_sync(True, [], [small, seg], results, False)   # mapped by name here
    assert must_sync(True, [small], [], results, False)          # refs inside: counted there
    assert not must_sync(True, [], [small, absent], results, True)   # carried with the call
    assert not must_sync(False, [small], [seg], results, True)       # every put read already


def test_a_closed_callee_hands_back_the_calls_it_answered_through_the_head_not_pushed_yet() -> None:
    # The head voids what a dead node's workers said: an answer it had not read is never
    # pushed. The calls go to the head again (AdoptCalls.answered), and keep their
    # arguments until the head pushes their results (run again, or read after all).
    book = ResultBook()
    unpushed, pushed, elsewhere = call(), call(), call()
    for c, peer in ((unpushed, PEER), (pushed, PEER), (elsewhere, object())):
        c.peer = peer
        book.sent(c.rids)
        book.answered(c, done(c, owner=7), {c.rids[0]: 1}, {}, lambda name: b"")
    book.pushed(pushed.rids[0], running=False)
    assert book.unpushed(PEER) == [unpushed]
    assert book.awaiting_push == {unpushed.tid: unpushed, elsewhere.tid: elsewhere}
    assert unpushed.rids[0] in book.via_head   # the head pushes it either way
    book.pushed(unpushed.rids[0], running=False)
    assert book.unpushed(PEER) == []
    assert book.unpushed(elsewhere.peer) == [elsewhere]
