"""Frames on unix sockets: the task and result path between the processes of a node.

A frame is ``[u32 little-endian length of what follows][u8 kind][protobuf message]``.
The messages are those of protos/orchestra/_proto/orchestra.proto; this table gives
each its kind byte. Senders coalesce every frame that is ready into one write;
receivers parse every complete frame of one read (FrameDecoder).
"""
from __future__ import annotations

import struct
from typing import Any

from . import pb

_LEN = struct.Struct("<I")

HELLO = 1
HELLO_REPLY = 2
FUNCTION = 3       # RegisterFunctionRequest
SUBMIT = 4         # Submit
OBJECTS = 5        # Objects: put (client -> head) or push (head -> client)
SUBSCRIBE = 6
REF_DELTA = 7
CANCEL = 8         # CancelRequest
EXECUTE = 9        # Execute (head -> worker)
TASK_DONE = 10
RETURN_TASKS = 11
BLOCKED = 12
CANCEL_TASK = 13   # head -> worker
REQUEST = 14
REPLY = 15
SHUTDOWN = 16      # AckReply: driver asks the head to stop the cluster
STEAL = 17         # ReturnTasks, head -> worker: hand back these queued tasks if not started
DROP_MAPS = 18     # SegmentNames, head -> writer
MAP_AHEAD = 19     # SegmentNames, head -> driver
RELEASE_MAPS = 20  # SegmentNames, head -> reader: forget maps kept for later gets
ACTOR_ADDRESS = 21  # head -> caller: the actor's process takes calls straight at this socket
ADOPT = 22         # AdoptCalls, caller -> head: calls left unanswered by a closed actor connection
RELEASE_CALL = 23  # TaskDone, actor -> head -> caller: the actor counted what it keeps of a
                   # direct call's arguments; the caller may drop them
LOAN = 24          # Loan, head -> driver: a worker lent for tasks of one resource shape
LOAN_RETURN = 25   # LoanReturn, driver -> head: the lent worker is given back
LOAN_RECALL = 26   # LoanRecall, head -> driver: give it back once its tasks are answered
EXECUTE_NESTED = 27  # Execute, head -> worker blocked in get(): run it inside that get()
STALLED = 28       # Stalled, head -> driver: no task can progress; log the text
LOAN_REQUEST = 29  # LoanRequest, driver -> head: one more lent worker of this shape, please
NODE_COMMAND = 30  # NodeCommand, head -> a node in a process of its own (_node/process.py)
NODE_EVENT = 31    # NodeEvent, that node -> head (_head/remote_node.py)
CLOSING = 32       # Closing, head -> client: the head stops, and why (its last frame)
WARNING = 33       # ClusterWarning, head -> a task's owner: its request waits for a node to join
WORKER_ADDRESS = 34  # WorkerAddress, worker -> head: it takes direct calls over TCP there
GENERATOR_ITEM = 35  # GeneratorItem, worker -> head: an item a streaming generator yielded
GENERATOR_ACK = 36   # GeneratorAck, consumer -> head -> worker (or straight to an actor's
                     # process): items read, for a producer with backpressure
LOG_LINES = 37     # LogLines, worker -> head -> the job's driver (its log connection)
LOG_FLUSH = 38     # LogFlush, driver -> head -> driver on the log connection: lines sent
TASK_EVENTS = 40   # TaskEventBatch, worker -> head: tasks started and ended (_head/state_query.py)
TASK_EVENTS_FLUSH = 41  # TaskEventFlush, head -> worker: report buffered events now
METRICS = 42       # MetricsBatch, any client -> head: user metrics recorded since the last one
JOB_END = 43       # AckReply, driver -> head: shutdown(); its job ends with its connection

MESSAGES: dict[int, Any] = {
    HELLO: pb.Hello, HELLO_REPLY: pb.HelloReply, FUNCTION: pb.RegisterFunctionRequest,
    SUBMIT: pb.Submit, OBJECTS: pb.Objects, SUBSCRIBE: pb.Subscribe,
    REF_DELTA: pb.RefDelta, CANCEL: pb.CancelRequest, EXECUTE: pb.Execute,
    TASK_DONE: pb.TaskDone, RETURN_TASKS: pb.ReturnTasks, BLOCKED: pb.Blocked,
    CANCEL_TASK: pb.CancelTask, REQUEST: pb.Request, REPLY: pb.Reply,
    SHUTDOWN: pb.AckReply, STEAL: pb.ReturnTasks, DROP_MAPS: pb.SegmentNames,
    MAP_AHEAD: pb.SegmentNames, RELEASE_MAPS: pb.SegmentNames,
    ACTOR_ADDRESS: pb.ActorAddress, ADOPT: pb.AdoptCalls, RELEASE_CALL: pb.TaskDone,
    LOAN: pb.Loan, LOAN_RETURN: pb.LoanReturn, LOAN_RECALL: pb.LoanRecall,
    EXECUTE_NESTED: pb.Execute, STALLED: pb.Stalled, LOAN_REQUEST: pb.LoanRequest,
    NODE_COMMAND: pb.NodeCommand, NODE_EVENT: pb.NodeEvent, CLOSING: pb.Closing,
    WARNING: pb.ClusterWarning, WORKER_ADDRESS: pb.WorkerAddress,
    GENERATOR_ITEM: pb.GeneratorItem, GENERATOR_ACK: pb.GeneratorAck,
    LOG_LINES: pb.LogLines, LOG_FLUSH: pb.LogFlush,
    TASK_EVENTS: pb.TaskEventBatch, TASK_EVENTS_FLUSH: pb.TaskEventFlush,
    METRICS: pb.MetricsBatch, JOB_END: pb.AckReply,
}

MAX_FRAME = 1 << 31


def encode(kind: int, msg: Any) -> bytes:
    body = msg.SerializeToString()
    return _LEN.pack(len(body) + 1) + bytes((kind,)) + body


def frame(kind: int, body: bytes) -> bytes:
    """A frame of a message serialized already (a node's frame relayed by the head)."""
    return _LEN.pack(len(body) + 1) + bytes((kind,)) + body


class ProtocolError(Exception):
    """The peer sent something that is not an orchestra frame."""


class FrameDecoder:
    """Accumulates bytes and yields complete ``(kind, message)`` frames.

    Frames are decoded straight from the bytes that arrive (a memoryview: protobuf copies
    what it keeps); only a frame cut by the end of a read is copied, into ``_buf``, and
    decoded from there once the rest came. Copying every read into one growing buffer
    and each frame out of it cost ~100 us per 100 KB frame when reads brought several
    at once (each read's buffer fresh memory, page-faulted), against ~10 us so."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, Any]]:
        buf = self._buf
        out: list[tuple[int, Any]] = []
        if buf:   # the rest of a frame cut before: complete it first
            if len(buf) < 4:
                take = 4 - len(buf)
                buf += data[:take]
                data = memoryview(data)[take:]
                if len(buf) < 4:
                    return out
            (n,) = _LEN.unpack_from(buf, 0)
            _check_length(n)
            need = 4 + n - len(buf)
            if len(data) < need:
                buf += data
                return out
            buf += data[:need]
            out.append(_decode(memoryview(buf)[4:]))
            buf.clear()
            data = memoryview(data)[need:]
        view = memoryview(data)
        pos, end = 0, len(view)
        unpack = _LEN.unpack_from
        while end - pos >= 4:
            (n,) = unpack(view, pos)
            _check_length(n)
            if end - pos - 4 < n:
                break
            out.append(_decode(view[pos + 4: pos + 4 + n]))
            pos += 4 + n
        if pos < end:
            buf += view[pos:]
        return out


def _check_length(n: int) -> None:
    if n == 0 or n > MAX_FRAME:
        raise ProtocolError(f"bad frame length {n}")


def _decode(body: memoryview) -> tuple[int, Any]:
    """A frame's kind and message from its body (the kind byte, then the message)."""
    kind = body[0]
    cls = MESSAGES.get(kind)
    if cls is None:
        raise ProtocolError(f"unknown frame kind {kind}")
    return kind, cls.FromString(body[1:])
