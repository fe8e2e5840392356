"""Streaming generators, for the scheduler core: the items a generator task yields,
each an object of the task's owner pushed as it comes, and the consumer's acks that
pace the producer. No I/O.

    GeneratorItem (on the worker's connection, before its TaskDone) --> generator_item:
        item n of the task's current attempt, new --> an object held for the owner,
        sealed and pushed | an item a retry yields again, or nobody waits for --> its
        segment freed (and a retry told the acks its first attempt had)
    GeneratorAck (the consumer read n items) --> generator_ack --> the producing worker
"""
from __future__ import annotations

from .. import _ids
from .events import GeneratorItem
from .instructions import GeneratorAck
from .model import SchedulerCore, TaskState
from .objects import ObjectDirectory


class Streams:
    """Generator items and acks (see the module docstring)."""

    def __init__(self, core: SchedulerCore, objects: ObjectDirectory) -> None:
        self.core = core
        self.objects = objects

    def generator_item(self, conn: int, msg: GeneratorItem) -> None:
        """An item a streaming generator yielded (GeneratorItem): an object of the
        task's owner, pushed to it now. Items come before their task's TaskDone, on the
        worker's connection, so the owner has them all when it learns the end."""
        data = msg.data
        if data.object_id != _ids.object_id(msg.task_id, msg.number) or not msg.number:
            return   # not an item's id: never made by a worker of ours
        if msg.owner:   # a call its caller sent straight to the actor
            self.objects.put_for(msg.owner, data)
            return
        t = self.core.tasks.get(msg.task_id)
        if t is None or t.state is not TaskState.DISPATCHED or msg.number <= t.streamed \
                or t.owner not in self.core.clients or data.object_id in self.core.objects:
            # Taken already (a retry yields its items again), or nobody waits for it.
            if data.segment is not None:
                self.objects.free_segment(data.segment)
            if t is not None and t.acked and msg.number <= t.streamed:
                # A retry pauses for acks the consumer sent its first attempt.
                self.core.out.append(GeneratorAck(conn, msg.task_id, t.acked))
            return
        t.streamed = msg.number
        self.objects.new_object(t.owner, data.object_id)
        self.objects.seal(data.object_id, data)

    def generator_ack(self, task_id: bytes, consumed: int) -> None:
        """The consumer of generator task ``task_id`` read ``consumed`` items: tell the
        worker producing them."""
        t = self.core.tasks.get(task_id)
        if t is None:
            return
        t.acked = max(t.acked, consumed)
        if t.worker is not None and t.state is TaskState.DISPATCHED:
            self.core.out.append(GeneratorAck(t.worker.conn, task_id, consumed))
