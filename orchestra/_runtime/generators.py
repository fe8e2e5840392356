"""Generator tasks and methods, the caller's side: ObjectRefGenerator (streaming) and
DynamicObjectRefGenerator (dynamic), and the num_returns= values that choose them.

    f.remote() --Call(generator=STREAMING, num_returns=1)--> head --> worker
    worker: each yield --GeneratorItem(task_id + i)--> head: an object of the caller,
        pushed to it --> CoreClient._dispatch: not referenced yet, so kept in the
        stream's ``items`` (Stream.arrived) until next() makes its ref
    worker: end --TaskDone(return 0 = the number of items, or the error)--> the same way

Item i (1, 2, ...) is object ``task_id + i``; return 0 (``task_id + 0``), the "end", is
the task's only return. The worker sends every item before the TaskDone on one
connection, and the head pushes them in order, so once the end is here every item is.
next() waits for item i or the end: item i -> its ref; the end with an error -> the end's
ref (get() raises it) and then StopIteration; the end with a count -> StopIteration.

Counting: the head counts each item as held by the caller from the moment it is pushed
(as a task's returns from its Submit); next()'s ref takes that count over
(``counted=True``), and dropping the ref releases it. Items a dropped generator never
handed out are released as they arrive. Backpressure: next() tells the producing worker
how many items were read (GeneratorAck) when the call asked for
``_generator_backpressure_num_objects``; the worker pauses while that many wait unread.
"""
from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .. import _ids
from .._checks import is_int
from .._protocol import pb
from .._protocol import wire as _wire
from ..exceptions import GetTimeoutError
from .object_ref import ObjectRef

if TYPE_CHECKING:
    from .context import Client

NONE, DYNAMIC, STREAMING = 0, 1, 2
MODES = {"dynamic": DYNAMIC, "streaming": STREAMING}
# Acked for a generator dropped before its end: its producer never pauses again.
_RELEASE_ALL = 1 << 62
# Streams remembered after their generator ended or was dropped, so items that still
# come are released: those of a dropped generator, or of a call that failed when the
# head learnt the death of its actor before the items the actor had sent.
_KEEP_CLOSED = 256


def is_generator_function(fn: object) -> bool:
    return inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)


def generator_mode(num_returns: object, is_generator: bool, what: str) -> int:
    """The Call's ``generator`` for ``num_returns`` (None: not given) of ``what``, a
    function or method that is, or is not, a generator function. A generator streams
    by default, as in Ray; "dynamic" or "streaming" on anything else is refused."""
    if num_returns is None:
        return STREAMING if is_generator else NONE
    if isinstance(num_returns, str):
        mode = MODES.get(num_returns)
        if mode is None:
            raise ValueError(f"num_returns must be an int >= 0, \"dynamic\" or \"streaming\"; "
                             f"got {num_returns!r}")
        if not is_generator:
            raise ValueError(
                f"num_returns={num_returns!r} needs a generator function, and {what} is not "
                "one (it has no `yield`): yield its items, or drop num_returns to return "
                "one value")
        return mode
    return NONE


def check_backpressure(value: object) -> int:
    """_generator_backpressure_num_objects: items the consumer may fall behind before
    the producer pauses; -1, 0 or None: never pauses (Ray's default)."""
    if value is None:
        return 0
    if not is_int(value, -1):
        raise ValueError(f"_generator_backpressure_num_objects must be an int >= 1 (or -1 "
                         f"for no limit), got {value!r}")
    return max(value, 0)


class Stream:
    """What one process keeps of a stream it consumes: items pushed here before next()
    made their refs (object id -> ObjectData). Touched under the client's ref lock."""

    __slots__ = ("tid", "items", "closed")

    def __init__(self, tid: bytes) -> None:
        self.tid = tid
        self.items: dict[bytes, pb.ObjectData] = {}
        self.closed = False   # ended or dropped: release items as they come

    def arrived(self, client: Client, oid: bytes, data: pb.ObjectData) -> None:
        """An item was pushed here (reader thread, under the ref lock)."""
        if not self.closed:
            self.items[oid] = data
        elif not client.refs.lost:
            client.refs.decr.append(oid)   # the head counted it for this process


def close_stream(client: Client, tid: bytes) -> None:
    """Forget a stream whose call was never sent (its submit raised)."""
    with client.refs.lock:
        client.streams.pop(tid, None)


def open_stream(client: Client, tid: bytes) -> Stream:
    """Register a stream before its call is sent (its items may come at once)."""
    st = Stream(tid)
    with client.refs.lock:
        client.streams[tid] = st
    return st


def _retire(client: Client, st: Stream) -> None:
    """The stream's generator ended or was dropped (under the ref lock): items not taken
    are released, now and as they come, for the next _KEEP_CLOSED streams' time."""
    st.closed = True
    if st.items:
        if not client.refs.lost:
            client.refs.decr.extend(st.items)
        st.items.clear()
    closed = client.closed_streams
    closed.append(st.tid)
    while len(closed) > _KEEP_CLOSED:
        client.streams.pop(closed.popleft(), None)


# The items' type, for type checkers: a generator function typed ``-> Iterator[int]``
# streams an ``ObjectRefGenerator[int]``, whose refs are ``ObjectRef[int]``.
Y_co = TypeVar("Y_co", covariant=True)


class ObjectRefGenerator(Generic[Y_co]):
    """The refs of a streaming generator's items, each as soon as the task yields it.

    ``for ref in gen``, ``next(gen)``, ``async for ref in gen``; ``completed()`` is a ref
    ready when the task ends (get() raises its error, if any); ``next_ready()`` says
    whether next() returns at once; ``is_finished()`` whether every item was taken.
    An error of the task arrives at the item it failed on: that ref's get() raises it,
    and the generator stops after it.

    Made by ``f.remote()`` of a generator function: ``client`` is the caller's
    connection, ``stream`` the items as they come, ``end`` the ref of the task's end,
    ``backpressure`` how many items may wait unread (0: no limit).
    """

    def __init__(self, client: Client, stream: Stream, end: ObjectRef, backpressure: int) -> None:
        self._client = client
        self._stream = stream
        self._end = end
        self._backpressure = backpressure
        self._taken = 0          # items handed out
        self._done = False

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> ObjectRefGenerator[Y_co]:
        return self

    def __next__(self) -> ObjectRef[Y_co]:
        ref = self._next(None)
        if ref is None:
            raise StopIteration
        return ref

    def __aiter__(self) -> ObjectRefGenerator[Y_co]:
        return self

    async def __anext__(self) -> ObjectRef[Y_co]:
        if self.next_ready() or self._done:
            ref = self._next(None)
        else:   # wait on a thread: the event loop keeps running
            ref = await asyncio.get_running_loop().run_in_executor(None, self._next, None)
        if ref is None:
            raise StopAsyncIteration
        return ref

    def _next(self, timeout: float | None) -> ObjectRef[Y_co] | None:
        """The next item's ref; the end's ref when the task failed; None at the end."""
        if self._done:
            return None
        client = self._client
        oid = _ids.object_id(self._stream.tid, self._taken + 1)
        items, results, end_id = self._stream.items, client.results, self._end._id
        if oid not in items and end_id not in results:
            deadline = None if timeout is None else time.monotonic() + timeout
            if not client.values.wait_for(lambda: oid in items or end_id in results, deadline):
                raise GetTimeoutError(f"no item of the stream came within {timeout:g} s")
        with client.refs.lock:
            data = items.pop(oid, None)
            if data is not None:
                ref: ObjectRef[Any] = ObjectRef(oid, client, counted=True)   # the count the head holds
                results[oid] = data
        if data is not None:
            self._taken += 1
            if self._backpressure:
                self._ack(self._taken)
            return ref
        self._finish()
        end = results.get(end_id)
        if end is not None and end.WhichOneof("data") == "error":
            return self._end
        return None

    def _finish(self) -> None:
        self._done = True
        client = self._client
        with client.refs.lock:
            _retire(client, self._stream)

    def _ack(self, consumed: int) -> None:
        """Tell the producer how many items were read: on the call's own connection when
        it went straight to an actor, else through the head."""
        client = self._client
        tid = self._stream.tid
        frame = _wire.encode(_wire.GENERATOR_ACK, pb.GeneratorAck(task_id=tid, consumed=consumed))
        route = client.direct.call_route.get(tid)
        inflight = getattr(route, "inflight", None)
        c = inflight.get(tid) if inflight is not None else None
        if c is not None and c.peer is not None and c.peer.send(frame):
            return
        client.send_raw(frame)

    # ------------------------------------------------------------------ Ray's queries
    def completed(self) -> ObjectRef:
        """A ref ready when the task has ended; get() on it raises the task's error."""
        return self._end

    def next_ready(self) -> bool:
        """Whether next() returns at once with an item (False once it would stop)."""
        if self._done:
            return False
        oid = _ids.object_id(self._stream.tid, self._taken + 1)
        return oid in self._stream.items or (
            self._end._id in self._client.results and self._failed())

    def is_finished(self) -> bool:
        """Whether the task ended and every item was taken (next() would stop)."""
        if self._done:
            return True
        oid = _ids.object_id(self._stream.tid, self._taken + 1)
        return self._end._id in self._client.results and oid not in self._stream.items \
            and not self._failed()

    def _failed(self) -> bool:
        end = self._client.results.get(self._end._id)
        return end is not None and end.WhichOneof("data") == "error"

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """Stop consuming: items not taken are released (now, or as they come) and a
        paused producer goes on to its end."""
        self._close(in_finalizer=False)

    def _close(self, in_finalizer: bool) -> None:
        if self._done:
            return
        self._done = True
        client = self._client
        st = self._stream
        with client.refs.lock:
            _retire(client, st)
        if self._backpressure and client.lost is None:
            if in_finalizer:   # a finalizer may run inside a send: never send from it
                try:
                    threading.Thread(target=self._release_producer, daemon=True).start()
                except RuntimeError:   # the interpreter is exiting: so is the cluster
                    pass
            else:
                self._release_producer()

    def _release_producer(self) -> None:
        try:
            self._ack(_RELEASE_ALL)
        except Exception:  # noqa: BLE001 - the cluster is gone: nothing to release
            pass

    def __del__(self) -> None:
        if not self._done and getattr(self, "_client", None) is not None:
            self._close(in_finalizer=True)

    def __reduce__(self) -> Any:
        raise TypeError("an ObjectRefGenerator cannot be pickled or passed to a task: pass "
                        "the refs it yields (or their values) instead")

    def __repr__(self) -> str:
        return f"ObjectRefGenerator({self._stream.tid.hex()}, {self._taken} taken)"


def wait_with_generators(client: Client, items: list[Any], num_returns: int,
                         timeout: float | None) -> tuple[list[Any], list[Any]]:
    """orchestra.wait over refs and ObjectRefGenerators: a generator is ready when next()
    on it returns at once (an item is here, or the stream has ended)."""
    results = client.results
    client.subscribe_missing([x._id for x in items if isinstance(x, ObjectRef)])

    def is_ready(x: ObjectRef | ObjectRefGenerator[Any]) -> bool:
        if isinstance(x, ObjectRef):
            return x._id in results
        return bool(x.next_ready() or x.is_finished())

    def enough() -> bool:
        return sum(1 for x in items if is_ready(x)) >= num_returns

    client.values.wait_for(enough, None if timeout is None else time.monotonic() + timeout)
    ready: list[Any] = []
    not_ready: list[Any] = []
    for x in items:
        (ready if len(ready) < num_returns and is_ready(x) else not_ready).append(x)
    return ready, not_ready


class DynamicObjectRefGenerator:
    """The value of a num_returns="dynamic" task: a ref per item it yielded, in order
    (``refs``); iterate it, or ``len()`` it."""

    def __init__(self, refs: list[ObjectRef]) -> None:
        self._refs = list(refs)

    def __iter__(self) -> Iterator[ObjectRef]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)

    def __reduce__(self) -> Any:
        return (DynamicObjectRefGenerator, (self._refs,))

    def __repr__(self) -> str:
        return f"DynamicObjectRefGenerator({len(self._refs)} refs)"
