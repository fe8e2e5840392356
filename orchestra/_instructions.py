"""Instructions of the scheduler core to the I/O layer. No I/O.

    SchedulerState / ActorTable / Blocking / Loans --append--> state.out
        --> Head.carry_out: dispatch on ``type(ins)`` -> frames queued per connection,
            workers started / killed / stopped on their node, segments freed

Each instruction is a small immutable value with typed fields; every one that concerns
a node names it (``node_id``), so a head that runs several nodes knows where to act.

They are ``typing.NamedTuple`` subclasses, not frozen dataclasses: one is made for every
frame on the hot path (submit -> Execute -> TaskDone -> Objects), and a NamedTuple is
built at tuple speed (a frozen dataclass's __init__ goes through object.__setattr__,
~3x slower). Measured on this code base's head machine, 1M built and dispatched on
``type(ins) is X``: see the figures in the commit that introduced this module and in
tests/unit/test_instructions.py.
"""
from __future__ import annotations

from typing import Any, NamedTuple


class Send(NamedTuple):
    """Encode ``msg`` as a frame of ``kind`` and queue it on connection ``conn``; all
    frames queued for a connection go out in one write after the batch."""

    conn: int
    kind: int
    msg: Any


class Push(NamedTuple):
    """Deliver an object (``data``, a pb.ObjectData) to connection ``conn``: the pushes
    of one batch to one connection are coalesced into one Objects frame."""

    conn: int
    data: Any


class LateSend(NamedTuple):
    """As Send, but written after every other frame of the batch: a grant the receiver
    must see before it (a Lease after the Execute it names, an ActorAddress after the
    calls sent through the head) is never overtaken."""

    conn: int
    kind: int
    msg: Any


class StartWorker(NamedTuple):
    """Start the worker process ``worker_id`` on node ``node_id``; it connects with a
    Hello naming that id (or its death is reported as a failure to start)."""

    node_id: int
    worker_id: int


class KillWorker(NamedTuple):
    """Kill worker ``worker_id`` on node ``node_id`` at once (SIGKILL); ``reason`` is
    kept as its exit reason for the errors its death causes."""

    node_id: int
    worker_id: int
    reason: str


class StopWorker(NamedTuple):
    """Worker ``worker_id`` on node ``node_id`` is idle and surplus: make it exit. It
    runs nothing, so no error names the reason."""

    node_id: int
    worker_id: int


class FreeSegment(NamedTuple):
    """Free the object store entry ``key`` on node ``node_id``: the shared-memory
    segment's name, or the spill file's path."""

    node_id: int
    key: str


Instruction = Send | Push | LateSend | StartWorker | KillWorker | StopWorker | FreeSegment
