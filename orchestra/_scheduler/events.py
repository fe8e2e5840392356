"""Events the scheduler core takes from the processes of the cluster, in its own words.
No I/O.

    a frame read by the head (TaskDone, Hello, ...) --_head/frames.py, the edge-->
        one of these --> SchedulerState.task_done(conn, TaskDone(...)), ...

Each is a small immutable value with the fields the scheduler reads (defaults for those
most events leave out). An object's value comes as the scheduler's Data (data.py: what
it reads of it, the message kept for forwarding); a call as submitted, as it came.
Events with a field or two are plain arguments instead (``return_tasks(conn,
task_ids)``, ``generator_ack(task_id, consumed)``, ``blocked(conn, blocked, object_ids,
...)``).

NamedTuples, as the instructions are (instructions.py says what they cost): TaskDone
is made once per task.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .call import Call
from .data import Data


class Hello(NamedTuple):
    """A process connected: ``kind`` "driver", "worker" (``worker_id``, the id it was
    started with) or another client of the head. A worker that outlived a restart of
    the head names what it runs: the actor (``resume_actor``) or the task
    (``resume_task``); a driver its key (``driver_key``: a driver of before connecting
    again) and its ``namespace``."""

    kind: str
    pid: int = 0
    worker_id: int = 0
    namespace: str = ""
    driver_key: bytes = b""
    resume_actor: bytes = b""
    resume_task: bytes = b""


class TaskDone(NamedTuple):
    """Task ``task_id`` ended on the worker that sent this: ``returns`` are its results
    (Data each; its error's, when it raised: ``user_error``), ``cancelled`` when a
    cancel ended it, ``not_retryable`` when its error must not be retried. ``owner``: a
    call a caller sent straight to the worker, answered through the head (the caller's
    connection), with its Call as ``lineage`` when it may be rebuilt."""

    task_id: bytes
    returns: Sequence[Data] = ()
    user_error: bool = False
    cancelled: bool = False
    not_retryable: bool = False
    owner: int = 0
    lineage: Call | None = None


class GeneratorItem(NamedTuple):
    """Item ``number`` (from 1) of generator task ``task_id``: its object's ``data``.
    ``owner``: a direct call's caller, as in TaskDone."""

    task_id: bytes
    number: int
    data: Data
    owner: int = 0


class AdoptCalls(NamedTuple):
    """A caller hands the head the calls it sent straight to worker ``worker_id`` (an
    actor's: ``actor_id``; else a worker lent to it) that are not answered (``calls``),
    those it cancelled and those answered meanwhile (task ids): the head takes them
    over (adoption.py)."""

    worker_id: int
    calls: Sequence[Call] = ()
    actor_id: bytes = b""
    cancelled: Sequence[bytes] = ()
    answered: Sequence[bytes] = ()


class MemoryPressure(NamedTuple):
    """A node's memory passed its threshold: ``used`` of ``limit`` bytes (``where``
    says whose limit: the cgroup's or the machine's), ``threshold`` the fraction, and
    each worker's own memory (worker id -> bytes)."""

    used: int
    limit: int
    threshold: float
    where: str
    workers: Mapping[int, int]


Event = Hello | TaskDone | GeneratorItem | AdoptCalls | MemoryPressure
