"""Direct calls, the I/O: connections to actors' processes and to workers lent to this
driver, the frames sent on them, and the answers read from them.

    submit_actor --> ActorRoute (per actor) --plan_route--> EXECUTE on the actor's connection
    submit (shape lent) --> loan queue --plan_loans--> EXECUTE on a lent worker's connection
    answers (TASK_DONE) --> ResultBook.answered --> results, or data forwarded to the head
    connection closed --> unanswered calls handed to the head (ADOPT), later ones through it

The decisions are made in orchestra/_runtime/direct_core.py (no I/O, unit-tested); this module
carries them out for one CoreClient, whose socket, ref counts and results it shares.
Tasks on lent workers are _runtime/direct_loans.py's (LoanCalls, ``lent``). Locks: an
ActorRoute's own lock for its calls, the LoanCalls' lock for every loan and the queues of
tasks waiting for one, the client's ref lock for the ResultBook.
"""
from __future__ import annotations

import functools
import logging
import select
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from .._objects.errors import make_error
from .._objects.refs import RefCounts
from .._protocol import codec as _codec
from .._protocol import pb
from .._protocol import wire as _wire
from .._protocol.connection import Connection, Listener, is_tcp
from ..exceptions import ClusterLostError
from .direct_core import (
    ActorRoute,
    Call,
    Loan,
    Plan,
    ResultBook,
    plan_route,
)
from .direct_loans import LoanCalls

_log = logging.getLogger("orchestra")
PUSH_WAIT_S = 60.0   # the longest wait for the head to take a result answered through it


class Registry(Protocol):
    """The frames of the functions this process registered (submit.Submitter)."""

    function_frames: dict[bytes, bytes]


class Client(Protocol):
    """What direct calls use of their process's CoreClient: its connection to the head,
    ref counts, results, and the reading of every connection."""

    refs: RefCounts
    results: dict[bytes, pb.ObjectData]
    owned: set[bytes]
    lost: str | None
    conn_id: int
    poller: select.poll
    put_seq: int
    token: str | None   # the cluster token, for TCP direct calls (None: the environment's)

    def send(self, kind: int, msg: Any) -> None: ...
    def send_decided(self, decide: Callable[[], bytes]) -> None: ...
    def subscribe_missing(self, ids: Iterable[bytes]) -> None: ...
    @property
    def submitter(self) -> Registry: ...   # the functions registered (for lent workers)
    def wake(self) -> None: ...
    def wait_until(self, pred: Callable[[], bool], deadline: float | None) -> bool: ...
    def stir(self) -> None: ...


class Peer(Connection):
    """A connection between a caller and the process that runs its direct calls.
    ``route`` is set on the caller's side (the actor route or the loan); ``remote``: the
    process is on another node (a TCP address; one node's talk over unix sockets)."""

    __slots__ = ("route", "worker_id", "remote")

    def __init__(self, conn: Connection, route: ActorRoute | Loan | None, worker_id: int) -> None:
        super().__init__(conn.sock, conn.address)
        self.route = route
        self.worker_id = worker_id
        self.remote = is_tcp(conn.address)


def _cancelled_error(name: str) -> bytes:
    return make_error("cancelled", name=name)


class DirectCalls:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.book = ResultBook()
        self.routes: dict[bytes, ActorRoute] = {}       # actor id -> route
        self.call_route: dict[bytes, ActorRoute | Loan] = {}   # task id -> where it went, until answered
        self.waiting_routes: set[ActorRoute] = set()    # first call waits for an argument
        self.peers: dict[int, Peer] = {}
        self.to_close: list[Peer] = []
        self.listener: Listener | None = None
        self.tcp_listener: Listener | None = None   # on a cluster: callers on other nodes
        # An actor's worker: what to do with a frame from one of its callers.
        self.on_peer_frame: Callable[[Peer, int, Any], None] | None = None   # a worker's
        # Workers the head lent this driver, and the tasks waiting for them (direct_loans.py).
        self.lent = LoanCalls(self)

    # ------------------------------------------------------------------ shared helpers
    def _release(self, ids: list[bytes]) -> None:
        """Decrements due (under the ref lock)."""
        if ids and self.client.lost is None:
            self.client.refs.decr.extend(ids)

    def execute(self, plan: Plan, functions: bool = False) -> None:
        """Send a plan's calls, end its failed ones, resubmit the rest."""
        client = self.client
        for c, err in plan.failed:
            self.end_unsent(c, pb.TaskDone(task_id=c.tid, returns=[
                pb.ObjectData(object_id=rid, error=err.error) for rid in c.rids]))
        for route, sends in plan.sends.items():
            frames: list[bytes] = []
            for c, resolved in sends:
                self.call_route[c.tid] = route
                if functions and c.fid not in route.functions:   # the worker learns it here
                    route.functions.add(c.fid)
                    frames.append(client.submitter.function_frames[c.fid])
                frames.append(_codec.execute_frame(
                    c.call, [d.SerializeToString() for d in resolved] if resolved else (),
                    client.conn_id))
            client.stir()
            route.peer.send(frames[0] if len(frames) == 1 else b"".join(frames))
        for c in plan.resubmit:
            self._resubmit(c)

    def end_unsent(self, c: Call, msg: pb.TaskDone) -> None:
        """End a direct call here, unsent, with ``msg`` as its answer (cancelled, or its
        argument's error)."""
        self.call_route.pop(c.tid, None)
        client = self.client
        with client.refs.lock:
            forward, decr = self.book.answered(c, msg, client.refs.local, client.results,
                                               _cancelled_error)
            client.owned.difference_update(c.rids)
            self._release(decr)
        if forward:
            client.send(_wire.OBJECTS, pb.Objects(objects=forward))
        client.wake()

    def _resubmit(self, c: Call, escaped: bool = False) -> None:
        """Send a call that was to go direct through the head instead (``escaped``: the
        head knows its arguments already)."""
        self.call_route.pop(c.tid, None)
        if not escaped and self.book.unregistered:   # its arguments first: the head must know them
            self.escape([r._id for r in c.args])
        # The head counts its returns for this process from the Submit.
        self.client.send_decided(functools.partial(
            self._hand_over, [c], _codec.submit_frame(c.call)))

    def _hand_over(self, calls: list[Call], frame: bytes) -> bytes:
        """Under the connection's lock (send_decided): the head takes ``calls`` over
        with ``frame`` (their Submit, or AdoptCalls), sent at once. Handed over and
        sent as one: an escape of their results in another thread finds them handed
        over, sends nothing, and its task must not reach the head first."""
        self._handed_to_head(calls)
        return frame

    def hand_back(self, peer: Peer, lost: list[Call], worker_id: int, actor_id: bytes = b"") -> None:
        """The head takes over ``lost`` (sent on ``peer``, unanswered) and learns of the
        calls answered through it that it has not pushed here (AdoptCalls): their
        arguments first, as they may run again there (an actor's calls in flight fail,
        theirs stay here). Raises ClusterLostError."""
        with self.client.refs.lock:
            answered = self.book.unpushed(peer)
        if not lost and not answered:
            return
        again = answered if actor_id else (*answered, *lost)
        self.escape([r._id for c in again for r in (*c.args, *c.hold)])
        self.client.send_decided(functools.partial(self._adopt_frame, lost, peer, worker_id, actor_id))

    def _adopt_frame(self, lost: list[Call], peer: Peer, worker_id: int, actor_id: bytes) -> bytes:
        """Under the connection's lock (send_decided): AdoptCalls handing the head
        ``lost`` (sent on ``peer``, unanswered) and those answered through the head that
        it has not pushed here (ResultBook.unpushed), decided now: a push read before
        lets its call go, and the release that follows it comes after this frame."""
        with self.client.refs.lock:
            answered = self.book.unpushed(peer)
        if not lost and not answered:
            return b""
        return self._hand_over(lost, _wire.encode(_wire.ADOPT, pb.AdoptCalls(
            actor_id=actor_id, worker_id=worker_id,
            calls=[pb.Call.FromString(c.call) for c in (*answered, *lost)],
            cancelled=[c.tid for c in lost if c.cancelled and not actor_id],
            answered=[c.tid for c in answered])))

    def _handed_to_head(self, calls: Iterable[Call]) -> None:
        refs = self.client.refs
        with refs.lock:
            self._release(self.book.handed_to_head(calls, refs.local))

    def answered(self, c: Call, msg: pb.TaskDone, forward: list[pb.ObjectData],
                 answered: list[Call]) -> None:
        """A direct call's answer came: deliver it; its arguments go with ``answered``,
        or once the callee says it counted them (RELEASE_CALL)."""
        self.call_route.pop(c.tid, None)
        client = self.client
        with client.refs.lock:
            if not self.book.keep_args(c):
                answered.append(c)
            fwd, decr = self.book.answered(c, msg, client.refs.local, client.results,
                                           _cancelled_error)
            if not msg.owner:
                client.owned.difference_update(c.rids)
            self._release(decr)
        forward.extend(fwd)

    def escape(self, ids: Iterable[bytes], wait: bool = False) -> bool:
        """These refs leave this process (an argument through the head, or pickled in a
        value): results of direct calls only this process knows are told to the head
        first, with their data, or as pending while their call still runs. Those
        answered through the head and not pushed back here yet are known to it only
        once it has read their answers: ``wait`` (the caller holds no lock) waits for
        their pushes (await_pushes); else False says some are not yet (the caller waits
        for them without its locks, and decides again)."""
        book = self.book
        if not book.unregistered and not book.via_head:
            return True
        ids = list(ids)
        if book.unregistered:
            self._register(ids)
        if not book.via_head:
            return True
        if wait:
            self.await_pushes(ids)
            return True
        with self.client.refs.lock:
            return not self.book.unread(ids)

    def _register(self, ids: list[bytes]) -> None:
        """escape: tell the head the results among ``ids`` only this process knows."""
        client = self.client
        sent = False

        def decide() -> bytes:
            # Decided and sent as one (send_decided): a second thread passing the same
            # result finds it registered, sends nothing, and its task must not reach
            # the head before this registration.
            nonlocal sent
            with client.refs.lock:
                puts, pending = self.book.escape(ids, client.results)
            frames = b""
            if pending:
                frames += _wire.encode(_wire.REF_DELTA, pb.RefDelta(pending=pending))
            if puts:
                frames += _wire.encode(_wire.OBJECTS, pb.Objects(objects=puts))
            sent = bool(frames)
            return frames
        client.send_decided(decide)
        if sent:
            client.put_seq += 1

    def await_pushes(self, ids: Sequence[bytes]) -> bool:
        """Wait until the head has pushed back the results among ``ids`` that were
        answered through it (ResultBook.via_head): it has read their callee's TaskDone
        then. A frame naming one, sent on this process's connection before, can reach
        the head before that TaskDone (it comes on the callee's connection), and the
        head does not know the object yet. The push comes once the head read the
        answer, or ran the call again or failed it when its callee died first (the
        hand-back, AdoptCalls.answered); a lost head ends the wait (ClusterLostError).
        The caller holds no lock: the thread that reads may need it. Bounded by
        PUSH_WAIT_S, then sent anyway (the head fails what names an unknown object):
        False then."""
        with self.client.refs.lock:
            due = self.book.unread(ids)
        if not due:
            return True
        via_head = self.book.via_head
        # Read without the ref lock (wait_until calls it under its condition): a
        # membership test; one read stale is read again.
        if self.client.wait_until(lambda: not any(oid in via_head for oid in due),
                                  time.monotonic() + PUSH_WAIT_S):
            return True
        _log.warning("the head did not take the result of a direct call within %g s; "
                     "a task naming it may fail with ObjectLostError", PUSH_WAIT_S)
        return False

    def last_ref_gone(self, oid: bytes) -> bool:
        """Under the ref lock: the last ref of ``oid`` here went; True when the head
        holds a count for this process."""
        if oid in self.routes:   # the last handle of an actor here: close its route
            route = self.routes.pop(oid)
            if route.peer is not None:
                self.to_close.append(route.peer)
        return self.book.last_ref_gone(oid) is None

    def watching(self) -> bool:
        """Whether pushes from the head concern direct calls (see pushed)."""
        return bool(self.call_route or self.book.via_head or self.lent.busy_tasks
                    or self.book.awaiting_push)

    def pushed(self, objects: Iterable[pb.ObjectData]) -> list[Loan]:
        """The head pushed these objects here (under the ref lock). Returns the lent
        workers that ended what the head had sent them (pump_woken, without that lock)."""
        woken: list[Loan] = []
        for d in objects:
            oid = d.object_id
            if self.book.pushed(oid, oid[:-4] in self.call_route) and self.client.lost is None:
                self.client.refs.decr.append(oid)   # dropped before the head held it
            busy_tasks = self.lent.busy_tasks
            if busy_tasks:
                busy = busy_tasks.pop(oid[:-4], None)
                if busy is not None:
                    busy.busy = 0
                    woken.append(busy)
        return woken

    def release_call(self, tid: bytes) -> None:
        """RELEASE_CALL: the callee counted what it keeps of the call's arguments."""
        self.book.release_call(tid, tid in self.call_route)

    # ------------------------------------------------------------------ actor calls
    def route(self, actor_id: bytes) -> ActorRoute:
        route = self.routes.get(actor_id)
        if route is None:
            with self.client.refs.lock:
                route = self.routes.setdefault(actor_id, ActorRoute(actor_id))
        return route

    def _queue_actor_call(self, route: ActorRoute, c: Call) -> None:
        """Send an actor call direct, in order once its ref arguments are here (holds
        route.lock; route.direct())."""
        with self.client.refs.lock:
            self.client.owned.update(c.rids)
            self.book.sent(c.rids)
        route.queue.append(c)
        self.call_route[c.tid] = route
        self.pump_route(route)

    def call_actor(self, route: ActorRoute, c: Call, through_head: Callable[[], None]) -> None:
        """Send an actor call: straight to the actor once the route is direct, else
        through the head, counted in ``via_head``: ``through_head()`` sends its Submit
        once the head knows its ref arguments (escape). Those answered through the head
        are waited for without route.lock (the thread that reads takes it)."""
        ids = [r._id for r in c.args]
        waited_out = False
        while True:
            with route.lock:
                if route.direct() or (route.queue and route.peer is None):
                    self._queue_actor_call(route, c)   # (or behind those going to the head)
                    return
                if self.escape(ids) or waited_out:
                    route.via_head += 1
                    through_head()
                    return
            waited_out = not self.await_pushes(ids)

    def pump_route(self, route: ActorRoute) -> None:
        """Send the route's queued calls in order while their ref arguments are here
        (the caller holds route.lock); through the head, in order, when the route lost
        its actor's process."""
        if route.peer is None or route.dispatched < route.via_head:
            if route.queue:
                self._requeue_through_head(route)
            return
        plan = plan_route(route, self.client.results)
        if route.queue:
            self.waiting_routes.add(route)
        else:
            self.waiting_routes.discard(route)
        self.execute(plan)
        if plan.missing:
            self.client.subscribe_missing(plan.missing)

    def pump_waiting(self) -> None:
        for route in list(self.waiting_routes):
            with route.lock:
                self.pump_route(route)

    def retire_route(self, actor_id: bytes) -> None:
        """The actor is being killed: later calls go through the head (which holds them
        for a restarted instance); calls in flight end with the process."""
        route = self.routes.get(actor_id)
        if route is None:
            return
        with route.lock:
            if route.peer is not None:
                route.stale.add(route.peer.worker_id)
                route.peer = None
            self._requeue_through_head(route)

    def _requeue_through_head(self, route: ActorRoute) -> None:
        """Send the route's unsent calls through the head, in order (holds route.lock),
        each once the head knows its ref arguments (escape): the rest wait, queued,
        for the push of one answered through the head (pump_waiting goes on)."""
        queue = route.queue
        while queue:
            if not self.escape([r._id for r in queue[0].args]):
                self.waiting_routes.add(route)
                return
            route.via_head += 1
            self._resubmit(queue.popleft(), True)
        self.waiting_routes.discard(route)

    def actor_address(self, msg: pb.ActorAddress) -> None:
        route = self.routes.get(msg.actor_id)
        if route is None:
            return
        with route.lock:
            if msg.worker_id in route.stale:
                return
            route.dispatched = max(route.dispatched, msg.dispatched)
            if route.peer is not None:
                if route.peer.worker_id == msg.worker_id:
                    return
                route.stale.add(route.peer.worker_id)   # a restarted instance: the old one ends
            try:
                conn = Connection.connect_once(msg.path, self.client.token)
            except OSError:
                route.stale.add(msg.worker_id)
                route.peer = None
                return
            route.peer = self.add_peer(conn, route, msg.worker_id)

    # ------------------------------------------------------------------ cancel
    def cancel(self, tid: bytes, force: bool, recursive: bool = False) -> bool:
        """Cancel a direct call here; False when the head must do it."""
        route = self.call_route.get(tid)
        if isinstance(route, Loan) or (route is None and self.lent.loans):
            if self.lent.cancel(tid, force, route, recursive):
                return True
            route = None
        if isinstance(route, ActorRoute):
            with route.lock:
                c = route.inflight.get(tid)
                if c is not None and c.peer is not None:
                    c.peer.send(_wire.encode(_wire.CANCEL_TASK, pb.CancelTask(
                        task_id=tid, recursive=recursive)))
                    return True
                for c in route.queue:
                    if c.tid == tid:
                        route.queue.remove(c)
                        self.end_unsent(c, pb.TaskDone(task_id=tid, cancelled=True))
                        return True
        return False

    # ------------------------------------------------------------------ peers
    def listen(self, path: str) -> None:
        """Take direct calls to this process (an actor's or a lent worker) at ``path``."""
        self.listener = Listener(path)
        self.client.poller.register(self.listener.fileno(), select.POLLIN)

    def listen_tcp(self, host: str, token: str) -> str:
        """Take direct calls from other nodes too, over TCP on ``host`` (each caller
        proves the cluster token first); the address, HOST:PORT."""
        self.tcp_listener = Listener(f"{host}:0", token=token)
        for fd in self.tcp_listener.fds:   # the port, and the wake of proven callers
            self.client.poller.register(fd, select.POLLIN)
        return self.tcp_listener.address

    def add_peer(self, conn: Connection, route: ActorRoute | Loan | None, worker_id: int) -> Peer:
        peer = Peer(conn, route, worker_id)
        self.peers[peer.fd] = peer
        self.client.poller.register(peer.fd, select.POLLIN)
        return peer

    def read(self, fd: int, buf: bytearray, view: memoryview) -> None:
        """Something to read on ``fd``: a new caller, or frames from a peer."""
        for listener in (self.listener, self.tcp_listener):
            if listener is not None and fd in listener.fds:
                while True:
                    conn = listener.accept()
                    if conn is None:
                        return
                    self.add_peer(conn, None, 0)
        peer = self.peers.get(fd)
        if peer is None:
            try:
                self.client.poller.unregister(fd)
            except (KeyError, ValueError):
                pass
            return
        n = peer.recv_into(buf)
        if not n:
            self._peer_lost(peer)
            return
        try:
            frames = peer.feed(view[:n])
        except _wire.ProtocolError:
            self._peer_lost(peer)
            return
        self._dispatch_peer(peer, frames)

    def _dispatch_peer(self, peer: Peer, frames: list[tuple[int, Any]]) -> None:
        route = peer.route
        client = self.client
        client.stir()
        if route is None:   # this is an actor's (or lent) worker: calls from a caller
            if self.on_peer_frame is not None:
                for kind, msg in frames:
                    self.on_peer_frame(peer, kind, msg)
            client.wake()
            return
        if isinstance(route, Loan):
            self.lent.dispatch(route, frames)
            if self.waiting_routes:
                self.pump_waiting()
            return
        forward: list[pb.ObjectData] = []
        answered: list[Call] = []
        with route.lock:
            for kind, msg in frames:
                if kind != _wire.TASK_DONE:
                    continue
                c = route.inflight.pop(msg.task_id, None)
                if c is None:
                    continue
                self.answered(c, msg, forward, answered)
        client.wake()
        if forward:
            client.send(_wire.OBJECTS, pb.Objects(objects=forward))
        del answered   # their argument refs and the actor's token may go now
        if self.waiting_routes:
            self.pump_waiting()

    def _peer_lost(self, peer: Peer) -> None:
        """A connection to (or from) a process taking direct calls closed."""
        self.close_peer(peer)
        route = peer.route
        if route is None:
            return   # a caller left: answers to it go through the head
        # The process is gone: what it kept of arguments went with it.
        self.book.peer_lost(peer)
        if isinstance(route, Loan):
            self.lent.lost(route, peer)
            return
        client = self.client
        with route.lock:
            route.stale.add(peer.worker_id)
            if route.peer is peer:
                route.peer = None
            lost = [c for c in route.inflight.values() if c.peer is peer]
            for c in lost:
                del route.inflight[c.tid]
                self.call_route.pop(c.tid, None)
            if client.lost is None:
                try:
                    self.hand_back(peer, lost, peer.worker_id, route.actor_id)
                except ClusterLostError:
                    return
            elif lost:
                self._handed_to_head(lost)
            if route.peer is None and route.queue and client.lost is None:
                try:
                    self._requeue_through_head(route)
                except ClusterLostError:
                    pass
        del lost

    def close_peer(self, peer: Peer) -> None:
        if self.peers.pop(peer.fd, None) is not None:
            try:
                self.client.poller.unregister(peer.fd)
            except (KeyError, ValueError):
                pass
        peer.close()

    def close_pending(self) -> None:
        closing, self.to_close = self.to_close, []
        for peer in closing:
            self.close_peer(peer)

    def close(self) -> None:
        for peer in list(self.peers.values()):
            peer.close()
        if self.listener is not None:
            self.listener.close()
        if self.tcp_listener is not None:
            self.tcp_listener.close()
