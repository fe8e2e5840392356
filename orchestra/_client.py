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

import itertools
import mmap
import pickle
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import _ids, _wire
from . import _pb as pb
from ._object_ref import ObjectRef
from ._serialization import Serialized, deserialize, serialize
from ._store import map_ahead, map_segment, open_segment, write_into
from .exceptions import GetTimeoutError, ObjectLostError, ObjectStoreFullError, OrchestraError

_FLUSH_INTERVAL_S = 0.02


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


class ConnectionLost(OrchestraError):
    """The connection to the cluster's head process is gone."""


class CoreClient:
    def __init__(self, sock_path: str, hello: Any, *, connect_timeout_s: float = 30.0,
                 on_frame: Callable[[int, Any], None] | None = None,
                 on_lost: Callable[[], None] | None = None,
                 socket_guard: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None) -> None:
        if socket_guard is not None:
            # The owner wraps every method that reads or writes the socket (a worker
            # defers its cancel signal past them: raised inside, it cut frames in half).
            self.send_raw = socket_guard(self.send_raw)          # type: ignore[method-assign]
            self._read_once = socket_guard(self._read_once)      # type: ignore[method-assign]
        self.sock = _connect(sock_path, connect_timeout_s)
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.on_block: Callable[[bool], None] | None = None
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
        self._read_lock = threading.Lock()   # held by the one thread reading the socket
        self._replies: dict[int, list[Any]] = {}
        self._req_ids = itertools.count(1)
        self._registered: set[bytes] = set()
        self.templates: dict[Any, bytes] = {}   # serialized Call templates of actor methods
        self._keep_until_sent: list[ObjectRef] = []
        self.lost: str | None = None
        self._closing = False
        self.sock.sendall(_wire.encode(_wire.HELLO, hello))
        self.info = self._read_hello(connect_timeout_s)
        self.inline_threshold = self.info.inline_threshold or 100 * 1024
        self._poller = select.poll()
        self._poller.register(self.sock.fileno(), select.POLLIN)
        # One reused buffer: recv(1 MiB) would allocate (and fault in) 1 MiB per read.
        self._buf = bytearray(1 << 18)
        self._view = memoryview(self._buf)
        self._stop = threading.Event()
        if self._early_frames:
            self._dispatch(self._early_frames)
        self._reader = threading.Thread(target=self._background, name="orchestra-reader", daemon=True)
        self._reader.start()

    def _read_hello(self, timeout_s: float) -> Any:
        self.sock.settimeout(timeout_s)
        dec = _wire.FrameDecoder()
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionLost("the head closed the connection during the handshake")
                frames = dec.feed(data)
                for i, (kind, msg) in enumerate(frames):
                    if kind == _wire.HELLO_REPLY:
                        self.sock.settimeout(None)
                        self._decoder = dec
                        self._early_frames = frames[i + 1:]   # sent right after the reply
                        return msg
        except TimeoutError as exc:
            raise ConnectionLost(f"the head did not answer within {timeout_s:g} s") from exc

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
                raise ConnectionLost(f"lost the connection to the cluster: {exc}") from exc

    def send(self, kind: int, msg: Any) -> None:
        self.send_raw(_wire.encode(kind, msg))

    def flush_refs(self) -> None:
        if (self._incr or self._decr or self._pin or self._unpin) and self.lost is None:
            try:
                self.send_raw(b"")
            except ConnectionLost:
                pass

    def request(self, req: Any, timeout_s: float = 60.0) -> Any:
        rid = next(self._req_ids)
        req.req_id = rid
        slot: list[Any] = [None]
        self._replies[rid] = slot
        self.send(_wire.REQUEST, req)
        self._keep_until_sent = []
        if not self.wait_until(lambda: slot[0] is not None, time.monotonic() + timeout_s):
            self._replies.pop(rid, None)
            raise GetTimeoutError(f"the head did not answer a request within {timeout_s:g} s")
        reply = slot[0]
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
            if self.lost is None:
                self._decr.append(oid)

    # ------------------------------------------------------------------ tasks
    def register_function(self, function_id: bytes, req_bytes: bytes) -> None:
        if function_id not in self._registered:
            self.send_raw(req_bytes)
            self._registered.add(function_id)

    def _encode_call(self, template: bytes, tid: bytes, args: Sequence[Any], kwargs: dict[str, Any],
                     keep: list[ObjectRef]) -> bytes:
        parts = [template, b"\x0a\x0c", tid]
        nested: list[bytes] = []
        for value in itertools.chain(args, kwargs.values()):
            parts.append(_field(b"\x1a", self._arg_value(value, keep, nested)))
        for name in kwargs:
            parts.append(_field(b"\x22", name.encode()))
        for oid in nested:
            parts.append(_field(b"\x4a", oid))
        return b"".join(parts)

    def submit(self, template: bytes, num_returns: int, args: Sequence[Any],
               kwargs: dict[str, Any]) -> list[ObjectRef]:
        """Submit one task. ``template`` is a serialized Call with the per-function fields."""
        tid = _ids.next_task_id()
        keep: list[ObjectRef] = []     # puts made for large args live until the Submit is sent
        submit = _field(b"\x0a", self._encode_call(template, tid, args, kwargs, keep))
        frame = (len(submit) + 1).to_bytes(4, "little") + bytes((_wire.SUBMIT,)) + submit
        refs = [ObjectRef(tid + i.to_bytes(4, "big"), self, counted=True) for i in range(num_returns)]
        with self._ref_lock:
            for r in refs:
                self._owned.add(r._id)
        self.send_raw(frame)
        del keep
        return refs

    def build_call(self, tid: bytes, function_id: bytes, args: Sequence[Any], kwargs: dict[str, Any],
                   *, num_returns: int, resources: dict[str, float], name: str) -> Any:
        """A parsed Call (for requests that carry one, like actor creation)."""
        template = pb.Call(function_id=function_id, num_returns=num_returns, resources=resources,
                           name=name).SerializeToString()
        keep: list[ObjectRef] = []
        call = pb.Call.FromString(self._encode_call(template, tid, args, kwargs, keep))
        self._keep_until_sent = keep   # large args stay alive until the request is sent
        return call

    def _arg_value(self, value: Any, keep: list[ObjectRef], nested: list[bytes]) -> bytes:
        if type(value) is ObjectRef:
            return _field(b"\x0a", value._id)
        ser = serialize(value)
        if ser.size > self.inline_threshold:
            ref = self._put_serialized(ser)
            keep.append(ref)
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
        return ref

    def make_object_data(self, oid: bytes, ser: Serialized) -> Any:
        """ObjectData for a sealed value: inline when small, else written to a segment."""
        if ser.size <= self.inline_threshold:
            return pb.ObjectData(object_id=oid, inline=ser.to_bytes(), contained=ser.contained)
        # Drops that came before this put must reach the store before it judges the room
        # (the decrements otherwise travel after the frame, see send_raw).
        self.flush_refs()
        reply = self.request(pb.Request(create_segment=pb.CreateSegment(object_id=oid, size=ser.size)))
        seg = reply.segment
        with self._ref_lock:
            mm = self._wmaps.pop(seg.name, None) if seg.reused else None
        if mm is None or len(mm) < ser.size:
            mm = open_segment(seg)
        write_into(mm, ser)
        with self._ref_lock:
            if self.lost is None:
                self._wmaps[seg.name] = mm
        return pb.ObjectData(object_id=oid, segment=seg, contained=ser.contained)

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
                mm = map_ahead(n)
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
                raise ConnectionLost(self.lost or f"object {oid.hex()} vanished while waited for")
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
        blocked = False
        if self.on_block is not None:
            blocked = True
            self.on_block(True)
        try:
            if not self.wait_until(ready, deadline) and raise_timeout:
                raise GetTimeoutError(
                    f"get() timed out after {timeout:g} s with "
                    f"{sum(1 for oid in ids if oid not in results)} of {n} objects not ready; "
                    "the tasks keep running. Call get() again later or raise the timeout.")
        finally:
            if blocked and self.on_block is not None:
                self.on_block(False)

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
                            raise ConnectionLost(self.lost)
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
                    with cond:
                        cond.notify_all()   # another waiter may take over reading
            with cond:
                if pred():
                    return True
                if self.lost is not None:
                    raise ConnectionLost(self.lost)
                remaining = 0.005 if deadline is None else min(0.005, deadline - time.monotonic())
                if remaining <= 0:
                    return False
                cond.wait(remaining)

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
        mm, view = map_segment(segment)
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
        if self.lost is not None or not self._poller.poll(timeout_ms):
            return False
        try:
            n = self.sock.recv_into(self._buf)
        except OSError:
            n = 0
        if not n:
            self._connection_lost()
            return False
        self._dispatch(self._decoder.feed(self._view[:n]))
        return True

    def _background(self) -> None:
        """Every few ms: read what no waiting thread has read, and flush ref changes.

        It never blocks while holding the read lock, so a thread that starts waiting
        becomes the reader at once.
        """
        while not self._stop.wait(_FLUSH_INTERVAL_S):
            if self._read_lock.acquire(False):
                try:
                    for _ in range(64):
                        if not self._read_once(0):
                            break
                finally:
                    self._read_lock.release()
            if self.lost is not None:
                return
            self.flush_refs()

    def _dispatch(self, frames: list[tuple[int, Any]]) -> None:
        wake = False
        for kind, msg in frames:
            if kind == _wire.OBJECTS:
                with self._ref_lock:
                    local, results = self._local, self._results
                    for d in msg.objects:
                        oid = d.object_id
                        if oid in local:
                            results[oid] = d
                        self._owned.discard(oid)
                wake = True
            elif kind == _wire.DROP_MAPS:
                self._drop_maps(msg.names)
            elif kind == _wire.RELEASE_MAPS:
                self._release_maps(msg.names)
            elif kind == _wire.MAP_AHEAD:
                self._map_ahead(list(msg.names))
            elif kind == _wire.REPLY:
                slot = self._replies.pop(msg.req_id, None)
                if slot is not None:
                    slot[0] = msg
                wake = True
            elif self.on_frame is not None:
                self.on_frame(kind, msg)
                wake = True
        if wake:
            with self._cond:
                self._cond.notify_all()
        if self._decr or self._unpin:
            self.flush_refs()

    def _connection_lost(self) -> None:
        self._drop_maps(list(self._wmaps))
        if self.lost is None:
            self.lost = ("the connection to the cluster's head process closed" if self._closing
                         else "lost the connection to the cluster: its head process exited")
        with self._cond:
            self._cond.notify_all()
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
        self._drop_maps(list(self._wmaps))   # they would keep the segments' memory


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
                raise ConnectionLost(
                    f"could not connect to the head at {path} within {timeout_s:g} s: {exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
