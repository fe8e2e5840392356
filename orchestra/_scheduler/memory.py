"""Whom a node's memory monitor kills: its node asks (_node/memory.py), the head decides
here. No I/O.

    Head.memory_pressure(node id, NodeMemoryPressure) -> choose(its busy workers,
        pressure) -> KillWorker(node, worker, reason), or None: no worker to kill (the
        node asks again a few seconds later)
    the order: the worker of the newest retriable task first (it runs again, and has
        done the least; a worker lent to a driver, whose direct calls the head does not
        see, counts as one, older than any the head sent), then that of the newest task
        without retries, then, as a last
        resort, the newest actor's process; the head, the object store and the drivers
        are no workers, so never a victim. An idle worker holds little and is not one.
    the reason: MEMORY_KILL, the node's usage, the limit, the threshold and what the
        process held alone: the task's OutOfMemoryError names them (_objects/errors.py)
    the victim's task is retried per its max_retries, later (RetryLater): 1 s after its
        first attempt, doubled with each attempt up to 30 s, so that the memory the
        others hold has time to come back (the head's tick runs it again)
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from .._objects.errors import MEMORY_KILL
from .events import MemoryPressure
from .instructions import KillWorker
from .model import Task, Worker

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


class Candidate(NamedTuple):
    rank: int          # 0: a retriable task's, 1: a task's without retries, 2: an actor's
    newest: int        # the higher, the newer (a task's send order, an actor's worker id)
    worker_id: int


def candidates(workers: Iterable[Worker]) -> list[Candidate]:
    """The busy workers a monitor may kill, each with its place in the order."""
    out = []
    for w in workers:
        if w.actor is not None:
            if w.conn >= 0:
                out.append(Candidate(2, w.worker_id, w.worker_id))
        elif w.queue:
            t = w.queue[0]   # the one it runs
            out.append(Candidate(0 if t.retries_left != 0 else 1, t.seq, w.worker_id))
        elif w.lent_to is not None:   # it runs a driver's direct calls (loans.py), unseen
            out.append(Candidate(0, 0, w.worker_id))
    return out


def pick(cands: Iterable[Candidate]) -> Candidate | None:
    """The first victim in the order (the module docstring)."""
    return min(cands, key=lambda c: (c.rank, -c.newest), default=None)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def reason(p: MemoryPressure, node: str, worker_id: int) -> str:
    """Why the worker is killed, in words (the start is MEMORY_KILL)."""
    share = f"{p.used / p.limit:.0%}" if p.limit else "?"
    return (f"{MEMORY_KILL}: node {node} used {_gib(p.used)} of {_gib(p.limit)} ({share}, "
            f"past its threshold of {p.threshold:.0%}; {p.where}), and this process held "
            f"{_gib(p.workers.get(worker_id, 0))} of its own")


def choose(workers: Iterable[Worker], p: MemoryPressure, node_id: int,
           node: str) -> KillWorker | None:
    """The kill that answers the pressure ``p`` of node ``node_id`` (``node``: its name
    in words), or None when no worker of it is busy."""
    victim = pick(candidates(w for w in workers if w.node_id == node_id))
    if victim is None:
        return None
    return KillWorker(node_id, victim.worker_id, reason(p, node, victim.worker_id))


class RetryLater:
    """Tasks the memory monitor's kill left to run again, held until their time (see the
    module docstring). ``tick`` (the head's, with its clock) runs again those due: a
    task cancelled meanwhile fails as cancelled instead."""

    def __init__(self, requeue: Callable[[Task], None],
                 cancelled: Callable[[Task], None]) -> None:
        self.requeue, self.cancelled = requeue, cancelled
        self.now = 0.0   # the head's clock at its last tick
        self.held: list[tuple[float, Task]] = []

    def hold(self, t: Task) -> None:
        delay = min(RETRY_FIRST_S * 2 ** max(t.attempt - 1, 0), RETRY_MAX_S)
        self.held.append((self.now + delay, t))

    def tick(self, now: float) -> bool:
        """True when a task was made ready (the caller schedules)."""
        self.now = now
        if not self.held:
            return False
        due = [t for at, t in self.held if at <= now]
        self.held = [(at, t) for at, t in self.held if at > now]
        for t in due:
            (self.cancelled if t.cancelled else self.requeue)(t)
        return bool(due)
