"""Generator tasks and methods, the worker's side: run the generator a call returned and
hand on its items (the caller's side, and the ids of items: _runtime/generators.py).

    streaming: each yield -> serialize -> ObjectData (inline, or a segment) ->
        GeneratorItem(task_id + i) to the head at once, before the call's TaskDone on the
        same connection -> the call's value: the number of items
    dynamic: each yield -> put -> its ref; the call's value: DynamicObjectRefGenerator
    backpressure (Call.generator_backpressure = n): after item i, wait while the
        consumer has read fewer than i - n + 1 (GeneratorAck, through the head or
        straight from the caller of a direct call)

A direct call (straight from its caller to an actor) sends its items to the head too,
named for the caller's connection (GeneratorItem.owner), and its TaskDone then goes
through the head as well (``heavy``), so the end follows the items there.
"""
from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any

from .. import _ids
from .._checks import a_type
from .._objects.serialization import dumps_exception, serialize
from .._protocol import pb
from .._protocol import wire as _wire
from .._runtime.generators import DYNAMIC, DynamicObjectRefGenerator
from .calls import task_error

_MODE_NAMES = {1: "dynamic", 2: "streaming"}
_ASYNC_POLL_S = 0.002   # how often a paused async generator looks for the consumer's acks


class Acks:
    """Items read by the consumers of this worker's streams with backpressure: task id
    -> count. Set by the reader thread, waited on by the generator's thread."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.read: dict[bytes, int] = {}

    def start(self, tid: bytes) -> None:
        with self.cond:
            self.read.setdefault(tid, 0)

    def ack(self, tid: bytes, consumed: int) -> None:
        with self.cond:
            if tid in self.read and consumed > self.read[tid]:   # else: ended, or stale
                self.read[tid] = consumed
                self.cond.notify_all()

    def wait(self, tid: bytes, at_least: int) -> None:
        """Until ``at_least`` items were read (a cancel's signal raises in here)."""
        with self.cond:
            while self.read.get(tid, at_least) < at_least:
                self.cond.wait(1.0)

    def done(self, tid: bytes) -> None:
        with self.cond:
            self.read.pop(tid, None)


class _Sender:
    """Sends one streaming call's items as GeneratorItem frames."""

    def __init__(self, worker: Any, call: pb.Call) -> None:
        self.worker = worker
        self.tid = call.task_id
        self.limit = call.generator_backpressure
        route = worker.reply_to.get(self.tid)
        self.owner = route[1] if route is not None else 0
        if route is not None:   # the end goes through the head, after the items
            worker.heavy.add(self.tid)
            worker.direct_streams[self.tid] = call.name
        self.count = 0
        if self.limit:
            worker.acks.start(self.tid)

    def send(self, value: object) -> None:
        self.count += 1
        tid = self.tid
        client = self.worker.client
        item = pb.GeneratorItem(task_id=tid, index=self.count, owner=self.owner)
        client.objects.make_object_data(_ids.object_id(tid, self.count), serialize(value), item.data)
        # ``value`` (and refs inside it) lives until the frame is sent: their release
        # cannot reach the head before the item that holds them.
        client.send(_wire.GENERATOR_ITEM, item)

    def behind(self) -> int:
        """Items read the consumer must reach before the next item is made; 0: go on."""
        if not self.limit:
            return 0
        need = self.count - self.limit + 1
        return need if self.worker.acks.read.get(self.tid, need) < need else 0

    def close(self) -> None:
        if self.limit:
            self.worker.acks.done(self.tid)


def _iterator(call: pb.Call, result: Any) -> Any:
    if inspect.isgenerator(result) or hasattr(result, "__next__"):
        return result
    raise TypeError(f"{call.name}() has num_returns={_MODE_NAMES[call.generator]!r} but returned "
                    f"{a_type(result)}, not a generator: write it with `yield`, or "
                    "drop num_returns to return one value")


def produce(worker: Any, call: pb.Call, result: Any) -> Any:
    """Run the generator ``result`` of a generator call to its end (items handed on as
    they come); the call's value."""
    if inspect.isasyncgen(result):   # an async generator in a task or sync actor
        return asyncio.run(produce_async(worker, call, result))
    it = _iterator(call, result)
    if call.generator == DYNAMIC:
        # Each value put as it comes; an error ends the list with a ref that raises it
        # (the values before it keep theirs), as Ray's dynamic generators do.
        put, refs = worker.client.values.put, []
        try:
            for v in it:
                refs.append(put(v))
        except Exception as exc:  # noqa: BLE001 - the generator's own error, into its ref
            refs.append(worker.client.values.put_serialized(None, dumps_exception(task_error(call, exc))))
        return DynamicObjectRefGenerator(refs)
    sender = _Sender(worker, call)
    try:
        for value in it:
            sender.send(value)
            del value
            need = sender.behind()
            if need:
                worker.acks.wait(sender.tid, need)
    finally:
        sender.close()
    return sender.count


async def produce_async(worker: Any, call: pb.Call, agen: Any) -> Any:
    """produce() for an async generator (an async actor's method): paused on the event
    loop, other calls run meanwhile."""
    if call.generator == DYNAMIC:   # as produce()'s: an error ends the list in a ref
        put, refs = worker.client.values.put, []
        try:
            async for v in agen:
                refs.append(put(v))
        except Exception as exc:  # noqa: BLE001 - the generator's own error, into its ref
            refs.append(worker.client.values.put_serialized(None, dumps_exception(task_error(call, exc))))
        return DynamicObjectRefGenerator(refs)
    sender = _Sender(worker, call)
    try:
        async for value in agen:
            sender.send(value)
            del value
            while sender.behind():
                await asyncio.sleep(_ASYNC_POLL_S)
    finally:
        sender.close()
    return sender.count
