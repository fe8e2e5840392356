"""Frames read from a process, as the scheduler's events. No I/O.

    a frame (TaskDone, Hello, GeneratorItem, AdoptCalls; a node's NodeMemoryPressure)
        --> one function here --> _scheduler/events.py's value --> the scheduler

The other half of the head's edge with outbound.py (instructions -> frames); the
handler tables of frames.py call these. The data inside (results as ObjectData, calls)
passes as it came.
"""
from __future__ import annotations

from .._protocol import pb
from .._scheduler import events as ev
from .._scheduler.groups import GroupSpec


def group_spec(m: pb.PlacementGroupSpec) -> GroupSpec:
    return GroupSpec(m.group_id, tuple(dict(b.resources) for b in m.bundles), m.strategy,
                     m.name, m.detached)


def hello(m: pb.Hello) -> ev.Hello:
    return ev.Hello(m.kind, m.pid, m.workerid, m.namespace, m.driver_key, m.resume_actor,
                    m.resume_task)


def task_done(m: pb.TaskDone) -> ev.TaskDone:
    return ev.TaskDone(m.task_id, m.returns, m.user_error, m.cancelled, m.not_retryable,
                       m.owner, m.lineage if m.HasField("lineage") else None)


def generator_item(m: pb.GeneratorItem) -> ev.GeneratorItem:
    return ev.GeneratorItem(m.task_id, m.index, m.data, m.owner)


def adopt_calls(m: pb.AdoptCalls) -> ev.AdoptCalls:
    return ev.AdoptCalls(m.worker_id, m.calls, m.actor_id, m.cancelled, m.answered)


def memory_pressure(m: pb.NodeMemoryPressure) -> ev.MemoryPressure:
    return ev.MemoryPressure(m.used, m.limit, m.threshold, m.where, dict(m.workers))
