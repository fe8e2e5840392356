"""A driver that outlives its head: connected with init(address=...) to a head that is
started again when it dies (orchestra start --head: HelloReply.reconnect_s > 0), it
connects to the restarted head and goes on.

    the head's connection closes -> CoreClient.on_lost (its reader thread), or a call
        that finds the client lost first -> Rejoin.begin(): one thread tries to connect
        every _PAUSE_S for up to reconnect_s
    current_client() (every call: remote, put, get, actor calls, ...) while it tries:
        waits for it (_context.set_reconnect) -> the new client, or ClusterLostError once
        the wait runs out
    connected again: the session's client is the new one (its namespace and runtime_env
        the same; functions register again as they are called), the log printer too

What the dead head knew is gone: the driver's refs of before raise ObjectLostError
naming the lost head (args.check_session). Its actors are found again on a head with a
state store (detached ones, and those it made: HelloReply.claimed_actors, which die
with it again); their handles work (a call goes to the restarted head), and one whose
process outlived the head (on a joined node) keeps its state (_head/rejoin.py).

Rule: ``lock`` guards ``thread`` and ``client``; the thread alone makes the new client.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable

from .. import _ids
from .._protocol import pb
from .._protocol import wire as _wire
from ..exceptions import ClusterLostError, ObjectStoreError, OrchestraError
from . import context as _context
from .client import CoreClient
from .object_ref import ObjectRef
from .replay import ReplayBook

_log = logging.getLogger("orchestra")
# Between two tries to reach a head that is away (its supervisor starts it again).
_PAUSE_S = 0.2
# Clients of this process that a client of a restarted head replaced: a ref made by one
# names an object lost with its head (args.check_session says so).
replaced: weakref.WeakSet[CoreClient] = weakref.WeakSet()


class Rejoin:
    """Connects a driver's session to its restarted head (see the module docstring)."""

    def __init__(self, address: str, token: str | None, hello: Callable[[], pb.Hello],
                 client: CoreClient, swap: Callable[[CoreClient, CoreClient], None],
                 then: Callable[[], None]) -> None:
        self.address, self.token, self.hello = address, token, hello
        # (old, new): the session takes the new client (quick, under the lock); then():
        # what may take a while (the log printer's new connection), after the waiters
        # were let go.
        self.swap, self.then = swap, then
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)
        self.client = client          # the client now (the new one once connected)
        self.thread: threading.Thread | None = None
        self.failed = ""              # why it gave up ("" while it may still connect)
        self.closed = False
        client.on_lost = self.begin
        keep_calls(client)

    def begin(self) -> None:
        """The client was lost: start connecting again (once per lost client). Called by
        the lost client's reader thread and by calls that found it lost, in any order:
        one whose client was replaced meanwhile (the one now is not lost) does nothing."""
        with self.lock:
            if self.client.lost is not None:
                self.begin_locked()

    def begin_locked(self) -> None:
        if self.thread is not None or self.closed or self.client.closing:
            return
        self.thread = threading.Thread(target=self._connect, name="orchestra-rejoin",
                                       daemon=True)
        self.thread.start()

    def wait(self, old: _context.Client) -> _context.Client | None:
        """For current_client(): the client that replaced ``old`` once connected again
        (None: it gave up, or ``old`` is no client of this session)."""
        self.begin()
        wait_s = self.client.info.reconnect_s
        deadline = time.monotonic() + wait_s + 10.0
        with self.lock:
            while self.client is old and not self.failed and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.done.wait(min(left, 1.0))
            return None if self.client is old or self.client.lost is not None else self.client

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.done.notify_all()

    def _connect(self) -> None:
        old = self.client
        wait_s = old.info.reconnect_s
        deadline = time.monotonic() + wait_s
        why = f"the head did not come back within {wait_s:g} s"
        new: CoreClient | None = None
        while time.monotonic() < deadline and not self.closed:
            time.sleep(_PAUSE_S)
            try:
                new = CoreClient(self.address, self.hello(), token=self.token,
                                 connect_timeout_s=5.0)
                break
            except ClusterLostError:   # away still
                continue
            except (OrchestraError, OSError) as exc:
                if _went_again(exc):   # the head died again as it let this driver in
                    why = str(exc)
                    continue
                why = str(exc)   # refused: the cluster is another
                break
        with self.lock:
            if new is None or self.closed:
                self.failed = why
                self.done.notify_all()
                if new is not None:
                    new.close()
                return
            new.runtime_env = old.runtime_env
            try:
                carry_over(old, new)
            except ClusterLostError as exc:   # the head went again: try again
                new.close()
                self.thread = None
                self.failed = "" if time.monotonic() < deadline else str(exc)
                self.done.notify_all()
                if not self.failed:
                    self.begin_locked()
                return
            replaced.add(old)
            self.swap(old, new)
            self.client = new
            self.thread = None
            new.on_lost = self.begin
            self.done.notify_all()
        self.then()
        old.close()


def _went_again(exc: BaseException) -> bool:
    """Whether a failed connection is the head going away mid-handshake (reset, closed,
    silent), not a refusal (another token, another version)."""
    import ssl
    cause = exc if isinstance(exc, (ConnectionError, TimeoutError)) else exc.__cause__
    return isinstance(cause, (ConnectionError, TimeoutError, ssl.SSLEOFError))


def keep_calls(client: CoreClient, book: ReplayBook | None = None) -> None:
    """``client`` keeps its calls in ``book`` (a new one by default) from now on."""
    client.book = book = book or ReplayBook()
    route = client.direct.call_route
    book.bind(client.refs.lock, lambda r: r in client.owned or r[:-4] in route,
              client.results, client.refs.local, lambda oid: ObjectRef(oid, client))


def copy_large(old: CoreClient, new: CoreClient) -> dict[bytes, pb.ObjectData]:
    """The values in shared memory that refs here hold and that this process still maps
    (its large puts, results it read), copied into new segments of the restarted head:
    object id -> its new ObjectData. Outside the ref lock (each copy asks the head for a
    segment, and the reader thread that brings the answer may need that lock)."""
    with old.refs.lock:
        views = []
        # A copy of the ids: the collector re-enters the lock in this thread to run an
        # ObjectRef's __del__, which changes the dict.
        for oid in list(old.refs.local):
            data = old.results.get(oid)
            if data is None or data.WhichOneof("data") != "segment":
                continue
            kept = old.objects.maps.get(oid)
            view = kept[0] if kept is not None else old.objects.own_view(data.segment)
            if view is not None:
                views.append((oid, view, list(data.contained)))
    copied = {}
    for oid, view, contained in views:
        try:
            copied[oid] = new.objects.copy_object(oid, view, contained)
        except ObjectStoreError as exc:   # no room: made again, or lost (said below)
            _log.warning("orchestra: object %s could not be copied to the restarted head: %s",
                         oid.hex(), exc)
    return copied


def carry_over(old: CoreClient, new: CoreClient) -> None:
    """``new`` (connected to the restarted head) takes ``old``'s refs over, and the head
    learns what it needs of them (_runtime/replay.py): the functions, the values held
    here, the calls still needed, then the releases of returns nothing here holds. Under
    the new connection's lock and the ref lock throughout: no ref's count changes and no
    other frame goes meanwhile. ClusterLostError: the head went again."""
    refs = old.refs
    copied = copy_large(old, new)
    failed: OSError | None = None
    # The client's order: its connection's lock, then the ref lock (a send takes the
    # pending ref changes under the first); taken the other way round, the new client's
    # reader thread, flushing refs, and this thread held one each and waited for ever.
    with new.conn.lock, refs.lock:
        gone = [copied.pop(oid).segment.name for oid in list(copied) if oid not in refs.local]
        new.refs, new.add_ref, new.remove_ref = refs, refs.add, refs.remove
        new.objects.refs = refs
        refs.on_last = new._last_ref_gone
        refs.incr, refs.decr, refs.pin, refs.unpin = [], [], [], []
        refs.sealed = []   # puts the head never heard of: in plan.puts (results) below
        refs.lost = False
        book = old.book
        if book is None:   # nothing kept: every ref of before is lost
            new.book = book = ReplayBook()
        route = old.direct.call_route
        plan = book.plan(lambda r: r in old.owned or r[:-4] in route, old.results,
                         refs.local, list(refs.local), copied)
        new.results.update((d.object_id, d) for d in plan.puts if d.object_id in refs.local)
        new.owned.update(plan.owned)
        keep_calls(new, book)
        frames = new.submitter.registered_again(old.submitter)
        # A kept actor's handle holds its token again (an unknown id: a no-op); one this
        # driver made and claimed again holds it already (HelloReply.claimed_actors),
        # and is let go if no handle of it is left here.
        claimed = set(new.info.claimed_actors)
        handles = [oid for oid in list(refs.local) if _ids.is_actor_id(oid) and oid not in claimed]
        unheld = [oid for oid in claimed if oid not in refs.local]
        if handles or unheld:
            frames.append(_wire.encode(_wire.REF_DELTA, pb.RefDelta(incr=handles, decr=unheld)))
        if plan.puts:
            frames.append(_wire.encode(_wire.OBJECTS, pb.Objects(objects=plan.puts)))
        frames.extend(plan.submits)
        if plan.release:
            frames.append(_wire.encode(_wire.REF_DELTA, pb.RefDelta(decr=plan.release)))
        for i in range(0, len(frames), 256):
            failed = new._write_locked(b"".join(frames[i:i + 256]))
            if failed is not None:
                break
    if failed is not None:
        new._send_failed(failed)   # ClusterLostError: the head went again
    for name in gone:   # copied, and its refs dropped meanwhile (outside the lock: a request)
        new.objects.abort_segment(name)
    if plan.lost:
        _log.warning("orchestra: %d object(s) held here were lost with the cluster's head "
                     "(values this driver can neither copy nor make again: results of actor "
                     "calls in flight, refs other processes made); their gets raise "
                     "ObjectLostError", len(plan.lost))
