"""Instructions of the scheduler core to the I/O layer. No I/O.

    SchedulerState / ActorTable / Blocking / Loans --append--> state.out
        --> Head.carry_out: dispatch on ``type(ins)`` -> frames queued per connection
            (_head/outbound.py turns each into its frame), workers started / killed /
            stopped on their node, segments freed

Each instruction is a small immutable value with typed fields, in the scheduler's
words: what to do, not how it is written. Those to a process name its connection
(``conn``); every one that concerns a node names it (``node_id``), so a head that runs
several nodes knows where to act. A task's Call (call.py), a function's FunctionDef
and an object's Data (data.py) are the scheduler's own values, which the edge writes
as the message each came in (with what the scheduler changed in a call written into
it first).

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

from .call import Call, FunctionDef
from .data import Data


class Execute(NamedTuple):
    """Run the task ``call`` (its Call, as submitted) on the worker of connection
    ``conn``: ``resolved`` holds the values of its ref arguments (Data, in the order
    of the call's refs), ``gpu_ids`` the GPUs the worker holds, ``attempt`` the try
    (0 the first). ``nested``: the worker is blocked in a get(), and runs it there,
    inside the task it blocks (a task of its own submitting it waits on it)."""

    conn: int
    call: Call
    resolved: list[Data]
    gpu_ids: Any
    attempt: int
    nested: bool = False


class Function(NamedTuple):
    """Give the worker of connection ``conn`` the function ``fn`` (as registered: its
    id, name and pickled code) before the first task of it it runs."""

    conn: int
    fn: FunctionDef


class CancelTask(NamedTuple):
    """Ask the worker of ``conn`` to cancel task ``task_id`` (queued there: dropped;
    running: interrupted), and with ``recursive`` the tasks it submitted."""

    conn: int
    task_id: bytes
    recursive: bool = False


class ReturnTasks(NamedTuple):
    """Ask the worker of ``conn`` to hand back the tasks ``task_ids``, queued there
    behind the one it runs and not started (it answers each as returned, or runs it if
    it started meanwhile)."""

    conn: int
    task_ids: list[bytes]


class Shutdown(NamedTuple):
    """Ask the worker of ``conn`` to report what it buffered and exit."""

    conn: int


class Warn(NamedTuple):
    """Show the driver of ``conn`` the warning ``text`` (a task or group that no node
    can hold yet, ...)."""

    conn: int
    text: str


class Stalled(NamedTuple):
    """Tell the driver of ``conn`` that no task can progress: ``text`` says why,
    ``task_ids`` are the blocked tasks."""

    conn: int
    text: str
    task_ids: list[bytes]


class GeneratorAck(NamedTuple):
    """Tell the worker of ``conn`` running generator task ``task_id`` that its consumer
    has read ``consumed`` items (it pauses that far ahead)."""

    conn: int
    task_id: bytes
    consumed: int


class Push(NamedTuple):
    """Deliver an object (``data``, its value) to connection ``conn``: the pushes
    of one batch to one connection are coalesced into one Objects frame."""

    conn: int
    data: Data


# The three below are grants the receiver must see after every other frame of the batch
# (a Loan after the Execute it names, an ActorAddress after the calls sent through the
# head): the head writes them last, so none is overtaken.

class Loan(NamedTuple):
    """Lend worker ``worker_id`` (pid ``pid``, holding ``resources``) to the driver of
    ``conn``, which sends it tasks straight over ``path``. ``busy_task``: the task it
    runs now (empty: idle); ``pinned_node``: the node the loan is for (0: any)."""

    conn: int
    worker_id: int
    path: str
    resources: dict[str, float]
    pid: int
    busy_task: bytes
    pinned_node: int


class LoanRecall(NamedTuple):
    """Ask the driver of ``conn`` to give worker ``worker_id`` back."""

    conn: int
    worker_id: int


class ActorAddress(NamedTuple):
    """Tell the caller of ``conn`` that actor ``actor_id`` (worker ``worker_id``) takes
    its calls straight at ``path``, after the ``dispatched`` of them that went through
    the head."""

    conn: int
    actor_id: bytes
    worker_id: int
    path: str
    dispatched: int


LATE = (Loan, LoanRecall, ActorAddress)


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
    """Keep record ``key`` of ``table`` in the head's state store as ``value`` (a
    record of _scheduler/durable.py's tables, which the head's edge writes as bytes:
    _head/records.py; None: delete it): a change of what a restarted head must know.
    Written off the loop, in order, never per task."""

    table: str
    key: str
    value: Any


# What goes to a connection: a frame each (Push: coalesced per connection).
ToConn = (Execute | Function | CancelTask | ReturnTasks | Shutdown | Warn | Stalled | GeneratorAck
          | Push | Loan | LoanRecall | ActorAddress)
Instruction = ToConn | StartWorker | KillWorker | StopWorker | FreeSegment | Pull | Durable
