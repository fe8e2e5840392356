"""Instructions of the scheduler core to the I/O layer. No I/O.

    SchedulerState / ActorTable / Blocking / Loans --append--> state.out
        --> Head.carry_out: dispatch on ``type(ins)`` -> frames queued per connection,
            workers started / killed / stopped on their node, segments freed

Each instruction is a small immutable value with typed fields; every one that concerns
a node names it (``node_id``), so a head that runs several nodes knows where to act.

They are ``typing.NamedTuple`` subclasses: typed, immutable, compared by value, and
cheaper to build than a frozen dataclass (whose __init__ goes through
object.__setattr__). Not free, though: measured with callgrind (CPython 3.11, machine
instructions), building one costs ~5.6k against ~1.7k for the plain tuple literal used
before (any tuple subclass instance costs ~4.2k to allocate; NamedTuple's Python
__new__ adds the rest), and dispatching on ``type(ins) is X`` ~0.1k more than on a
string in position 0. With two per task on the hot path that is ~+5k of the ~189k the
scheduler spent per task (submit -> dispatch -> task_done -> free), and
after_worker_step, which no longer lists every worker twice per finished task, won back
~9k: the hot path got cheaper overall (~185k). Wall clock for 1M built, on a loaded
machine: tuple 0.3 s, NamedTuple 1.2-1.3 s, frozen dataclass 1.6-2.1 s.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from .._protocol import pb


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
    data: pb.ObjectData


class LateSend(NamedTuple):
    """As Send, but written after every other frame of the batch: a grant the receiver
    must see before it (a Loan after the Execute it names, an ActorAddress after the
    calls sent through the head) is never overtaken."""

    conn: int
    kind: int
    msg: Any


class StartWorker(NamedTuple):
    """Start the worker process ``worker_id`` on node ``node_id``; it connects with a
    Hello naming that id (or its death is reported as a failure to start)."""

    node_id: int
    worker_id: int


# A KillWorker's reason when the task its worker runs is cancelled with force: the
# worker's death then reads as that cancel (TASK_CANCELLED in the state API).
CANCEL_KILL = "cancelled with force=True"

class KillWorker(NamedTuple):
    """Kill worker ``worker_id`` on node ``node_id`` at once (SIGKILL); ``reason`` is
    kept as its exit reason for the errors its death causes."""

    node_id: int
    worker_id: int
    reason: str


class StopWorker(NamedTuple):
    """Worker ``worker_id`` on node ``node_id`` is idle and surplus: make it exit. It
    runs nothing, so no error names the reason. The scheduler asks it first (SHUTDOWN
    on its connection: it reports its task events, then exits); the node kills it if it
    is still there a grace period later."""

    node_id: int
    worker_id: int


class FreeSegment(NamedTuple):
    """Free the object store entry ``key`` on node ``node_id``: the shared-memory
    segment's name, or the spill file's path."""

    node_id: int
    key: str


class Pull(NamedTuple):
    """Have node ``node_id`` pull a copy of object ``object_id`` into its store, from a
    node that holds one (a task dispatched there reads it: fetched before it asks)."""

    node_id: int
    object_id: bytes


class Durable(NamedTuple):
    """Keep record ``key`` of ``table`` in the head's state store as ``value`` (None:
    delete it): a change of what a restarted head must know (_scheduler/durable.py).
    Written off the loop, in order, never per task."""

    table: str
    key: str
    value: bytes | None


Instruction = (Send | Push | LateSend | StartWorker | KillWorker | StopWorker | FreeSegment
               | Pull | Durable)
