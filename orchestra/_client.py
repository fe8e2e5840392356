"""Core client: one process's connection to the scheduler (driver or worker).

    user thread --submit/put/refs--> send(): [pending increments][frame][pending decrements]
                                        |   one sendall on the unix socket, under a lock
    reader thread <--frames-- head: Objects (results pushed to their owner, or to
        subscribers) land in ``_results``; Replies wake their requester; worker frames
        (Execute, CancelTask, ...) go to ``on_frame``.

Reference counts: ``add_ref``/``remove_ref`` keep this process's count per object id.
A first ref is announced (increment) before the next frame, a last ref dropped
(decrement) after it: a hold the scheduler must see is never outrun by the release that
follows it. Refs made by submit and put are counted by the scheduler when it sees the
Submit/put, so they are not announced.
"""
from __future__ import annotations

import collections
import itertools
import logging
import mmap
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import _ids, _wire
from . import _pb as pb
from ._errors import make_error
from ._object_ref import ObjectRef
from ._resources import shape_key
from ._serialization import Serialized, deserialize, serialize
from ._store import map_ahead, map_segment, open_segment, write_into
from .exceptions import (
    ClusterLostError,
    GetTimeoutError,
    ObjectLostError,
    ObjectStoreFullError,
    OrchestraError,
)

# Why every call fails once the head's connection is gone (ClusterLostError).
_LOST = ("lost the connection to the cluster: its head process exited (it crashed or was "
         "killed). This session is over: orchestra.init() starts a new cluster")

_log = logging.getLogger("orchestra")

_FLUSH_INTERVAL_S = 0.02
# Ids a blocked get() names to the head (Blocked): enough to find a task to run inline
# (_blocking.py), without a frame the size of a get of 100k refs.
_BLOCKED_IDS = 256
_LEASE_DEPTH = 8       # tasks sent ahead to one lent worker
_LEASE_IDLE_S = 0.2    # a lent worker with nothing to do for this long goes back
_LEASE_ASK_S = 0.05    # at most one request for another lent worker per shape this often
_LEASE_SLOW_S = 0.2    # tasks queued behind one running this long on a lent worker move on


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited protobuf field: messages concatenate into valid encodings."""
    return tag + _varint(len(payload)) + payload


class CoreClient:
    def __init__(self, sock_path: str, hello: Any, *, connect_timeout_s: float = 30.0,
                 on_frame: Callable[[int, Any], None] | None = None,
                 on_lost: Callable[[], None] | None = None,
                 socket_guard: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
                 start: bool = True) -> None:
        if socket_guard is not None:
            # The owner wraps every method that reads or writes the socket (a worker
            # defers its cancel signal past them: raised inside, it cut frames in half).
            self.send_raw = socket_guard(self.send_raw)          # type: ignore[method-assign]
            self._read_once = socket_guard(self._read_once)      # type: ignore[method-assign]
        self.sock = _connect(sock_path, connect_timeout_s)
        self.on_frame = on_frame
        self.on_lost = on_lost
        # A worker's hook for a get()/wait() that blocks: on_block(True, missing ids)
        # answers whether this thread may run tasks inline while it waits (the head
        # sends them as EXECUTE_NESTED); nested_ready() says one came, run_nested() runs
        # it. on_block(False, ()) when the wait ends.
        self.on_block: Callable[[bool, Sequence[bytes]], bool] | None = None
        self.nested_ready: Callable[[], bool] = _never
        self.run_nested: Callable[[], None] | None = None
        self._send_lock = threading.Lock()
        self._ref_lock = threading.RLock()   # re-entered when GC runs __del__ inside it
        self._local: dict[bytes, int] = {}
        self._incr: list[bytes] = []
        self._decr: list[bytes] = []
        self._pin: list[str] = []      # segments mapped here (sent with increments)
        self._unpin: list[str] = []    # segments whose last view died (sent with decrements)
        self._results: dict[bytes, Any] = {}
        # Maps of objects read here, kept while the ref lives (a second get is ~15 us, a
        # new map of 512 MiB ~80 us): (map, segment name). The store asks for them back
        # (RELEASE_MAPS) when it needs to spill their objects; views still held keep
        # their map alive and pinned.
        self._maps: dict[bytes, tuple[mmap.mmap, str]] = {}
        # Read-write maps of the segments this process filled, kept for when the store
        # hands one back: mapping 512 MiB costs ~100 ms (page tables, then unmap), the
        # copy itself ~50 ms. The head says when a segment is unlinked (DROP_MAPS).
        self._wmaps: dict[str, mmap.mmap] = {}
        self._mapping_ahead: dict[str, bool] = {}   # name -> still wanted
        self._owned: set[bytes] = set()       # returns of my tasks: pushed to me when sealed
        self._subscribed: set[bytes] = set()
        self._cond = threading.Condition()
        self._sleepers = 0   # threads waiting on _cond (see _wake)
        self._read_lock = threading.Lock()   # held by the one thread reading the socket
        self._replies: dict[int, list[Any]] = {}
        self._req_ids = itertools.count(1)
        self._registered: set[bytes] = set()
        self._function_frames: dict[bytes, bytes] = {}
        self.templates: dict[Any, bytes] = {}   # serialized Call templates of actor methods
        self._keep_until_sent: list[ObjectRef] = []
        self.lost: str | None = None
        self._closing = False
        # Calls sent straight to actors' processes (see _Lane): one lane per actor called,
        # connections to those processes (and, in an actor's worker, from its callers)
        # by file descriptor. Results of straight calls that only this process knows
        # (_unregistered) are told to the head once their refs leave it (_escape);
        # those told while still running have their data forwarded on arrival (_forward).
        self._lanes: dict[bytes, _Lane] = {}
        self._call_lane: dict[bytes, _Lane | _Lease] = {}   # task id -> lane/lease, until answered
        self._waiting_lanes: set[_Lane] = set()    # lanes whose first call waits for an argument
        self._peers: dict[int, _Peer] = {}
        self._to_close: list[_Peer] = []
        self._listener: socket.socket | None = None
        self.on_peer_frame: Callable[[_Peer, int, Any], None] | None = None
        self._unregistered: set[bytes] = set()
        self._forward: set[bytes] = set()
        # Results of straight calls answered through the head, until the head pushes
        # them: a drop waits for that (id -> dropped), as the head may not hold it yet.
        self._via_head: dict[bytes, bool] = {}
        self._pushed_early: set[bytes] = set()   # ... or pushed before the actor's answer came
        # Straight calls answered whose arguments stay held until the actor's counts of
        # them reached the head (RELEASE_CALL): task id -> call.
        self._releasing: dict[bytes, _Call] = {}
        self._released_early: set[bytes] = set()   # told before the answer came
        # Frames that create objects (puts, registrations) sent / known handled by the
        # head: refs inside a straight call's arguments must exist there before the
        # actor counts them.
        self._put_seq = 0
        self._synced_seq = 0
        # Straight calls sent or taken since the last look: the head does not see them,
        # and counts the cluster idle (it then warms memory, a core's work) unless told.
        self._active = False
        # Workers the head lent this driver (Lease), by resource shape, and the tasks
        # of each shape waiting for room on them; one lock for all of it.
        self._task_lock = threading.Lock()
        self._task_lanes: dict[tuple[tuple[str, float], ...], list[_Lease]] = {}
        self._task_queue: dict[tuple[tuple[str, float], ...], collections.deque[_Call]] = {}
        self._lease_asked: dict[tuple[tuple[str, float], ...], float] = {}
        self._leasing = False   # a worker was ever lent here
        self._busy_tasks: dict[bytes, _Lease] = {}   # task sent by the head -> lent worker running it
        self._fd = self.sock.fileno()
        self.sock.sendall(_wire.encode(_wire.HELLO, hello))
        self._early_frames: list[tuple[int, Any]] = []   # came with the handshake's reply
        self.info = self._read_hello(connect_timeout_s)
        self.inline_threshold = self.info.inline_threshold or 100 * 1024
        self.conn_id = self.info.conn_id
        self.shm_dir = self.info.shm_dir   # the session's private directory of segments
        self._poller = select.poll()
        self._poller.register(self.sock.fileno(), select.POLLIN)
        # One reused buffer: recv(1 MiB) would allocate (and fault in) 1 MiB per read.
        self._buf = bytearray(1 << 18)
        self._view = memoryview(self._buf)
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._background, name="orchestra-reader", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Dispatch what came with the handshake and start the reader thread. A worker
        calls it once its handlers can run: a STEAL that reached its handler before the
        worker held its client killed the reader thread, and the worker kept its CPU and
        tasks without reading again."""
        if self._early_frames:
            frames, self._early_frames = self._early_frames, []
            self._dispatch(frames)
        self._reader.start()

    def _read_hello(self, timeout_s: float) -> Any:
        self.sock.settimeout(timeout_s)
        dec = _wire.FrameDecoder()
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    raise ClusterLostError("the head closed the connection during the handshake")
                frames = dec.feed(data)
                for i, (kind, msg) in enumerate(frames):
                    if kind == _wire.HELLO_REPLY:
                        self.sock.settimeout(None)
                        self._decoder = dec
                        self._early_frames = frames[i + 1:]   # sent right after the reply
                        return msg
        except TimeoutError as exc:
            raise ClusterLostError(f"the head did not answer within {timeout_s:g} s") from exc

    # ------------------------------------------------------------------ sending
    def send_raw(self, frame: bytes) -> None:
        """Send one encoded frame, with the pending reference changes around it."""
        with self._send_lock:
            pre = post = b""
            if self._incr or self._decr or self._pin or self._unpin:
                with self._ref_lock:
                    incr, self._incr = self._incr, []
                    decr, self._decr = self._decr, []
                    pin, self._pin = self._pin, []
                    unpin, self._unpin = self._unpin, []
                if incr or pin:
                    pre = _wire.encode(_wire.REF_DELTA, pb.RefDelta(incr=incr, pin=pin))
                if decr or unpin:
                    post = _wire.encode(_wire.REF_DELTA, pb.RefDelta(decr=decr, unpin=unpin))
            try:
                self.sock.sendall(pre + frame + post if (pre or post) else frame)
            except OSError as exc:
                if self.lost is None:
                    self.lost = f"{_LOST} ({exc.strerror or exc})"
                raise ClusterLostError(self.lost) from exc

    def send(self, kind: int, msg: Any) -> None:
        self.send_raw(_wire.encode(kind, msg))

    def flush_refs(self, wait: bool = False) -> None:
        """Send pending reference changes. ``wait``: also wait for those another thread
        took and is sending (an answer sent on another connection must not overtake them)."""
        if (self._incr or self._decr or self._pin or self._unpin) and self.lost is None:
            try:
                self.send_raw(b"")
            except ClusterLostError:
                pass
        elif wait:
            with self._send_lock:
                pass

    def request(self, req: Any, timeout_s: float = 60.0) -> Any:
        if req.WhichOneof("body") == "query" and req.query != "sync" and self._leasing:
            # The head's answer counts lent workers as busy: give back the idle ones, with
            # those whose grant is on its way here (read by the time the sync answers).
            self.request(pb.Request(query="sync"))
            self.return_idle_leases()
        rid = next(self._req_ids)
        req.req_id = rid
        slot: list[Any] = [None]
        self._replies[rid] = slot
        seq = self._put_seq
        self.send(_wire.REQUEST, req)
        self._keep_until_sent = []
        if not self.wait_until(lambda: slot[0] is not None, time.monotonic() + timeout_s):
            self._replies.pop(rid, None)
            raise GetTimeoutError(f"the head did not answer a request within {timeout_s:g} s")
        reply = slot[0]
        self._synced_seq = max(self._synced_seq, seq)
        if reply.error:
            if reply.error_kind == "ObjectStoreFullError":
                raise ObjectStoreFullError(reply.error)
            if reply.error_kind == "ObjectLostError":
                raise ObjectLostError(reply.error)
            raise OrchestraError(reply.error)
        return reply

    # ------------------------------------------------------------------ refs
    def add_ref(self, oid: bytes, counted: bool) -> None:
        with self._ref_lock:
            n = self._local.get(oid, 0)
            self._local[oid] = n + 1
            if n == 0 and not counted:
                self._incr.append(oid)

    def remove_ref(self, oid: bytes) -> None:
        with self._ref_lock:
            n = self._local.get(oid, 0) - 1
            if n > 0:
                self._local[oid] = n
                return
            self._local.pop(oid, None)
            self._results.pop(oid, None)
            self._maps.pop(oid, None)
            self._owned.discard(oid)
            self._subscribed.discard(oid)
            if oid in self._lanes:   # the last handle of an actor here: close its lane
                lane = self._lanes.pop(oid)
                if lane.peer is not None:
                    self._to_close.append(lane.peer)
            if oid in self._unregistered:   # the head never knew it
                self._unregistered.discard(oid)
            elif oid in self._via_head:
                self._via_head[oid] = True
            elif self.lost is None:
                self._decr.append(oid)

    # ------------------------------------------------------------------ tasks
    def register_function(self, function_id: bytes, req_bytes: bytes) -> None:
        if function_id not in self._registered:
            self.send_raw(req_bytes)
            self._registered.add(function_id)
            self._function_frames[function_id] = req_bytes   # for lent workers

    def _encode_call(self, template: bytes, tid: bytes, args: Sequence[Any], kwargs: dict[str, Any],
                     refs: list[ObjectRef], hold: list[ObjectRef] | None = None) -> bytes:
        """A serialized Call; ``refs`` gets the ref arguments in order (with the puts
        made for large values), which must live until the call is sent; ``hold`` gets
        refs to those pickled inside the arguments."""
        if not args and not kwargs:
            return template + b"\x0a\x0c" + tid
        parts = [template, b"\x0a\x0c", tid]
        nested: list[bytes] = []
        for value in itertools.chain(args, kwargs.values()):
            parts.append(_field(b"\x1a", self._arg_value(value, refs, nested)))
        for name in kwargs:
            parts.append(_field(b"\x22", name.encode()))
        for oid in nested:
            parts.append(_field(b"\x4a", oid))
        if nested:
            self._escape(nested)
            if hold is not None:
                hold.extend(ObjectRef(oid, self) for oid in nested)
        return b"".join(parts)

    def submit(self, template: bytes, num_returns: int, args: Sequence[Any],
               kwargs: dict[str, Any], shape: tuple[tuple[str, float], ...] | None = None,
               name: str = "", function_id: bytes = b"") -> list[ObjectRef]:
        """Submit one task. ``template`` is a serialized Call with the per-function fields.
        ``shape``: its resource shape, when it may go straight to a worker lent to this
        process (then it does, if one of that shape is lent and its arguments are here)."""
        tid = _ids.next_task_id()
        refs: list[ObjectRef] = []     # puts made for large args live until the Submit is sent
        hold: list[ObjectRef] | None = [] if shape is not None and self._task_lanes else None
        call = self._encode_call(template, tid, args, kwargs, refs, hold)
        rids = [tid + i.to_bytes(4, "big") for i in range(num_returns)]
        out = [ObjectRef(rid, self, counted=True) for rid in rids]
        if shape is not None and hold is not None and self._task_lanes.get(shape) \
                and (not refs or all(r._id in self._results for r in refs)):
            if hold and self._put_seq > self._synced_seq:
                self.request(pb.Request(query="sync"))   # the head knows every ref in the arguments
            with self._task_lock:
                if self._task_lanes.get(shape):
                    with self._ref_lock:
                        self._owned.update(rids)
                        self._unregistered.update(rids)
                    c = _Call(tid, call, refs, None, rids, name, hold)
                    c.fid = function_id
                    q = self._task_queue[shape]
                    q.append(c)
                    if len(q) == 1:   # else the lent workers are full: an answer pumps
                        self._pump_tasks(shape)
                    return out
        with self._ref_lock:
            self._owned.update(rids)
        self._send_submit(call, refs)
        del refs
        return out

    # ------------------------------------------------------------------ leased workers
    def _pump_tasks(self, shape: tuple[tuple[str, float], ...]) -> None:
        """Send queued tasks of ``shape`` to the least busy lent workers; through the head
        when none can take them (all given back or blocked). Holds _task_lock."""
        q = self._task_queue.get(shape)
        if not q:
            return
        leases = [le for le in self._task_lanes.get(shape, ()) if not le.revoked and not le.blocked]
        sends: dict[_Lease, list[bytes]] = {}
        now = time.monotonic()
        while q and leases:
            best = min(leases, key=_load)
            if _load(best) >= _LEASE_DEPTH:
                break
            c = q.popleft()
            resolved: list[Any] = []
            if c.args:
                maybe = [self._results.get(r._id) for r in c.args]
                if any(d is None for d in maybe):
                    self._resubmit(c)
                    continue
                resolved = maybe
                if self._failed_argument(c, resolved):
                    continue
            c.peer = best.peer
            c.release = bool(c.hold) or any(d.WhichOneof("data") == "segment" for d in resolved)
            best.inflight[c.tid] = c
            best.idle_since = now
            self._call_lane[c.tid] = best
            frames = sends.setdefault(best, [])
            if c.fid not in best.functions:   # the worker learns the function from here
                best.functions.add(c.fid)
                frames.append(self._function_frames[c.fid])
            frames.append(self._execute_frame(c, resolved))
        for lease, frames in sends.items():
            self._active = True
            lease.peer.send(frames[0] if len(frames) == 1 else b"".join(frames))
        if q and not leases:
            while q:
                self._resubmit(q.popleft())
        else:
            self._ask_for_lease(shape, leases, now)

    def _ask_for_lease(self, shape: tuple[tuple[str, float], ...], leases: list[_Lease],
                       now: float) -> None:
        """Tasks wait behind others: ask the head for another worker of ``shape``, if
        one is idle (at most every _LEASE_ASK_S; the reader asks again while they wait)."""
        if now - self._lease_asked.get(shape, 0.0) > _LEASE_ASK_S \
                and (self._task_queue.get(shape) or any(_load(le) > 1 for le in leases)):
            self._lease_asked[shape] = now
            self.send(_wire.LEASE, pb.Lease(resources=dict(shape)))

    def _failed_argument(self, c: _Call, resolved: list[Any]) -> bool:
        """A call whose ref argument holds an error fails with that error, unsent (as
        through the head: it does not run)."""
        for d in resolved:
            if d.WhichOneof("data") == "error":
                self._end_unsent(c, pb.TaskDone(task_id=c.tid, returns=[
                    pb.ObjectData(object_id=rid, error=d.error) for rid in c.rids]))
                return True
        return False

    def _end_unsent(self, c: _Call, msg: Any) -> None:
        """End a straight call here, unsent, with ``msg`` as its answer (cancelled, or
        its argument's error)."""
        self._call_lane.pop(c.tid, None)
        forward: list[Any] = []
        self._direct_done(c, msg, forward)
        if forward:
            self.send(_wire.OBJECTS, pb.Objects(objects=forward))
        self._wake()

    def _execute_frame(self, c: _Call, resolved: list[Any]) -> bytes:
        inv = [_field(b"\x0a", c.call)]
        for d in resolved:
            inv.append(_field(b"\x12", d.SerializeToString()))
        inv.append(b"\x20\x01\x28")
        inv.append(_varint(self.conn_id))
        body = _field(b"\x0a", b"".join(inv))
        return (len(body) + 1).to_bytes(4, "little") + bytes((_wire.EXECUTE,)) + body

    def _resubmit(self, c: _Call) -> None:
        """Send a call that was to go straight through the head instead."""
        self._call_lane.pop(c.tid, None)
        self._handed_to_head([c])   # the head counts its returns for this process from the Submit
        self._send_submit(c.call, c.args)

    def _handed_to_head(self, calls: Iterable[_Call]) -> None:
        """The head takes over these calls (resent, or adopted): it holds their returns
        for this process from now on; those this process dropped already are let go."""
        with self._ref_lock:
            for c in calls:
                self._released_early.discard(c.tid)
                for rid in c.rids:
                    self._unregistered.discard(rid)
                    self._forward.discard(rid)
                    self._pushed_early.discard(rid)
                    if rid not in self._local and self.lost is None:
                        self._decr.append(rid)

    def _lease_granted(self, msg: Any) -> None:
        self._leasing = True
        shape = shape_key(msg.resources)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(msg.path)
        except OSError:   # the worker is gone (or the cluster stops): give it back
            sock.close()
            try:
                self.send(_wire.LEASE_RETURN, pb.Lease(worker_id=msg.worker_id))
            except ClusterLostError:
                pass
            return
        lease = _Lease(msg.worker_id, msg.pid, shape)
        if msg.busy_task:   # it runs that task of ours first: until its result comes
            lease.busy = 1
            self._busy_tasks[msg.busy_task] = lease
        lease.peer = self._add_peer(sock, lease, msg.worker_id)
        with self._task_lock:
            self._task_lanes.setdefault(shape, []).append(lease)
            self._task_queue.setdefault(shape, collections.deque())
            self._pump_tasks(shape)
            if not _load(lease):
                self._steal_for(lease)

    def _lease_revoked(self, worker_id: int) -> None:
        with self._task_lock:
            for leases in self._task_lanes.values():
                for lease in leases:
                    if lease.worker_id == worker_id:
                        lease.revoked = True
                        if not lease.inflight:
                            self._give_back_lease(lease)
                        elif len(lease.inflight) > 1:
                            self._take_back(lease)   # the head places them
                        self._pump_tasks(lease.shape)
                        return

    def _give_back_lease(self, lease: _Lease) -> None:
        """Holds _task_lock; the lease has no task unanswered."""
        leases = self._task_lanes.get(lease.shape)
        if leases is not None and lease in leases:
            leases.remove(lease)
            if not leases:
                del self._task_lanes[lease.shape]
        self._to_close.append(lease.peer)
        if self.lost is None:
            try:
                self.send(_wire.LEASE_RETURN, pb.Lease(worker_id=lease.worker_id))
            except ClusterLostError:
                pass

    def return_idle_leases(self, min_idle_s: float = 0.0, ask: bool = False) -> None:
        """Give back lent workers with no task unanswered for ``min_idle_s``; ``ask``:
        and ask for more where tasks wait behind others."""
        if not self._task_lanes:
            return
        now = time.monotonic()
        with self._task_lock:
            for shape, leases in list(self._task_lanes.items()):
                if ask:
                    self._ask_for_lease(shape, leases, now)
                    for lease in leases:
                        if _load(lease) > 1 and lease.inflight and not lease.stealing \
                                and now - lease.idle_since > _LEASE_SLOW_S:
                            self._take_back(lease)   # queued behind a long task
                if self._task_queue.get(shape) or any(
                        le.stealing or _load(le) > 1 for le in leases):
                    continue   # tasks of this shape wait: an idle lent worker is about to take them
                for lease in list(leases):
                    if not lease.inflight and now - lease.idle_since >= min_idle_s:
                        self._give_back_lease(lease)

    def _take_back(self, lease: _Lease) -> None:
        """Ask a lent worker for the tasks it has not started, and send it no more until
        its running task answers: they go to another lent worker, or through the head.
        Holds _task_lock."""
        lease.blocked = True
        lease.stealing = True
        lease.peer.send(_wire.encode(_wire.STEAL, pb.ReturnTasks(task_ids=list(lease.inflight))))

    def _steal_for(self, idle: _Lease) -> None:
        """A lent worker has nothing left: take back tasks queued behind a running one
        on another (a quick task never waits long behind a slow one). Holds _task_lock."""
        for lease in self._task_lanes.get(idle.shape, ()):
            if lease is not idle and lease.inflight and not lease.stealing:
                # All of them: the worker gives back only those not started (it may be
                # running a task the head sent it before lending it).
                lease.stealing = True
                ids = list(lease.inflight)
                lease.peer.send(_wire.encode(_wire.STEAL, pb.ReturnTasks(task_ids=ids)))

    def _dispatch_lease(self, lease: _Lease, frames: list[tuple[int, Any]]) -> None:
        forward: list[Any] = []
        answered: list[_Call] = []
        with self._task_lock:
            returned: list[_Call] = []
            for kind, msg in frames:
                if kind == _wire.TASK_DONE:
                    c = lease.inflight.pop(msg.task_id, None)
                    if c is None:
                        continue
                    lease.blocked = False
                    lease.busy = 0   # what the head sent it ran before this
                    self._answered(c, msg, forward, answered)
                elif kind == _wire.RETURN_TASKS:
                    for tid in msg.task_ids:
                        c = lease.inflight.pop(tid, None)
                        if c is not None:
                            self._call_lane.pop(tid, None)
                            returned.append(c)
                    if not lease.stealing:
                        lease.blocked = True   # its running task waits in get()
                    lease.stealing = False
            lease.idle_since = time.monotonic()
            q = self._task_queue.setdefault(lease.shape, collections.deque())
            q.extendleft(reversed(returned))
            if returned or _load(lease) <= _LEASE_DEPTH // 2:
                self._pump_tasks(lease.shape)
            if lease.revoked and not lease.inflight:
                self._give_back_lease(lease)
            elif not lease.inflight and not q:
                self._steal_for(lease)
        self._wake()
        if forward:
            self.send(_wire.OBJECTS, pb.Objects(objects=forward))
        del answered

    def _lease_lost(self, lease: _Lease) -> None:
        """The lent worker's connection closed: the head retries or fails what it left
        unanswered, as for any worker death."""
        with self._task_lock:
            leases = self._task_lanes.get(lease.shape)
            if leases is not None and lease in leases:
                leases.remove(lease)
                if not leases:
                    del self._task_lanes[lease.shape]
            lost = list(lease.inflight.values())
            lease.inflight.clear()
            if lost and self.lost is None:
                try:
                    self._escape([r._id for c in lost for r in (*c.args, *c.hold)])
                except ClusterLostError:
                    return
                for c in lost:
                    self._call_lane.pop(c.tid, None)
                self._handed_to_head(lost)
                try:
                    self.send(_wire.ADOPT, pb.AdoptCalls(
                        worker_id=lease.worker_id, calls=[pb.Call.FromString(c.call) for c in lost],
                        cancelled=[c.tid for c in lost if c.cancelled]))
                except ClusterLostError:
                    pass
            if self.lost is None:
                try:
                    self._pump_tasks(lease.shape)
                except ClusterLostError:
                    pass
        del lost

    def _send_submit(self, call: bytes, refs: Sequence[ObjectRef]) -> None:
        if self._unregistered:
            self._escape([r._id for r in refs])
        submit = _field(b"\x0a", call)
        self.send_raw((len(submit) + 1).to_bytes(4, "little") + bytes((_wire.SUBMIT,)) + submit)

    # ------------------------------------------------------------------ actor calls
    def submit_actor(self, actor_id: bytes, token: ObjectRef, template: bytes, num_returns: int,
                     args: Sequence[Any], kwargs: dict[str, Any], name: str) -> list[ObjectRef]:
        """Call an actor: straight to its process once the head gave its address and
        every call sent through the head before is there; through the head otherwise."""
        lane = self._lanes.get(actor_id)
        if lane is None:
            with self._ref_lock:
                lane = self._lanes.setdefault(actor_id, _Lane(actor_id))
        tid = _ids.next_task_id()
        refs: list[ObjectRef] = []
        # Refs pickled in the arguments live here until the actor answers: the actor
        # counts those it keeps before answering (see WorkerRuntime.send_done).
        hold: list[ObjectRef] = []
        call = self._encode_call(template, tid, args, kwargs, refs, hold)
        rids = [tid + i.to_bytes(4, "big") for i in range(num_returns)]
        out = [ObjectRef(rid, self, counted=True) for rid in rids]
        if hold and self._put_seq > self._synced_seq and lane.peer is not None:
            self.request(pb.Request(query="sync"))   # the head knows every ref in the arguments
        with lane.lock:
            if lane.peer is None or lane.dispatched < lane.via_head:
                lane.via_head += 1
                with self._ref_lock:
                    self._owned.update(rids)
                self._send_submit(call, refs)
                return out
            with self._ref_lock:
                self._owned.update(rids)
                self._unregistered.update(rids)
            lane.queue.append(_Call(tid, call, refs, token, rids, name, hold))
            self._call_lane[tid] = lane
            self._pump_lane(lane)
        return out

    def _pump_lane(self, lane: _Lane) -> None:
        """Send the lane's queued calls in order while their ref arguments are here
        (the caller holds lane.lock)."""
        peer = lane.peer
        if peer is None:
            return
        results = self._results
        frames: list[bytes] = []
        missing: list[bytes] = []
        q = lane.queue
        while q:
            c = q[0]
            resolved = []
            for r in c.args:
                d = results.get(r._id)
                if d is None:
                    missing.append(r._id)
                    break
                resolved.append(d)
            if missing:
                break
            q.popleft()
            if self._failed_argument(c, resolved):
                continue
            c.peer = peer
            c.release = bool(c.hold) or any(d.WhichOneof("data") == "segment" for d in resolved)
            lane.inflight[c.tid] = c
            frames.append(self._execute_frame(c, resolved))
        if q:
            self._waiting_lanes.add(lane)
        else:
            self._waiting_lanes.discard(lane)
        if frames:
            self._active = True
            peer.send(frames[0] if len(frames) == 1 else b"".join(frames))
        if missing:
            self._subscribe_missing(missing)

    def _pump_waiting(self) -> None:
        for lane in list(self._waiting_lanes):
            with lane.lock:
                self._pump_lane(lane)

    def _answered(self, c: _Call, msg: Any, forward: list[Any], answered: list[_Call]) -> None:
        """A straight call's answer came: deliver it; its arguments go with ``answered``,
        or once the callee says it counted them (RELEASE_CALL)."""
        self._call_lane.pop(c.tid, None)
        if c.release and c.tid not in self._released_early:
            self._releasing[c.tid] = c
        else:
            self._released_early.discard(c.tid)
            answered.append(c)
        self._direct_done(c, msg, forward)

    def _direct_done(self, c: _Call, msg: Any, forward: list[Any]) -> None:
        """An actor answered a call sent straight to it."""
        with self._ref_lock:
            local = self._local
            if msg.owner:
                # Answered through the head (in shared memory, or holding refs): the head
                # holds the returns for this process and pushes them here.
                for rid in c.rids:
                    self._unregistered.discard(rid)
                    if rid in self._forward:   # registered from here: drops are in order
                        self._forward.discard(rid)
                    elif rid in self._pushed_early:   # the head holds it already
                        self._pushed_early.discard(rid)
                        if rid not in local and self.lost is None:
                            self._decr.append(rid)
                    else:
                        self._via_head[rid] = rid not in local
                return
            if msg.cancelled:
                err = make_error("cancelled", name=c.name)
                returns = [pb.ObjectData(object_id=rid, error=err) for rid in c.rids]
            else:
                returns = msg.returns
            results = self._results
            for d in returns:
                oid = d.object_id
                if oid in self._forward:   # the head holds it for this process: send the data
                    self._forward.discard(oid)
                    forward.append(d)
                elif oid not in local:
                    self._unregistered.discard(oid)
                if oid in local:
                    results[oid] = d
                self._owned.discard(oid)

    def _escape(self, ids: Iterable[bytes]) -> None:
        """These refs leave this process (an argument through the head, or pickled in a
        value): results of straight calls that only this process knows are told to the
        head first, with their data, or as pending when their call still runs."""
        if not self._unregistered:
            return
        puts: list[Any] = []
        pending: list[bytes] = []
        with self._ref_lock:
            for oid in ids:
                if oid in self._unregistered:
                    self._unregistered.discard(oid)
                    d = self._results.get(oid)
                    if d is not None:
                        puts.append(d)
                    else:
                        pending.append(oid)
                        self._forward.add(oid)
        frames = b""
        if pending:
            frames += _wire.encode(_wire.REF_DELTA, pb.RefDelta(pending=pending))
        if puts:
            frames += _wire.encode(_wire.OBJECTS, pb.Objects(objects=puts))
        if frames:
            self.send_raw(frames)
            self._put_seq += 1

    def retire_lane(self, actor_id: bytes) -> None:
        """The actor is being killed: later calls go through the head (which holds them
        for a restarted instance); calls in flight end with the process."""
        lane = self._lanes.get(actor_id)
        if lane is None:
            return
        with lane.lock:
            if lane.peer is not None:
                lane.stale.add(lane.peer.worker_id)
                lane.peer = None
            self._requeue_through_head(lane)

    def _requeue_through_head(self, lane: _Lane) -> None:
        """Send the lane's unsent calls through the head, in order (holds lane.lock)."""
        queued = list(lane.queue)
        lane.queue.clear()
        self._waiting_lanes.discard(lane)
        for c in queued:
            lane.via_head += 1
            self._resubmit(c)

    def cancel(self, object_id: bytes, force: bool) -> None:
        tid = _ids.task_of(object_id)
        lane = self._call_lane.get(tid)
        if isinstance(lane, _Lease) or (lane is None and self._task_lanes):
            if self._cancel_leased(tid, force, lane):
                return
            lane = None
        if isinstance(lane, _Lane):
            with lane.lock:
                c = lane.inflight.get(tid)
                if c is not None and c.peer is not None:
                    c.peer.send(_wire.encode(_wire.CANCEL_TASK, pb.CancelTask(task_id=tid)))
                    return
                for c in lane.queue:
                    if c.tid == tid:
                        lane.queue.remove(c)
                        self._end_unsent(c, pb.TaskDone(task_id=tid, cancelled=True))
                        return
        self.send(_wire.CANCEL, pb.CancelRequest(object_id=object_id, force=force))

    def _cancel_leased(self, tid: bytes, force: bool, lease: _Lease | None) -> bool:
        with self._task_lock:
            if lease is not None:
                c = lease.inflight.get(tid)
                if c is not None:
                    if force and next(iter(lease.inflight)) == tid:
                        c.cancelled = True   # the head fails it as cancelled (AdoptCalls)
                        try:
                            os.kill(lease.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    else:
                        lease.peer.send(_wire.encode(_wire.CANCEL_TASK, pb.CancelTask(task_id=tid)))
                    return True
            for q in self._task_queue.values():
                for c in q:
                    if c.tid == tid:
                        q.remove(c)
                        self._end_unsent(c, pb.TaskDone(task_id=tid, cancelled=True))
                        return True
        return False

    # ------------------------------------------------------------------ peers
    def listen(self, path: str) -> None:
        """Take calls sent straight to this process (an actor's worker) at ``path``."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o600)   # this user only (cloudpickle is code execution)
        sock.listen(128)
        sock.setblocking(False)
        self._listener = sock
        self._poller.register(sock.fileno(), select.POLLIN)

    def _add_peer(self, sock: socket.socket, lane: _Lane | _Lease | None, worker_id: int) -> _Peer:
        peer = _Peer(sock, lane, worker_id)
        self._peers[peer.fd] = peer
        self._poller.register(peer.fd, select.POLLIN)
        return peer

    def _actor_address(self, msg: Any) -> None:
        lane = self._lanes.get(msg.actor_id)
        if lane is None:
            return
        with lane.lock:
            if msg.worker_id in lane.stale:
                return
            lane.dispatched = max(lane.dispatched, msg.dispatched)
            if lane.peer is not None:
                if lane.peer.worker_id == msg.worker_id:
                    return
                lane.stale.add(lane.peer.worker_id)   # a restarted instance: the old one ends
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(msg.path)
            except OSError:
                sock.close()
                lane.stale.add(msg.worker_id)
                lane.peer = None
                return
            lane.peer = self._add_peer(sock, lane, msg.worker_id)

    def _read_peer(self, fd: int) -> None:
        listener = self._listener
        if listener is not None and fd == listener.fileno():
            while True:
                try:
                    sock, _ = listener.accept()
                except OSError:
                    return
                sock.setblocking(True)
                self._add_peer(sock, None, 0)
        peer = self._peers.get(fd)
        if peer is None:
            try:
                self._poller.unregister(fd)
            except (KeyError, ValueError):
                pass
            return
        try:
            n = peer.sock.recv_into(self._buf)
        except OSError:
            n = 0
        if not n:
            self._peer_lost(peer)
            return
        try:
            frames = peer.decoder.feed(self._view[:n])
        except _wire.ProtocolError:
            self._peer_lost(peer)
            return
        self._dispatch_peer(peer, frames)

    def _dispatch_peer(self, peer: _Peer, frames: list[tuple[int, Any]]) -> None:
        lane = peer.lane
        self._active = True
        if lane is None:   # this is an actor's worker: calls from a caller
            if self.on_peer_frame is not None:
                for kind, msg in frames:
                    self.on_peer_frame(peer, kind, msg)
            self._wake()
            return
        if isinstance(lane, _Lease):
            self._dispatch_lease(lane, frames)
            if self._waiting_lanes:
                self._pump_waiting()
            return
        forward: list[Any] = []
        answered: list[_Call] = []
        with lane.lock:
            for kind, msg in frames:
                if kind != _wire.TASK_DONE:
                    continue
                c = lane.inflight.pop(msg.task_id, None)
                if c is None:
                    continue
                self._answered(c, msg, forward, answered)
        self._wake()
        if forward:
            self.send(_wire.OBJECTS, pb.Objects(objects=forward))
        del answered   # their argument refs and the actor's token may go now
        if self._waiting_lanes:
            self._pump_waiting()

    def _peer_lost(self, peer: _Peer) -> None:
        """A connection to (or from) an actor's process closed."""
        self._close_peer(peer)
        lane = peer.lane
        if lane is None:
            return   # a caller left: answers to it go through the head
        # The process is gone: what it kept of arguments went with it.
        released = [t for t, c in list(self._releasing.items()) if c.peer is peer]
        for t in released:
            self._releasing.pop(t, None)
        if isinstance(lane, _Lease):
            self._lease_lost(lane)
            return
        with lane.lock:
            lane.stale.add(peer.worker_id)
            if lane.peer is peer:
                lane.peer = None
            lost = [c for c in lane.inflight.values() if c.peer is peer]
            for c in lost:
                del lane.inflight[c.tid]
                self._call_lane.pop(c.tid, None)
            if lost:
                self._handed_to_head(lost)
                if self.lost is None:
                    try:
                        self.send(_wire.ADOPT, pb.AdoptCalls(
                            actor_id=lane.actor_id, worker_id=peer.worker_id,
                            calls=[pb.Call.FromString(c.call) for c in lost]))
                    except ClusterLostError:
                        pass
            if lane.peer is None and lane.queue and self.lost is None:
                try:
                    self._requeue_through_head(lane)
                except ClusterLostError:
                    pass
        del lost

    def _close_peer(self, peer: _Peer) -> None:
        if self._peers.pop(peer.fd, None) is not None:
            try:
                self._poller.unregister(peer.fd)
            except (KeyError, ValueError):
                pass
        peer.close()

    def _close_peers(self) -> None:
        closing, self._to_close = self._to_close, []
        for peer in closing:
            self._close_peer(peer)

    def build_call(self, tid: bytes, function_id: bytes, args: Sequence[Any], kwargs: dict[str, Any],
                   *, num_returns: int, resources: dict[str, float], name: str) -> Any:
        """A parsed Call (for requests that carry one, like actor creation)."""
        template = pb.Call(function_id=function_id, num_returns=num_returns, resources=resources,
                           name=name).SerializeToString()
        refs: list[ObjectRef] = []
        call = pb.Call.FromString(self._encode_call(template, tid, args, kwargs, refs))
        self._escape([r._id for r in refs])
        self._keep_until_sent = refs   # large args stay alive until the request is sent
        return call

    def _arg_value(self, value: Any, refs: list[ObjectRef], nested: list[bytes]) -> bytes:
        if type(value) is ObjectRef:
            refs.append(value)
            return _field(b"\x0a", value._id)
        ser = serialize(value)
        if ser.size > self.inline_threshold:
            ref = self._put_serialized(ser)
            refs.append(ref)
            return _field(b"\x0a", ref._id)
        nested.extend(ser.contained)
        return _field(b"\x12", ser.to_bytes())

    # ------------------------------------------------------------------ objects
    def put(self, value: Any) -> ObjectRef:
        if isinstance(value, ObjectRef):
            raise TypeError("put() of an ObjectRef: pass the ref itself where it is needed, "
                            "or put() its value (orchestra.get(ref)) instead")
        return self._put_serialized(serialize(value))

    def _put_serialized(self, ser: Serialized) -> ObjectRef:
        oid = _ids.object_id(_ids.next_task_id(), 0)
        data = self.make_object_data(oid, ser)
        ref = ObjectRef(oid, self, counted=True)
        with self._ref_lock:
            self._results[oid] = data
        self.send(_wire.OBJECTS, pb.Objects(objects=[data]))
        self._put_seq += 1
        return ref

    def make_object_data(self, oid: bytes, ser: Serialized, out: Any = None) -> Any:
        """ObjectData for a sealed value: inline when small, else written to a segment.
        ``out``: an ObjectData to fill (one added to a message), else a new one."""
        if ser.contained:
            self._escape(ser.contained)
        if out is None:
            out = pb.ObjectData()
        out.object_id = oid
        out.contained.extend(ser.contained)
        if ser.size <= self.inline_threshold:
            out.inline = ser.to_bytes()
            return out
        # Drops that came before this put must reach the store before it judges the room
        # (the decrements otherwise travel after the frame, see send_raw).
        self.flush_refs()
        reply = self.request(pb.Request(create_segment=pb.CreateSegment(object_id=oid, size=ser.size)))
        seg = reply.segment
        with self._ref_lock:
            mm = self._wmaps.pop(seg.name, None) if seg.reused else None
        try:
            if mm is None or len(mm) < ser.size:
                mm = open_segment(self.shm_dir, seg)
            write_into(mm, ser)
        except BaseException:
            # The store counted the segment's bytes: give them back before the error
            # reaches the caller (a failed put used to keep them until disconnect).
            if mm is not None:
                mm.close()
            self.abort_segment(seg.name)
            raise
        with self._ref_lock:
            if self.lost is None:
                self._wmaps[seg.name] = mm
        out.segment.CopyFrom(seg)
        return out

    def abort_segment(self, name: str) -> None:
        """Tell the store a segment it handed out was not filled (see make_object_data)."""
        if self.lost is None:
            try:
                self.request(pb.Request(abort_segment=name), timeout_s=30)
            except OrchestraError:   # ClusterLostError too
                pass   # the error being raised says more; a lost head frees it anyway

    def _drop_maps(self, names: Iterable[str]) -> None:
        with self._ref_lock:
            maps = []
            for n in names:
                maps.append(self._wmaps.pop(n, None))
                if n in self._mapping_ahead:
                    self._mapping_ahead[n] = False   # unlinked before its map was made
        for mm in maps:
            if mm is not None:
                mm.close()

    def _release_maps(self, names: Iterable[str]) -> None:
        """The store wants to spill these segments: forget the maps kept for later gets
        (a map still viewed by a value stays, and so does its pin)."""
        wanted = set(names)
        with self._ref_lock:
            for oid in [o for o, (_, name) in self._maps.items() if name in wanted]:
                del self._maps[oid]

    def _map_ahead(self, names: Sequence[str]) -> None:
        with self._ref_lock:
            for n in names:
                self._mapping_ahead[n] = True

        def work() -> None:
            for n in names:
                mm = map_ahead(self.shm_dir, n)
                with self._ref_lock:
                    keep = self._mapping_ahead.pop(n, False) and self.lost is None \
                        and not self._closing and n not in self._wmaps
                    if keep and mm is not None:
                        self._wmaps[n] = mm
                        continue
                if mm is not None:
                    mm.close()
        threading.Thread(target=work, name="orchestra-map-ahead", daemon=True).start()

    def get_one(self, ref: ObjectRef, timeout: float | None) -> Any:
        oid = ref._id
        data = self._results.get(oid)
        if data is None:
            self._wait([oid], 1, timeout)
            data = self._results.get(oid)
            if data is None:
                raise ClusterLostError(self.lost or f"object {oid.hex()} vanished while waited for")
        return self._value(oid, data)

    def get_many(self, refs: Sequence[ObjectRef], timeout: float | None) -> list[Any]:
        ids = [r._id for r in refs]
        results = self._results
        if any(oid not in results for oid in ids):
            self._wait(ids, len(ids), timeout)
        return [self._value(oid, results[oid]) for oid in ids]

    def wait(self, refs: Sequence[ObjectRef], num_returns: int,
             timeout: float | None) -> tuple[list[ObjectRef], list[ObjectRef]]:
        results = self._results
        if num_returns == len(refs):   # all of them: one pass when they are all ready
            done = [r for r in refs if r._id in results]
            if len(done) == num_returns:
                return done, []
        self._wait([r._id for r in refs], num_returns, timeout, raise_timeout=False)
        ready: list[ObjectRef] = []
        not_ready: list[ObjectRef] = []
        for r in refs:
            if r._id in results and len(ready) < num_returns:
                ready.append(r)
            else:
                not_ready.append(r)
        return ready, not_ready

    def _wait(self, ids: Sequence[bytes], k: int, timeout: float | None,
              raise_timeout: bool = True) -> None:
        results = self._results
        self._subscribe_missing(ids)
        deadline = None if timeout is None else time.monotonic() + timeout
        n = len(ids)
        if k >= n:
            pos = [0]

            def ready() -> bool:  # all of them: advance a cursor, O(n) over the whole wait
                i = pos[0]
                while i < n and ids[i] in results:
                    i += 1
                pos[0] = i
                return i >= n
        else:
            def ready() -> bool:
                return sum(1 for oid in ids if oid in results) >= k
        if ready():
            return
        blocked = inline = False
        if self.on_block is not None:
            blocked = True
            missing = list(itertools.islice((oid for oid in ids if oid not in results), _BLOCKED_IDS))
            inline = self.on_block(True, missing)
        try:
            if inline:
                ok = self._wait_running_nested(ready, deadline)
            else:
                ok = self.wait_until(ready, deadline)
            if not ok and raise_timeout:
                raise GetTimeoutError(
                    f"get() timed out after {timeout:g} s with "
                    f"{sum(1 for oid in ids if oid not in results)} of {n} objects not ready; "
                    "the tasks keep running. Call get() again later or raise the timeout.")
        finally:
            if blocked and self.on_block is not None:
                self.on_block(False, ())

    def _wait_running_nested(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """wait_until(ready), running the tasks the head hands this blocked thread (the
        ones it waits for, not started elsewhere) as they come: a chain of tasks that
        each wait for the next nests on one worker instead of holding a blocked process
        per level (_blocking.py)."""
        has_nested, run = self.nested_ready, self.run_nested
        assert run is not None
        while True:
            if not self.wait_until(lambda: ready() or has_nested(), deadline):
                return False
            if ready():
                return True
            run()

    def wait_until(self, pred: Callable[[], bool], deadline: float | None) -> bool:
        """Return once ``pred()`` holds (True) or at ``deadline`` (False).

        The waiting thread reads the socket itself when no other thread does (no hand-off
        between threads on the latency path); otherwise it sleeps until the reader
        dispatches something or gives up reading.
        """
        cond = self._cond
        while True:
            if self._read_lock.acquire(False):
                try:
                    while not pred():
                        if self.lost is not None:
                            raise ClusterLostError(self.lost)
                        if deadline is None:
                            wait_ms = 1000
                        else:
                            remaining = deadline - time.monotonic()
                            if remaining <= 0:
                                return False
                            wait_ms = min(1000, max(1, int(remaining * 1000) + 1))
                        self._read_once(wait_ms)
                    return True
                finally:
                    self._read_lock.release()
                    self._wake()   # another waiter may take over reading
            with cond:
                # Counted before pred() is read: a change after that read wakes this one.
                self._sleepers += 1
                try:
                    if pred():
                        return True
                    if self.lost is not None:
                        raise ClusterLostError(self.lost)
                    remaining = 0.005 if deadline is None else min(0.005, deadline - time.monotonic())
                    if remaining <= 0:
                        return False
                    cond.wait(remaining)
                finally:
                    self._sleepers -= 1

    def _wake(self) -> None:
        """Wake the threads waiting in wait_until (that do not read): something came."""
        if self._sleepers:
            with self._cond:
                self._cond.notify_all()

    def _subscribe_missing(self, ids: Iterable[bytes]) -> None:
        results = self._results
        want = []
        with self._ref_lock:
            for oid in ids:
                if oid not in results and oid not in self._owned and oid not in self._subscribed:
                    self._subscribed.add(oid)
                    want.append(oid)
        if want:
            self.send(_wire.SUBSCRIBE, pb.Subscribe(ids=want))

    def _value(self, oid: bytes, data: Any) -> Any:
        kind = data.WhichOneof("data")
        if kind == "inline":
            return deserialize(data.inline)
        if kind == "segment":
            cached = self._maps.get(oid)
            if cached is not None:
                view = memoryview(cached[0])[: data.segment.size]
            else:
                view, seg = self.map_object(data)
                with self._ref_lock:
                    if oid in self._local:
                        self._maps[oid] = (view.obj, seg.name)  # type: ignore[assignment]
            return deserialize(view)
        raise pickle.loads(data.error)

    def map_object(self, data: Any) -> tuple[memoryview, Any]:
        """Map a large object read-only, wherever it is now: a reader may have learnt
        its segment just before the store spilled it to disk; then ask the head.
        Returns the view and the Segment it maps."""
        for _ in range(8):
            try:
                return self.map_segment(data.segment), data.segment
            except FileNotFoundError:
                oid = data.object_id
                data = self.request(pb.Request(locate=oid)).object
                with self._ref_lock:
                    if oid in self._results:
                        self._results[oid] = data
        raise ObjectLostError(f"object {data.object_id.hex()} kept moving while being read")

    def map_segment(self, segment: Any) -> memoryview:
        """Map a sealed segment read-only and pin it until the last view of it is gone
        (a spill file needs no pin: removing it does not disturb a map)."""
        mm, view = map_segment(self.shm_dir, segment)
        if not segment.path:
            name = segment.name
            with self._ref_lock:
                self._pin.append(name)
            weakref.finalize(mm, self._unmapped, name)
        return view

    def _unmapped(self, name: str) -> None:
        with self._ref_lock:
            if self.lost is None:
                self._unpin.append(name)

    # ------------------------------------------------------------------ reading
    def _read_once(self, timeout_ms: int) -> bool:
        """Read and dispatch what arrives within ``timeout_ms``; caller holds the read lock."""
        if self.lost is not None:
            return False
        if self._to_close:
            self._close_peers()
        events = self._poller.poll(timeout_ms)
        if not events:
            return False
        if len(events) > 1:   # the head's frames first: an Execute it sent before an
            events.sort(key=lambda e: e[0] != self._fd)   # ActorAddress precedes straight calls
        try:
            for fd, _ in events:
                if fd != self._fd:
                    self._read_peer(fd)
                    continue
                try:
                    n = self.sock.recv_into(self._buf)
                except OSError:
                    n = 0
                if not n:
                    self._connection_lost()
                    return False
                self._dispatch(self._decoder.feed(self._view[:n]))
        except ClusterLostError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug of ours: fail loudly (_broken)
            self._broken(exc)
            raise ClusterLostError(self.lost) from exc
        return True

    def _background(self) -> None:
        """Every few ms: read what no waiting thread has read, and flush ref changes.

        It never blocks while holding the read lock, so a thread that starts waiting
        becomes the reader at once.
        """
        try:
            self._background_loop()
        except ClusterLostError:
            return
        except Exception as exc:  # noqa: BLE001 - a bug of ours: fail loudly (_broken)
            self._broken(exc)

    def _background_loop(self) -> None:
        while not self._stop.wait(_FLUSH_INTERVAL_S):
            if self._read_lock.acquire(False):
                try:
                    for _ in range(64):
                        if not self._read_once(0):
                            break
                except ClusterLostError:   # a frame's answer found the head gone
                    return
                finally:
                    self._read_lock.release()
            if self.lost is not None:
                return
            if self._task_lanes:
                try:
                    self.return_idle_leases(_LEASE_IDLE_S, ask=True)
                except ClusterLostError:
                    return
            if self._active:   # straight calls went by: tell the head the cluster is busy
                self._active = False
                try:
                    self.send(_wire.REF_DELTA, pb.RefDelta())
                except ClusterLostError:
                    return
            self.flush_refs()

    def _dispatch(self, frames: list[tuple[int, Any]]) -> None:
        wake = False
        wake_leases: list[_Lease] = []
        for kind, msg in frames:
            if kind == _wire.OBJECTS:
                with self._ref_lock:
                    local, results = self._local, self._results
                    for d in msg.objects:
                        oid = d.object_id
                        if oid in local:
                            results[oid] = d
                        self._owned.discard(oid)
                        if self._via_head and oid in self._via_head:
                            if self._via_head.pop(oid) and self.lost is None:
                                self._decr.append(oid)   # dropped before the head held it
                        elif self._call_lane and oid[:-4] in self._call_lane:
                            self._pushed_early.add(oid)
                        if self._busy_tasks:
                            busy = self._busy_tasks.pop(oid[:-4], None)
                            if busy is not None:
                                busy.busy = 0
                                wake_leases.append(busy)
                wake = True
            elif kind == _wire.DROP_MAPS:
                self._drop_maps(msg.names)
            elif kind == _wire.RELEASE_MAPS:
                self._release_maps(msg.names)
            elif kind == _wire.MAP_AHEAD:
                self._map_ahead(list(msg.names))
            elif kind == _wire.ACTOR_ADDRESS:
                self._actor_address(msg)
            elif kind == _wire.LEASE:
                self._lease_granted(msg)
            elif kind == _wire.LEASE_REVOKE:
                self._lease_revoked(msg.worker_id)
            elif kind == _wire.RELEASE_CALL:
                if self._releasing.pop(msg.task_id, None) is None and msg.task_id in self._call_lane:
                    self._released_early.add(msg.task_id)
            elif kind == _wire.STALLED:
                _log.warning("%s", msg.text)
            elif kind == _wire.REPLY:
                slot = self._replies.pop(msg.req_id, None)
                if slot is not None:
                    slot[0] = msg
                wake = True
            elif self.on_frame is not None:
                self.on_frame(kind, msg)
                wake = True
        if wake:
            self._wake()
            if self._waiting_lanes:
                self._pump_waiting()
        if wake_leases:   # a lent worker ended what the head had sent it: room for more
            with self._task_lock:
                for shape in {le.shape for le in wake_leases}:
                    self._pump_tasks(shape)
        if self._decr or self._unpin:
            self.flush_refs()

    def _connection_lost(self) -> None:
        self._drop_maps(list(self._wmaps))
        if self.lost is None:
            self.lost = ("the connection to the cluster's head process closed" if self._closing
                         else _LOST)
        self._wake()
        if self.on_lost is not None and not self._closing:
            self.on_lost()

    def _broken(self, exc: BaseException) -> None:
        """An error in orchestra's own frame handling: this process cannot be trusted to
        read its connection any more. Rather than live on without a reader (a worker that
        kept its CPU and its tasks forever), close the connection: the head treats the
        process as gone (for a worker, a crash: retries, WorkerCrashedError), a worker
        exits (on_lost), and a driver's calls raise ClusterLostError."""
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        print(f"orchestra: internal error while handling the cluster's frames in pid "
              f"{os.getpid()}; its connection to the cluster is closed:\n{detail}",
              file=sys.stderr, flush=True)
        if self.lost is None:
            self.lost = (f"orchestra failed while reading the cluster's frames "
                         f"({type(exc).__name__}: {exc}) and closed the connection; the "
                         "traceback is printed above: please report it")
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._wake()
        if self.on_lost is not None and not self._closing:
            self.on_lost()

    def close(self) -> None:
        self._closing = True
        self._stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=2)
        for peer in list(self._peers.values()):
            peer.close()
        if self._listener is not None:
            self._listener.close()
        self._drop_maps(list(self._wmaps))   # they would keep the segments' memory


class _Peer:
    """A connection between a caller and an actor's process (calls one way, answers
    the other). ``lane`` is set on the caller's side."""

    __slots__ = ("sock", "fd", "decoder", "lane", "worker_id", "lock")

    def __init__(self, sock: socket.socket, lane: _Lane | _Lease | None, worker_id: int) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.decoder = _wire.FrameDecoder()
        self.lane = lane
        self.worker_id = worker_id
        self.lock = threading.Lock()

    def send(self, data: bytes) -> bool:
        """False when the connection is gone (its reader finds out and cleans up)."""
        with self.lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Call:
    """A call sent (or to be sent) straight to an actor; its refs live until answered."""

    __slots__ = ("tid", "call", "args", "token", "rids", "name", "peer", "hold", "release",
                 "cancelled", "fid")

    def __init__(self, tid: bytes, call: bytes, args: list[ObjectRef], token: ObjectRef | None,
                 rids: list[bytes], name: str, hold: list[ObjectRef]) -> None:
        self.tid = tid
        self.call = call          # serialized Call
        self.args = args          # ref arguments, in order: their data goes with the call
        self.token = token        # the actor's handle token: the actor lives while answering
        self.hold = hold          # refs pickled inside the arguments
        self.release = False      # held until the actor says it counted them (RELEASE_CALL)
        self.cancelled = False    # cancelled with force: its worker was killed
        self.fid = b""            # a task's function id
        self.rids = rids
        self.name = name
        self.peer: _Peer | None = None


class _Lease:
    """A worker the head lent this driver for tasks of one resource shape."""

    __slots__ = ("worker_id", "pid", "shape", "peer", "inflight", "revoked", "blocked",
                 "stealing", "idle_since", "functions", "busy", "__weakref__")

    def __init__(self, worker_id: int, pid: int, shape: tuple[tuple[str, float], ...]) -> None:
        self.worker_id = worker_id
        self.pid = pid
        self.shape = shape
        self.peer: Any = None
        self.inflight: dict[bytes, _Call] = {}   # in the order sent: the first one runs
        self.revoked = False      # the head wants it back
        self.blocked = False      # its running task waits in get(): send nothing more
        self.stealing = False     # a STEAL was sent, its answer not read yet
        self.idle_since = time.monotonic()
        self.functions: set[bytes] = set()   # sent to it from here
        self.busy = 0   # tasks the head sent it before lending it, not known to have ended


def _load(lease: _Lease) -> int:
    """Tasks on a lent worker: sent from here and unanswered, and those from the head."""
    return len(lease.inflight) + lease.busy


class _Lane:
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
        self.peer: _Peer | None = None
        self.via_head = 0
        self.dispatched = 0
        self.stale: set[int] = set()   # worker ids of processes not to call any more
        self.queue: collections.deque[_Call] = collections.deque()
        self.inflight: dict[bytes, _Call] = {}


def _never() -> bool:
    return False


def _connect(path: str, timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            s.close()
            if time.monotonic() > deadline:
                raise ClusterLostError(
                    f"could not connect to the head at {path} within {timeout_s:g} s: {exc}") from exc
        except BaseException:   # PermissionError: another user's session
            s.close()
            raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
