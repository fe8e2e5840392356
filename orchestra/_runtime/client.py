"""Core client: one process's connection to the cluster (a driver, or a worker).

    user thread --submitter/values/refs--> send(): [ref holds][frame][ref releases]
                                        |   one write on the head's Connection, under its lock
    reader thread <--frames-- head: Objects (results pushed to their owner, or to
        subscribers) land in ``results``; Replies wake their requester; each kind has
        its handler (_runtime/client_frames.py), a worker's own kinds (Execute,
        CancelTask, ...) among them.

The client is the hub of six parts, one job each:
    _runtime/submit.py       Submitter (``submitter``): tasks and actor calls, cancels
    _runtime/values.py       Values (``values``): put, get, wait
    _protocol/connection.py  Connection: the socket (unix, TCP between machines), frames
    _objects/refs.py         RefCounts: this process's count per object id, changes to tell
    _objects/io.py           ObjectIO: values inline or in segments, the maps kept of them
    _runtime/direct.py       DirectCalls: calls sent straight to actors and lent workers
                             (decisions in _runtime/direct_core.py)
and keeps what they share: the results received, the requests waiting for replies,
and the reading of every connection (one thread reads at a time: the waiting thread
itself when it can, else the background reader).
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import select
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from .._objects.io import ObjectIO
from .._objects.refs import RefCounts
from .._objects.serialization import INLINE_MAX
from .._protocol import codec as _codec
from .._protocol import pb
from .._protocol import wire as _wire
from .._protocol.connection import Connection
from ..exceptions import (
    ClusterLostError,
    GetTimeoutError,
    InfeasibleResourcesError,
    ObjectLostError,
    ObjectStoreFullError,
    OrchestraError,
)
from .client_frames import with_owner
from .direct import DirectCalls
from .direct_core import LOAN_IDLE_S, Loan
from .object_ref import ObjectRef
from .pacer import Pacer
from .replay import ReplayBook
from .submit import Submitter
from .values import Values

# Why every call fails once the head's connection is gone (ClusterLostError).
_LOST = ("lost the connection to the cluster: its head process exited (it crashed or was "
         "killed). This session is over: orchestra.init() starts a new cluster")

_log = logging.getLogger("orchestra")

# Errors a Reply names by kind (Reply.error_kind), raised as these classes (any other as
# OrchestraError); ValueError: the request's argument was wrong (a name taken, or unknown).
_REPLY_ERRORS: dict[str, type[Exception]] = {
    "ObjectStoreFullError": ObjectStoreFullError,
    "ObjectLostError": ObjectLostError,
    "ValueError": ValueError,
    "InfeasibleResourcesError": InfeasibleResourcesError,
}


class CoreClient:
    def __init__(self, sock_path: str, hello: pb.Hello, *, connect_timeout_s: float = 30.0,
                 frames: dict[int, Callable[[Any], None]] | None = None,
                 on_lost: Callable[[], None] | None = None,
                 socket_guard: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
                 start: bool = True, token: str | None = None) -> None:
        if socket_guard is not None:
            # The owner wraps every method that reads or writes the socket (a worker
            # defers its cancel signal past them: raised inside, it cut frames in half).
            self.send_raw = socket_guard(self.send_raw)          # type: ignore[method-assign]
            self._read_once = socket_guard(self._read_once)      # type: ignore[method-assign]
        try:
            # The head's answer to the hello, and the frames that came with it (dispatched
            # by start()); a head going away mid-handshake is tried again (greet).
            self.conn, self.info, self._early_frames = Connection.greet(
                sock_path, _wire.encode(_wire.HELLO, hello), connect_timeout_s, token)
        except ClusterLostError as exc:
            raise ClusterLostError(f"could not reach the head: {exc}") from exc
        self.token = token   # for TCP direct calls to workers of other nodes (None: the env's)
        self.sock = self.conn.sock
        self.on_lost = on_lost
        # What to do with each kind of frame (_runtime/client_frames.py), a worker's own
        # kinds (``frames``: EXECUTE, CANCEL_TASK, ...) among them.
        self.handlers = with_owner(frames or {})
        self.woken: list[Loan] = []   # lent workers with room again (handlers -> _dispatch)
        self.refs = RefCounts(self._last_ref_gone)
        self.add_ref = self.refs.add          # ObjectRef's hooks, without a call in between
        self.remove_ref = self.refs.remove
        self.results: dict[bytes, pb.ObjectData] = {}
        self.owned: set[bytes] = set()        # returns of my tasks: pushed to me when sealed
        self._subscribed: set[bytes] = set()
        self._cond = threading.Condition()
        self._sleepers = 0   # threads waiting on _cond (see wake)
        self._read_lock = threading.Lock()   # held by the one thread reading the sockets
        # Requests waiting for their replies: req id -> [reply] (request) or the
        # function to call with it (request_later), on whichever thread reads it.
        self.replies: dict[int, list[pb.Reply | None] | Callable[[pb.Reply], None]] = {}
        self._req_ids = itertools.count(1)
        # Streams this process consumes (task id -> _generators.Stream): their items are
        # pushed here before next() makes their refs; and the last ones ended, in order.
        self.streams: dict[bytes, Any] = {}
        self.closed_streams: collections.deque[bytes] = collections.deque()
        # Where this driver's actor names live ("" in a worker: the head knows whose task
        # it runs), and init()'s runtime_env (a RuntimeEnvSpec, or None).
        self.namespace: str = hello.namespace
        self.runtime_env: pb.RuntimeEnvSpec | None = None
        self._keep_until_sent: list[ObjectRef] = []
        self.book: ReplayBook | None = None   # a driver that outlives its head (_runtime/replay.py)
        self.lost: str | None = None
        self.closing = False
        self.closing_reason = ""   # why the head stopped, when it said so (CLOSING)
        self._warned: set[str] = set()   # texts of the head's warnings shown (WARNING)
        # Frames that create objects (puts, registrations) sent / known handled by the
        # head: a direct call naming one may wait for the head to have read it (must_sync).
        self.put_seq = 0
        self.synced_seq = 0
        self.active = False   # direct calls since the last look (the head sees none)
        self.poller = select.poll()
        self.poller.register(self.conn.fd, select.POLLIN)
        self.direct = DirectCalls(self)
        self.submitter = Submitter(self)   # tasks and actor calls (_runtime/submit.py)
        self.values = Values(self)         # put, get, wait (_runtime/values.py)
        self.conn_id = self.info.conn_id
        # Call.job appended to every call made here: a driver's own connection id (its
        # tasks' prints go to it); a worker sets that of the task it runs (_worker/worker.py).
        self.job_suffix = _codec.job_field(self.conn_id) if hello.kind == "driver" else b""
        # A driver's puts reach the head in batches (RefCounts.seal); a worker's go at
        # once (its result may leave on a direct connection the head does not read).
        self.defer_seals = hello.kind == "driver"
        self.shm_dir = self.info.shm_dir   # the session's private directory of segments
        self.objects = ObjectIO(self, self.shm_dir, self.info.inline_threshold or INLINE_MAX,
                                self.info.node_id)
        self.inline_threshold = self.objects.inline_threshold
        # One reused buffer: recv(1 MiB) would allocate (and fault in) 1 MiB per read.
        self._buf = bytearray(1 << 18)
        self._view = memoryview(self._buf)
        self.pacer = Pacer()   # the background thread's rounds (_runtime/pacer.py)
        # Called by the background thread every few ms (a worker reports its task
        # events from there, _observe/task_events.py); None: nothing to call.
        self.on_tick: Callable[[], None] | None = None
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

    # ------------------------------------------------------------------ sending
    def send_raw(self, frame: bytes) -> None:
        """Send encoded frames, with the pending reference changes around them."""
        with self.conn.lock:
            failed = self._write_locked(frame)
        if failed is not None:
            self._send_failed(failed)

    def send_decided(self, decide: Callable[[], bytes]) -> None:
        """Send the frames ``decide`` returns, deciding under the connection's lock: no
        frame of another thread comes between the decision and the head. For decisions
        about what the head knows of this process's objects (a direct call's result
        registered or handed over), which another thread's next frame may rely on:
        decided under the ref lock alone and sent after it, a second thread could find
        the result registered already and send a task naming it first (that task then
        failed with ObjectLostError; tests/unit/test_direct_book_interleavings.py)."""
        with self.conn.lock:
            frame = decide()
            if not frame and not self.refs.pending():
                return
            failed = self._write_locked(frame)
        if failed is not None:
            self._send_failed(failed)

    def _write_locked(self, frame: bytes) -> OSError | None:
        """Under the connection's lock: write ``frame`` with the pending reference
        changes around it; the error when the socket is gone."""
        pre = post = b""
        if self.refs.pending():
            pre, post = self.refs.take_frames()
        try:
            self.conn.send_locked(pre + frame + post if (pre or post) else frame)
        except OSError as exc:
            return exc
        self.pacer.stir()
        return None

    def stir(self) -> None:
        """Direct calls went by: the head hears the cluster is busy, and the background
        thread takes its short round again."""
        self.active = True
        self.pacer.stir()

    def _send_failed(self, failed: OSError) -> NoReturn:
        # The head closed the connection: what it sent last may say why (Closing).
        if self._read_what_is_left() and self.lost is None:
            self.lost = f"{_LOST} ({failed.strerror or failed})"
            self.refs.lost = True
        # (Another thread still reading: it reads the Closing frame and its end, and
        # records why; this call fails meanwhile without deciding it.)
        raise ClusterLostError(self.lost or f"{_LOST} ({failed.strerror or failed})") from failed

    def _read_what_is_left(self) -> bool:
        """Read the frames the head sent before it closed (another thread reading them
        finishes at once: they are there). False: another thread kept reading."""
        if not self._read_lock.acquire(timeout=0.5):
            return False
        try:
            for _ in range(64):
                if self.lost is not None or not self._read_once(0):
                    break
        except ClusterLostError:
            pass
        finally:
            self._read_lock.release()
        return True

    def send(self, kind: int, msg: Any) -> None:
        self.send_raw(_wire.encode(kind, msg))

    def flush_refs(self, wait: bool = False) -> None:
        """Send pending reference changes. ``wait``: also wait for those another thread
        took and is sending (an answer sent on another connection must not overtake them)."""
        if self.refs.pending() and self.lost is None:
            try:
                self.send_raw(b"")
            except ClusterLostError:
                pass
        elif wait:
            with self.conn.lock:
                pass

    def request(self, req: pb.Request, timeout_s: float = 60.0) -> pb.Reply:
        if req.WhichOneof("body") == "query" and req.query != "sync" and self.direct.lent.ever_loaned:
            # The head's answer counts lent workers as busy: give back the idle ones, with
            # those whose grant is on its way here (read by the time the sync answers).
            self.request(pb.Request(query="sync"))
            self.direct.lent.return_idle()
        rid = next(self._req_ids)
        req.req_id = rid
        slot: list[pb.Reply | None] = [None]
        self.replies[rid] = slot
        seq = self.put_seq
        self.send(_wire.REQUEST, req)
        self._keep_until_sent = []
        if not self.wait_until(lambda: slot[0] is not None, time.monotonic() + timeout_s):
            self.replies.pop(rid, None)
            raise GetTimeoutError(f"the head did not answer a request within {timeout_s:g} s")
        reply = slot[0]
        assert reply is not None   # wait_until saw it
        self.synced_seq = max(self.synced_seq, seq)
        if reply.error:
            cls = _REPLY_ERRORS.get(reply.error_kind)
            raise (cls or OrchestraError)(reply.error)
        return reply

    def read_ready(self) -> None:
        """Read and dispatch what has come, without waiting, unless another thread is
        reading (it does so): a put low on spares takes in the refill it asked for."""
        if self._read_lock.acquire(False):
            try:
                self._read_once(0)
            finally:
                self._read_lock.release()
                self.wake()

    def request_later(self, req: pb.Request, on_reply: Callable[[pb.Reply], None]) -> None:
        """Send ``req`` without waiting: ``on_reply(reply)`` runs on the thread that reads
        its reply (never, if the head is lost first). It must not block or send and wait."""
        rid = next(self._req_ids)
        req.req_id = rid
        self.replies[rid] = on_reply
        try:
            self.send(_wire.REQUEST, req)
        except BaseException:
            self.replies.pop(rid, None)
            raise

    # ------------------------------------------------------------------ refs
    def _last_ref_gone(self, oid: bytes) -> bool:
        """Under the ref lock: this process dropped its last ref to ``oid``. Forget what
        was kept for it; True when the head holds a count for it here (a decrement)."""
        data = self.results.pop(oid, None)
        self.objects.forget(oid)
        if self.book is None:   # else owned until answered (the head tells: replay.py)
            self.owned.discard(oid)
        self._subscribed.discard(oid)
        if self.book is not None and self.book.dropped(oid, data):
            return False   # lost with a head: the restarted one holds nothing of it
        direct = self.direct
        if direct.routes or direct.book.unregistered or direct.book.via_head:
            return direct.last_ref_gone(oid)
        return True

    def escape(self, ids: Iterable[bytes]) -> None:
        """These refs leave this process: the head must know every object they name."""
        self.direct.escape(ids, wait=True)

    # ------------------------------------------------------------------ waiting
    def wait_until(self, pred: Callable[[], bool], deadline: float | None) -> bool:
        """Return once ``pred()`` holds (True) or at ``deadline`` (False). The waiting
        thread reads the socket itself when no other thread does (no hand-off between
        threads on the latency path); otherwise it sleeps until the reader dispatches
        something or gives up reading."""
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
                    self.wake()   # another waiter may take over reading
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

    def wake(self) -> None:
        """Wake the threads waiting in wait_until (that do not read): something came."""
        if self._sleepers:
            with self._cond:
                self._cond.notify_all()

    def subscribe_missing(self, ids: Iterable[bytes]) -> None:
        results = self.results
        want = []
        with self.refs.lock:
            for oid in ids:
                if oid not in results and oid not in self.owned and oid not in self._subscribed:
                    self._subscribed.add(oid)
                    want.append(oid)
        if want:
            self.send(_wire.SUBSCRIBE, pb.Subscribe(ids=want))

    # ------------------------------------------------------------------ reading
    def _read_once(self, timeout_ms: int) -> bool:
        """Read and dispatch what arrives within ``timeout_ms``; caller holds the read lock."""
        if self.lost is not None:
            return False
        direct = self.direct
        if direct.to_close:
            direct.close_pending()
        events = self.poller.poll(timeout_ms)
        if not events:
            return False
        fd_head = self.conn.fd
        if len(events) > 1:   # the head's frames first: an Execute it sent before an
            events.sort(key=lambda e: e[0] != fd_head)   # ActorAddress precedes direct calls
        try:
            for fd, _ in events:
                if fd != fd_head:
                    direct.read(fd, self._buf, self._view)
                    continue
                n = self.conn.recv_into(self._buf)
                if not n:
                    self._connection_lost()
                    return False
                self._dispatch(self.conn.feed(self._view[:n]))
        except ClusterLostError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug of ours: fail loudly (_broken)
            self._broken(exc)
            raise ClusterLostError(self.lost) from exc
        return True

    def _background(self) -> None:
        """Every few ms: read what no waiting thread has read, and flush ref changes. It
        never blocks while holding the read lock: a thread that starts waiting becomes
        the reader at once."""
        try:
            self._background_loop()
        except ClusterLostError:
            return
        except Exception as exc:  # noqa: BLE001 - a bug of ours: fail loudly (_broken)
            self._broken(exc)

    def _background_loop(self) -> None:
        direct, pacer = self.direct, self.pacer
        while pacer.sleep():
            busy = pacer.took()
            if self._read_lock.acquire(False):
                try:
                    for _ in range(64):
                        if not self._read_once(0):
                            break
                        busy = True
                except ClusterLostError:   # a frame's answer found the head gone
                    return
                finally:
                    self._read_lock.release()
            if self.lost is not None:
                return
            pacer.done(busy or bool(direct.lent.loans) or self.active or self.refs.pending())
            if direct.lent.loans:
                try:
                    direct.lent.return_idle(LOAN_IDLE_S, ask=True)
                except ClusterLostError:
                    return
            idle = self.objects.idle_spares() if self.objects.spares else None
            if idle:
                self.send(_wire.REF_DELTA, pb.RefDelta(give_back=idle))
            if self.active:   # direct calls went by: tell the head the cluster is busy
                self.active = False
                try:
                    self.send(_wire.REF_DELTA, pb.RefDelta())
                except ClusterLostError:
                    return
            self.flush_refs()
            if self.on_tick is not None:
                try:
                    self.on_tick()
                except ClusterLostError:
                    return

    def _dispatch(self, frames: list[tuple[int, Any]]) -> None:
        """Each frame to its handler (_runtime/client_frames.py); then wake the waiting
        threads if a result or reply came, and pump what that freed."""
        self.pacer.stir()
        wake = False
        handlers = self.handlers
        for kind, msg in frames:
            handler = handlers.get(kind)
            if handler is not None and handler(self, msg):
                wake = True
        direct = self.direct
        if wake:
            self.wake()
            if direct.waiting_routes:
                direct.pump_waiting()
        if self.woken:   # a lent worker ended what the head had sent it: room for more
            woken, self.woken = self.woken, []
            direct.lent.pump_woken(woken)
        if self.refs.decr or self.refs.unpin:
            self.flush_refs()

    def warn(self, text: str) -> None:
        """Show a warning of the head once per process (warnings.warn: the user's
        filters apply; on stderr by default)."""
        if text not in self._warned:
            self._warned.add(text)
            warnings.warn(text, RuntimeWarning, stacklevel=2)

    def _connection_lost(self) -> None:
        if self.book is None:   # else its large puts are copied to a restarted head first
            self.objects.drop_all_maps()
        if self.lost is None:
            if self.closing:
                self.lost = "the connection to the cluster's head process closed"
            elif self.closing_reason:
                self.lost = (f"lost the cluster: its head process stopped ({self.closing_reason}). "
                             "This session is over: orchestra.init() starts a new cluster")
            else:
                self.lost = _LOST
        self.refs.lost = True
        self.wake()
        if self.on_lost is not None and not self.closing:
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
        self.refs.lost = True
        self.conn.shutdown()
        self.wake()
        if self.on_lost is not None and not self.closing:
            self.on_lost()

    def close(self) -> None:
        if self.refs.sealed and self.lost is None and not self.closing:
            self.flush_refs()   # puts whose refs went to processes that outlive this one
        self.closing = True
        self.pacer.stop()
        self.conn.shutdown()
        self.conn.close()
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=2)
        self.direct.close()
        self.objects.drop_all_maps()   # they would keep the segments' memory
