"""What a worker does with each frame for it: tables of small handlers, as the head's
(_head/frames.py) and its client's (_runtime/client_frames.py).

    head --EXECUTE, CANCEL_TASK, ...--> the client's reader --HEAD_FRAMES[kind](rt, msg)
        (joined to the client's own table: CoreClient(frames=table(rt)))
    a caller straight to this actor or lent worker --EXECUTE, STEAL, ...--> DirectCalls
        --PEER_FRAMES[kind](rt, peer, msg) (WorkerRuntime.on_peer_frame)

Both run on the client's reading thread; what they hand the worker's main thread
(``queue``, ``nested``) is taken under ``rt.cond``.
"""
from __future__ import annotations

import collections
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

from .._protocol import pb
from .._protocol import wire as _wire
from .._protocol.connection import Connection
from .._runtime.client import CoreClient


class Runtime(Protocol):
    """What the handlers use of the WorkerRuntime (_worker/worker.py)."""

    client: CoreClient
    cond: threading.Condition
    blocked: bool
    actor: Any
    queue: collections.deque[pb.InvokeCallRequest]
    nested: collections.deque[pb.InvokeCallRequest]
    functions: dict[bytes, pb.RegisterFunctionRequest]
    reply_to: dict[bytes, Any]
    acks: Any      # _worker/producer.py's Acks
    events: Any    # _observe/task_events.py's WorkerEvents

    def _cancel(self, task_id: bytes, recursive: bool = False) -> None: ...
    def _give_back(self, wanted: set[bytes]) -> None: ...
    def _take_queued(self, wanted: set[bytes], peer: Connection) -> list[bytes]: ...


# ---------------------------------------------------------------------- from the head
def _execute(rt: Runtime, msg: pb.Execute) -> None:
    with rt.cond:
        if not rt.blocked:
            rt.queue.append(msg.invoke)
            return
    # Blocked in get(): the head places it elsewhere.
    rt.client.send(_wire.RETURN_TASKS, pb.ReturnTasks(task_ids=[msg.invoke.call.task_id]))


def _execute_nested(rt: Runtime, msg: pb.Execute) -> None:
    with rt.cond:   # for the thread blocked in get() (_scheduler/blocking.py)
        rt.nested.append(msg.invoke)


def _function(rt: Runtime, msg: pb.RegisterFunctionRequest) -> None:
    rt.functions[msg.function_id] = msg


def _cancel_task(rt: Runtime, msg: pb.CancelTask) -> None:
    rt._cancel(msg.task_id, msg.recursive)


def _steal(rt: Runtime, msg: pb.ReturnTasks) -> None:
    rt._give_back(set(msg.task_ids))


def _generator_ack(rt: Runtime, msg: pb.GeneratorAck) -> None:
    rt.acks.ack(msg.task_id, msg.consumed)


def _task_events_flush(rt: Runtime, msg: pb.TaskEventFlush) -> None:
    rt.client.send(_wire.TASK_EVENTS, rt.events.take(msg.flush_id))   # a state query waits


def _shutdown(rt: Runtime, msg: pb.AckReply) -> None:
    try:   # let go: what ran here is reported first
        if rt.events.started or rt.events.ended:
            rt.client.send(_wire.TASK_EVENTS, rt.events.take())
    finally:
        os._exit(0)


HEAD_FRAMES: dict[int, Callable[[Runtime, Any], None]] = {
    _wire.EXECUTE: _execute,
    _wire.EXECUTE_NESTED: _execute_nested,
    _wire.FUNCTION: _function,
    _wire.CANCEL_TASK: _cancel_task,
    _wire.STEAL: _steal,
    _wire.GENERATOR_ACK: _generator_ack,
    _wire.TASK_EVENTS_FLUSH: _task_events_flush,
    _wire.SHUTDOWN: _shutdown,
}


def table(rt: Runtime) -> dict[int, Callable[[Any], None]]:
    """HEAD_FRAMES bound to ``rt``: the worker's kinds for its client's table."""
    return {kind: functools.partial(fn, rt) for kind, fn in HEAD_FRAMES.items()}


# ---------------------------------------------------------------------- from callers
def _peer_execute(rt: Runtime, peer: Connection, msg: pb.Execute) -> None:
    inv = msg.invoke
    held = bool(inv.call.nested) or any(d.WhichOneof("data") == "segment" for d in inv.resolved)
    with rt.cond:
        if not rt.blocked or rt.actor is not None:
            rt.reply_to[inv.call.task_id] = (peer, inv.owner, held)
            rt.queue.append(inv)
            return
    # Blocked in get(): hand it back to its sender, to run elsewhere.
    peer.send(_wire.encode(_wire.RETURN_TASKS, pb.ReturnTasks(task_ids=[inv.call.task_id])))


def _peer_cancel_task(rt: Runtime, peer: Connection, msg: pb.CancelTask) -> None:
    rt._cancel(msg.task_id, msg.recursive)


def _peer_function(rt: Runtime, peer: Connection, msg: pb.RegisterFunctionRequest) -> None:
    rt.functions.setdefault(msg.function_id, msg)


def _peer_steal(rt: Runtime, peer: Connection, msg: pb.ReturnTasks) -> None:
    back = rt._take_queued(set(msg.task_ids), peer)
    for tid in back:
        rt.reply_to.pop(tid, None)
    # Always answered, so the sender knows what stays.
    peer.send(_wire.encode(_wire.RETURN_TASKS, pb.ReturnTasks(task_ids=back)))


def _peer_generator_ack(rt: Runtime, peer: Connection, msg: pb.GeneratorAck) -> None:
    rt.acks.ack(msg.task_id, msg.consumed)


PEER_FRAMES: dict[int, Callable[[Runtime, Connection, Any], None]] = {
    _wire.EXECUTE: _peer_execute,
    _wire.CANCEL_TASK: _peer_cancel_task,
    _wire.FUNCTION: _peer_function,
    _wire.STEAL: _peer_steal,
    _wire.GENERATOR_ACK: _peer_generator_ack,
}


__all__ = ["HEAD_FRAMES", "PEER_FRAMES", "Runtime", "table"]
