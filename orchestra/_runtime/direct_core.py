"""Direct calls, the decisions: which call goes where, and who holds its results. No I/O.

A direct call goes from its caller straight to the process that runs it, not through
the head: to an actor's process (an ``ActorRoute``, once the head gave its address), or
to a worker the head lent this driver for tasks of one resource shape (a ``Loan``).
orchestra/_runtime/direct.py does the I/O: it asks these functions and classes what to do, then
sends the frames. Unit tests (tests/unit/test_direct_core.py) drive them directly.

    submit --> route/loan queue --plan_route/plan_loans--> sends (call + resolved args)
                                                        \\-> resubmit through the head
    answer --> ResultBook.answered --> results here, or forwarded to the head
    refs leave this process --> ResultBook.escape --> the head learns the results

Who holds a direct call's results (ResultBook): at first only this process knows them
("unregistered"). When a ref to one leaves the process (an argument, or pickled in a
value), the head must learn it first: its data is put, or, while the call runs, it is
registered as pending and its data forwarded on arrival. An answer that goes through
the head (a result in shared memory, or one holding refs) is pushed back by the head,
which then holds it for this process; a ref to one leaves the process only after that
push (``unread``: the head may not have read the callee's answer yet). A result dropped
here before the head held it is released once the head has it.
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._protocol import pb

LOAN_DEPTH = 8        # tasks sent ahead to one lent worker
LOAN_IDLE_S = 0.2     # a lent worker with nothing to do for this long goes back
LOAN_ASK_S = 0.05     # at most one request for another lent worker per shape this often
LOAN_SLOW_S = 0.2     # tasks queued behind one running this long on a lent worker move on

Shape = tuple[tuple[str, float], ...]


class Call:
    """A direct call sent (or to be sent); its refs live until it is answered."""

    __slots__ = ("tid", "call", "args", "token", "rids", "name", "peer", "hold", "release",
                 "cancelled", "fid")

    def __init__(self, tid: bytes, call: bytes, args: list[Any], token: Any,
                 rids: list[bytes], name: str, hold: list[Any]) -> None:
        self.tid = tid
        self.call = call          # serialized Call
        self.args = args          # ref arguments, in order: their data goes with the call
        self.token = token        # an actor's handle token: the actor lives while answering
        self.hold = hold          # refs pickled inside the arguments
        self.release = False      # held until the callee says it counted them (RELEASE_CALL)
        self.cancelled = False    # cancelled with force: its worker was killed
        self.fid = b""            # a task's function id
        self.rids = rids
        self.name = name
        self.peer: Any = None     # the connection it went on (direct.Peer)


class Loan:
    """A worker the head lent this driver for tasks of one resource shape."""

    __slots__ = ("worker_id", "pid", "shape", "peer", "inflight", "recalled", "blocked",
                 "stealing", "idle_since", "functions", "busy", "__weakref__")

    def __init__(self, worker_id: int, pid: int, shape: Shape) -> None:
        self.worker_id = worker_id
        self.pid = pid
        self.shape = shape
        self.peer: Any = None   # direct.Peer, once known
        self.inflight: dict[bytes, Call] = {}   # in the order sent: the first one runs
        self.recalled = False     # the head wants it back
        self.blocked = False      # its running task waits in get(): send nothing more
        self.stealing = False     # a STEAL was sent, its answer not read yet
        self.idle_since = time.monotonic()
        self.functions: set[bytes] = set()   # sent to it from here
        self.busy = 0   # tasks the head sent it before lending it, not known to have ended


def load(loan: Loan) -> int:
    """Tasks on a lent worker: sent from here and unanswered, and those from the head."""
    return len(loan.inflight) + loan.busy


class ActorRoute:
    """One caller's calls to one actor. Through the head until the head gives the
    address of the actor's process (ActorAddress) and has sent it every call this
    caller made through it (``dispatched`` >= ``via_head``); then straight there, in
    order, each once its ref arguments are here. When that connection closes, the calls
    it left unanswered go to the head (AdoptCalls), and later ones through the head."""

    __slots__ = ("actor_id", "lock", "peer", "via_head", "dispatched", "stale", "queue",
                 "inflight", "__weakref__")

    def __init__(self, actor_id: bytes) -> None:
        self.actor_id = actor_id
        self.lock = threading.Lock()
        self.peer: Any = None   # direct.Peer, once known
        self.via_head = 0
        self.dispatched = 0
        self.stale: set[int] = set()   # worker ids of processes not to call any more
        self.queue: collections.deque[Call] = collections.deque()
        self.inflight: dict[bytes, Call] = {}

    def direct(self) -> bool:
        """Whether a new call may go straight to the actor's process."""
        return self.peer is not None and self.dispatched >= self.via_head


class Plan:
    """What to do with queued calls: send these (with the data of their ref arguments),
    end these unsent (their argument failed: the error's ObjectData), send these through
    the head; ``missing``: argument ids not here yet."""

    __slots__ = ("sends", "failed", "resubmit", "missing")

    def __init__(self) -> None:
        self.sends: dict[Any, list[tuple[Call, list[pb.ObjectData]]]] = {}   # route or loan ->
        self.failed: list[tuple[Call, pb.ObjectData]] = []
        self.resubmit: list[Call] = []
        self.missing: list[bytes] = []


def _failed_argument(resolved: Sequence[pb.ObjectData]) -> pb.ObjectData | None:
    """The error ObjectData among a call's resolved arguments, if any: the call fails
    with it unsent (as through the head: it does not run)."""
    for d in resolved:
        if d.WhichOneof("data") == "error":
            return d
    return None


def _sent(c: Call, peer: Any, resolved: Sequence[pb.ObjectData]) -> None:
    c.peer = peer
    c.release = bool(c.hold) or any(d.WhichOneof("data") == "segment" for d in resolved)


def plan_route(route: ActorRoute, results: dict[bytes, pb.ObjectData]) -> Plan:
    """Take the route's queued calls, in order, while their ref arguments are here."""
    plan = Plan()
    q = route.queue
    sends: list[tuple[Call, list[pb.ObjectData]]] = []
    while q:
        c = q[0]
        resolved = []
        for r in c.args:
            d = results.get(r._id)
            if d is None:
                plan.missing.append(r._id)
                break
            resolved.append(d)
        if plan.missing:
            break
        q.popleft()
        if resolved:
            err = _failed_argument(resolved)
            if err is not None:
                plan.failed.append((c, err))
                continue
            _sent(c, route.peer, resolved)
        else:
            c.peer, c.release = route.peer, bool(c.hold)
        route.inflight[c.tid] = c
        sends.append((c, resolved))
    if sends:
        plan.sends[route] = sends
    return plan


def plan_loans(queue: collections.deque[Call], loans: Sequence[Loan],
               results: dict[bytes, pb.ObjectData], now: float) -> Plan:
    """Spread queued tasks over the least busy lent workers (at most LOAN_DEPTH each);
    a task whose argument is not here goes through the head, and so does every queued
    task when no lent worker can take one (all recalled or blocked)."""
    plan = Plan()
    usable = [le for le in loans if not le.recalled and not le.blocked]
    while queue and usable:
        best = min(usable, key=load)
        if load(best) >= LOAN_DEPTH:
            break
        c = queue.popleft()
        resolved: list[pb.ObjectData] = []
        if c.args:
            maybe: list[Any] = [results.get(r._id) for r in c.args]   # all there: none None
            if any(d is None for d in maybe):
                plan.resubmit.append(c)
                continue
            resolved = maybe
            err = _failed_argument(resolved)
            if err is not None:
                plan.failed.append((c, err))
                continue
        if resolved:
            _sent(c, best.peer, resolved)
        else:
            c.peer, c.release = best.peer, bool(c.hold)
        best.inflight[c.tid] = c
        best.idle_since = now
        plan.sends.setdefault(best, []).append((c, resolved))
    if queue and not usable:
        plan.resubmit.extend(queue)
        queue.clear()
    return plan


def wants_another_loan(queued: int, loans: Iterable[Loan], last_asked: float, now: float) -> bool:
    """Ask the head for one more lent worker of this shape: tasks wait behind others
    (at most every LOAN_ASK_S)."""
    return now - last_asked > LOAN_ASK_S and (queued > 0 or any(load(le) > 1 for le in loans))


def slow_loans(loans: Iterable[Loan], now: float) -> list[Loan]:
    """Lent workers whose queued tasks wait behind one running for LOAN_SLOW_S: take
    those tasks back (they go to another lent worker, or through the head)."""
    return [le for le in loans if load(le) > 1 and le.inflight and not le.stealing
            and now - le.idle_since > LOAN_SLOW_S]


def idle_loans(loans: Sequence[Loan], queued: int, min_idle_s: float, now: float) -> list[Loan]:
    """Lent workers to give back: nothing unanswered for ``min_idle_s`` (none while
    tasks of the shape wait: an idle worker is about to take them)."""
    if queued or any(le.stealing or load(le) > 1 for le in loans):
        return []
    return [le for le in loans if not le.inflight and now - le.idle_since >= min_idle_s]


def steal_targets(idle: Loan, loans: Iterable[Loan]) -> list[Loan]:
    """Lent workers with tasks queued behind a running one, when ``idle`` has none: all
    of their tasks are asked back (each gives back only those it has not started)."""
    return [le for le in loans if le is not idle and le.inflight and not le.stealing]


def must_sync(unsynced: bool, hold: Sequence[Any], args: Sequence[Any],
              results: dict[bytes, pb.ObjectData], remote: bool) -> bool:
    """Whether a direct call waits for the head to have read this process's puts
    (``unsynced``: some not known read): it names refs inside its arguments (``hold``:
    the callee counts them there), or, sent to a process on another node (``remote``:
    the call may go there), a value in shared memory among its ref arguments ``args``:
    that process locates it through the head, which, asked before it read the put (it
    comes on another connection), said the object was freed."""
    if not unsynced:
        return False
    if hold:
        return True
    return remote and any(
        (d := results.get(r._id)) is not None and d.WhichOneof("data") == "segment" for r in args)


class ResultBook:
    """Which direct-call results the head knows of, for one process (see the module
    docstring). Every method runs under the process's ref lock."""

    __slots__ = ("unregistered", "forward", "via_head", "pushed_early", "releasing",
                 "released_early", "awaiting_push")

    def __init__(self) -> None:
        self.unregistered: set[bytes] = set()   # only this process knows them
        self.forward: set[bytes] = set()        # registered pending: send the data on arrival
        # Answered through the head, not pushed back yet: id -> dropped here meanwhile.
        self.via_head: dict[bytes, bool] = {}
        self.pushed_early: set[bytes] = set()   # pushed by the head before the answer came
        # Answered calls whose arguments stay held until the callee's counts of them
        # reached the head (RELEASE_CALL): task id -> call; and those told before.
        self.releasing: dict[bytes, Call] = {}
        self.released_early: set[bytes] = set()
        # Calls answered through the head whose results it has not pushed back yet: task
        # id -> call, its arguments held until then. The callee's notice can come before
        # the head has read the callee's TaskDone (another connection): released then,
        # an argument was freed before the head kept the call's lineage naming it, and a
        # rebuild of the result (its node died) found it gone (found by the soak's
        # chains under node deaths).
        self.awaiting_push: dict[bytes, Call] = {}

    def sent(self, rids: Iterable[bytes]) -> None:
        """A call goes direct: its results are known here only."""
        self.unregistered.update(rids)

    def last_ref_gone(self, oid: bytes) -> bool | None:
        """This process dropped its last ref: True when the head holds a count to
        release now, False when it does not, None when not a direct-call result."""
        if oid in self.unregistered:
            self.unregistered.discard(oid)
            return False
        if oid in self.via_head:
            self.via_head[oid] = True   # released once the head holds it
            return False
        return None

    def escape(self, ids: Iterable[bytes],
               results: dict[bytes, pb.ObjectData]) -> tuple[list[pb.ObjectData], list[bytes]]:
        """Refs leave this process: (data to put, ids to register as pending)."""
        puts: list[pb.ObjectData] = []
        pending: list[bytes] = []
        unregistered = self.unregistered
        for oid in ids:
            if oid in unregistered:
                unregistered.discard(oid)
                if oid in self.pushed_early:
                    # The head sealed it (a result in shared memory, pushed before the
                    # callee's answer came) and holds it for this process: put again,
                    # it was taken for a second copy and its segment freed under it.
                    continue
                d = results.get(oid)
                if d is not None:
                    puts.append(d)
                else:
                    pending.append(oid)
                    self.forward.add(oid)
        return puts, pending

    def handed_to_head(self, calls: Iterable[Call], local: dict[bytes, int]) -> list[bytes]:
        """The head takes these calls over (resent, or adopted): it holds their returns
        for this process from now on. Returns the ids to release (dropped here already)."""
        decr = []
        forward = self.forward
        for c in calls:
            self.released_early.discard(c.tid)
            for rid in c.rids:
                self.unregistered.discard(rid)
                self.pushed_early.discard(rid)
                if rid in forward:
                    # Registered pending: the head holds that one count, which this
                    # process releases as any other (last_ref_gone), and keeps it for
                    # the Submit or AdoptCalls.
                    forward.discard(rid)
                elif rid not in local:
                    decr.append(rid)
        return decr

    def answered(self, c: Call, msg: pb.TaskDone, local: dict[bytes, int],
                 results: dict[bytes, pb.ObjectData], cancelled_error: Callable[[str], bytes],
                 ) -> tuple[list[pb.ObjectData], list[bytes]]:
        """The callee answered ``c`` (``msg``: TaskDone). Returns (data to forward to the
        head, ids to release). Results kept here land in ``results``; a cancelled call's
        returns hold ``cancelled_error(call name)``."""
        forward: list[pb.ObjectData] = []
        decr: list[bytes] = []
        if msg.owner:
            # Answered through the head (in shared memory, or holding refs): the head
            # holds the returns for this process and pushes them here.
            if not any(rid in self.pushed_early for rid in c.rids):
                self.awaiting_push[c.tid] = c   # its arguments live until the push
            for rid in c.rids:
                self.unregistered.discard(rid)
                if rid in self.forward:   # registered from here: drops are in order
                    self.forward.discard(rid)
                elif rid in self.pushed_early:   # the head holds it already
                    self.pushed_early.discard(rid)
                    if rid not in local:
                        decr.append(rid)
                else:
                    self.via_head[rid] = rid not in local
            return forward, decr
        if msg.cancelled:
            # The callee's own error when it gave one (an async call cancelled while it
            # ran), else the plain cancelled error.
            given = msg.returns[0].error if msg.returns else b""
            err = given or cancelled_error(c.name)
            returns = [pb.ObjectData(object_id=rid, error=err) for rid in c.rids]
        else:
            returns = msg.returns
        for d in returns:
            oid = d.object_id
            if oid in self.forward:   # the head holds it for this process: send the data
                self.forward.discard(oid)
                forward.append(d)
            elif oid not in local:
                self.unregistered.discard(oid)
            if oid in local:
                results[oid] = d
        return forward, decr

    def unread(self, ids: Iterable[bytes]) -> list[bytes]:
        """Those of ``ids`` answered through the head and not pushed back here yet: the
        head knows them only once it has read their answers (DirectCalls.escape)."""
        via_head = self.via_head
        return [oid for oid in ids if oid in via_head] if via_head else []

    def pushed(self, oid: bytes, running: bool) -> bool:
        """The head pushed object ``oid`` here; ``running``: its direct call is not
        answered yet. True when the push releases a ref dropped meanwhile. A call
        answered through the head lets its arguments go now (awaiting_push)."""
        if self.awaiting_push:
            self.awaiting_push.pop(oid[:-4], None)
        if self.via_head and oid in self.via_head:
            return self.via_head.pop(oid)
        if running:
            self.pushed_early.add(oid)
        return False

    def unpushed(self, peer: Any) -> list[Call]:
        """The connection ``peer`` to a callee closed: its calls answered through the
        head whose results the head has not pushed here. The head may never read those
        answers (it voids what a dead node's workers said): they go to it again
        (AdoptCalls.answered), which runs them again should the callee die before its
        answer was read. They stay in ``awaiting_push``, their arguments held: the head
        pushes their results either way."""
        if not self.awaiting_push:
            return []
        return [c for c in self.awaiting_push.values() if c.peer is peer and c.rids]

    def keep_args(self, c: Call) -> bool:
        """``c`` was answered: True while its arguments must stay held (the callee has
        not said it counted what it keeps of them)."""
        if c.release and c.tid not in self.released_early:
            self.releasing[c.tid] = c
            return True
        self.released_early.discard(c.tid)
        return False

    def release_call(self, tid: bytes, running: bool) -> Call | None:
        """The callee counted what it keeps of ``tid``'s arguments (RELEASE_CALL):
        the call whose arguments may go now, if answered; else noted for its answer."""
        c = self.releasing.pop(tid, None)
        if c is None and running:
            self.released_early.add(tid)
        return c

    def peer_lost(self, peer: object) -> list[Call]:
        """The callee's process is gone, and what it kept of arguments with it."""
        gone = [c for c in self.releasing.values() if c.peer is peer]
        for c in gone:
            del self.releasing[c.tid]
        return gone
