"""Results made again: what a node's death does to the tasks, and what a finished task
keeps so that it can. No I/O.

    task done (several nodes) --> keep: its results in shared memory hold its Lineage
        (call, retries left, owner), named before its arguments are released
        (ObjectDirectory.set_lineage: a freed argument then leaves a tomb)
    node lost --> ObjectDirectory.node_lost: the objects whose only copy was there are
        pending again (or hold ObjectLostError) --> wait_again: tasks not sent yet wait
        for them (and a task sent before, when it runs again: wait_for_made_again)
        --> rebuild: their tasks run again; an argument freed since is revived
        from its tomb, and its own task runs again first when it left no value

A rebuild spends one retry of the lineage it runs; a run with none left keeps no lineage
(its result is lost for good with a second node). ``Rebuilds`` is SchedulerState's
helper, as Loans and Blocking are; the tombs and counts are the ObjectDirectory's.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from .call import Call
from .data import Data
from .model import Lineage, Obj, SchedulerCore, Task, TaskState
from .objects import ObjectDirectory


def wait_for_made_again(t: Task, objects: Mapping[bytes, Obj]) -> bool:
    """``t`` waits (deps) for those of its arguments that are pending again (made again:
    their node died); True when it waits for one. A task sent before that death is
    left alone by wait_again, and checked here when it runs again (a retry, handed
    back): sent with no data for such an argument, it killed the head's loop."""
    waits = False
    for oid in t.call.refs:
        o = objects.get(oid)
        if o is not None and o.data is None and oid not in t.deps:
            t.deps.add(oid)
            o.waiting_tasks.append(t)
            waits = True
    return waits


class Rebuilds:
    """The lineage decisions of a SchedulerState (see the module docstring)."""

    def __init__(self, state: SchedulerCore, directory: ObjectDirectory) -> None:
        self.s = state
        self.directory = directory

    def keep(self, call: Call, retries_left: int, owner: int,
             returns: Sequence[Data]) -> None:
        """How to make a task's results in shared memory again (its node may die); none
        when it has no retry left (a rebuild's last run) or for a small result."""
        lineage = Lineage(call, retries_left, owner) if retries_left != 0 else None
        for data in returns:
            self.directory.set_lineage(
                data.object_id, lineage if data.segment is not None else None)

    def node_lost(self, node_id: int, reason: str) -> None:
        """The objects only node ``node_id`` held are made again, or lost naming it."""
        rebuild = self.directory.node_lost(node_id, reason)
        if rebuild:
            self.wait_again()
        for lineage in rebuild.values():
            self.rebuild(lineage)

    def wait_again(self) -> None:
        """Objects are pending again (their node died; their tasks run again): a task
        not sent yet whose argument is one of them waits for it once more. Queued as
        ready (or ready once its other arguments came), it was dispatched with no data
        for that argument, and the head's loop died on it; an actor's queued call
        stops its actor's queue there (pump)."""
        s = self.s
        objects = s.objects
        for t in s.tasks.values():
            if t.state is not TaskState.READY and t.state is not TaskState.WAITING:
                continue
            if not wait_for_made_again(t, objects):
                continue
            if t.state is TaskState.READY:
                q = s.ready.get(t.qkey)
                if q is not None and t in q:
                    q.remove(t)
                t.move(TaskState.WAITING)

    def rebuild(self, first: Lineage) -> None:
        """Run a finished task again: a result of it was lost with its node. Its returns
        still alive elsewhere keep their data (the new copies are freed). An argument
        freed since comes back from its tomb, its own task run again first when it
        left no value: a worklist, as a chain of any length may need running again."""
        s = self.s
        todo = [first]
        while todo:
            lineage = todo.pop()
            if lineage.call.task_id in s.tasks:   # running again already
                continue
            t = Task(lineage.call, lineage.owner)
            t.retries_left = lineage.retries_left
            t.spend_retry()
            s.tasks[lineage.call.task_id] = t
            if s.hold_args(t, todo) and not t.deps:
                s.deps_met(t)
