"""A process's values: put them, get them, wait for them (the CoreClient's ``values``).

    put(value)  -> serialize -> ObjectIO (inline, or a segment) -> Objects frame to the head
                   (the result kept in client.results: a get here reads it at once)
    get(refs)   -> in client.results? -> ObjectIO.value (inline bytes, or the segment mapped)
                   else subscribe (the head pushes it here) and wait_for it
    wait(refs)  -> the same wait, for k of them

A thread that waits lends its CPU when it runs a task (``on_block``, a worker's hook) and
may run inline the tasks the head hands it meanwhile (``run_nested``). The waiting itself
is the client's: the waiting thread reads the sockets when no other thread does
(CoreClient.wait_until).

Owner: each call runs on the caller's thread; what they share (client.results, the ref
counts) is the client's, under its rules (client.py).
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .. import _ids
from .._objects.io import KEEP_READ_MIN, ObjectIO
from .._objects.refs import RefCounts
from .._objects.serialization import Serialized, serialize
from .._protocol import pb
from .._protocol import wire as _wire
from ..exceptions import ClusterLostError, GetTimeoutError
from .object_ref import ObjectRef, RefCounter

if TYPE_CHECKING:
    from .pacer import Pacer

# Ids a blocked get() names to the head (Blocked): enough to find a task to run inline
# (_scheduler/blocking.py), without a frame the size of a get of 100k refs.
_BLOCKED_IDS = 256


class Hub(RefCounter, Protocol):
    """What values use of their CoreClient (client.py imports this module)."""

    refs: RefCounts
    results: dict[bytes, pb.ObjectData]
    objects: ObjectIO
    info: pb.HelloReply
    lost: str | None
    put_seq: int
    defer_seals: bool   # a driver: its puts reach the head in batches (RefCounts.seal)
    pacer: Pacer

    def send(self, kind: int, msg: Any) -> None: ...
    def flush_refs(self, wait: bool = ...) -> None: ...
    def subscribe_missing(self, ids: Iterable[bytes]) -> None: ...
    def wait_until(self, pred: Callable[[], bool], deadline: float | None) -> bool: ...


class Values:
    """put / get / wait of one process, over its CoreClient."""

    def __init__(self, client: Hub) -> None:
        self.client = client
        # A worker's hook for a get()/wait() that blocks: on_block(True, missing ids) says
        # whether this thread may run tasks inline while it waits (EXECUTE_NESTED);
        # nested_ready() says one came, run_nested() runs it; on_block(False, ()) at the end.
        self.on_block: Callable[[bool, Sequence[bytes]], bool] | None = None
        self.nested_ready: Callable[[], bool] = _never
        self.run_nested: Callable[[], None] | None = None

    # ------------------------------------------------------------------ put
    def put(self, value: object) -> ObjectRef:
        if isinstance(value, ObjectRef):
            raise TypeError("put() of an ObjectRef: pass the ref itself where it is needed, "
                            "or put() its value (orchestra.get(ref)) instead")
        ref = self.put_serialized(serialize(value))
        client = self.client
        data = client.results.get(ref._id)
        if data is not None and data.segment.size >= KEEP_READ_MIN:   # (inline: 0)
            client.objects.keep_read(ref._id, data.segment)
        return ref

    def put_serialized(self, ser: Serialized | None, error: bytes = b"") -> ObjectRef:
        """A new object of ``ser``; or (``ser`` None) one whose get raises ``error`` (a
        pickled exception: the last ref of a dynamic generator that raised)."""
        client = self.client
        oid = _ids.object_id(_ids.next_task_id(), 0)
        data = client.objects.make_object_data(oid, ser) if ser is not None else \
            pb.ObjectData(object_id=oid, error=error)
        ref: ObjectRef[Any] = ObjectRef(oid, client, counted=True)
        refs = client.refs
        with refs.lock:
            client.results[oid] = data
            full = refs.seal(data) if client.defer_seals else None
        client.put_seq += 1
        if full is None:
            client.send(_wire.OBJECTS, pb.Objects(objects=[data]))
        elif full:
            client.flush_refs()
        else:   # sent with the next frame, or by the background thread's next round
            client.pacer.stir()
        return ref

    # ------------------------------------------------------------------ get
    def get_one(self, ref: ObjectRef, timeout: float | None) -> Any:
        client = self.client
        oid = ref._id
        data = client.results.get(oid)
        if data is None:
            self._wait([oid], 1, timeout)
            data = client.results.get(oid)
            if data is None:
                raise ClusterLostError(client.lost or f"object {oid.hex()} vanished while waited for")
        return client.objects.value(oid, data)

    def get_many(self, refs: Sequence[ObjectRef], timeout: float | None) -> list[Any]:
        ids = [r._id for r in refs]
        results = self.client.results
        if any(oid not in results for oid in ids):
            self._wait(ids, len(ids), timeout)
        value = self.client.objects.value
        return [value(oid, results[oid]) for oid in ids]

    def prefetch(self, refs: Sequence[ObjectRef]) -> None:
        """wait(fetch_local=True): the head copies the ready objects of other nodes here."""
        client = self.client
        here = client.info.node_id
        away = [r._id for r in refs if (d := client.results.get(r._id)) is not None
                and d.WhichOneof("data") == "segment" and d.segment.node_id != here]
        if away:
            client.send(_wire.REQUEST, pb.Request(prefetch=pb.Prefetch(object_ids=away)))

    # ------------------------------------------------------------------ wait
    def wait(self, refs: Sequence[ObjectRef], num_returns: int,
             timeout: float | None) -> tuple[list[ObjectRef], list[ObjectRef]]:
        results = self.client.results
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
        results = self.client.results
        self.client.subscribe_missing(ids)
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
        if not self.wait_for(ready, deadline, (oid for oid in ids if oid not in results)) \
                and raise_timeout:
            raise GetTimeoutError(
                f"get() timed out after {timeout:g} s with "
                f"{sum(1 for oid in ids if oid not in results)} of {n} objects not ready; "
                "the tasks keep running. Call get() again later or raise the timeout.")

    def wait_for(self, ready: Callable[[], bool], deadline: float | None,
                 ids: Iterable[bytes] = ()) -> bool:
        """wait_until(ready) as get() waits: a task blocked here lends its CPU. ``ids``:
        the objects it waits for (the first _BLOCKED_IDS are named to the head, whose
        tasks may then run inline on this thread); none named, none runs inline."""
        if ready():
            return True
        wait_until = self.client.wait_until
        if self.on_block is None:
            return wait_until(ready, deadline)
        inline = self.on_block(True, list(itertools.islice(ids, _BLOCKED_IDS)))
        try:
            if inline:
                return self._wait_running_nested(ready, deadline)
            return wait_until(ready, deadline)
        finally:
            if self.on_block is not None:
                self.on_block(False, ())

    def _wait_running_nested(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """wait_until(ready), running the tasks the head hands this blocked thread (the
        ones it waits for, not started elsewhere) as they come: a chain of tasks that
        each wait for the next nests on one worker instead of holding a blocked process
        per level (_scheduler/blocking.py)."""
        has_nested, run = self.nested_ready, self.run_nested
        assert run is not None
        while True:
            if not self.client.wait_until(lambda: ready() or has_nested(), deadline):
                return False
            if ready():
                return True
            run()


def _never() -> bool:
    return False
