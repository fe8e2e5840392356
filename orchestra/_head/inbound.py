"""Frames read from a process, as the scheduler's events. No I/O.

    a frame (TaskDone, Hello, GeneratorItem, AdoptCalls; a node's NodeMemoryPressure)
        --> one function here --> _scheduler/events.py's value --> the scheduler

The other half of the head's edge with outbound.py (instructions -> frames); the
handler tables of frames.py call these. An object's ObjectData becomes the scheduler's
Data (data_in: what the scheduler reads of it, the message kept for forwarding;
_scheduler/data.py), a Call its Call (call_in, the same way: _scheduler/call.py), a
function's registration a FunctionDef.
"""
from __future__ import annotations

from typing import Any

from .._protocol import pb
from .._scheduler import events as ev
from .._scheduler.call import ActorSpec, Call, FunctionDef, PlacementSpec
from .._scheduler.data import ERROR, INLINE, SEGMENT, Data, Segment
from .._scheduler.groups import GroupSpec

_new = tuple.__new__   # a NamedTuple made from a tuple: no Python __new__ (~0.3 us less)


def segment_in(s: pb.Segment) -> Segment:
    return _new(Segment, (s.name, s.size, s.node_id, s.capacity, s.path, s.allocated, s.reused))


def data_in(m: pb.ObjectData) -> Data:
    """The scheduler's view of an object's value; the message rides along (``wire``)."""
    kind = m.WhichOneof("data")
    contained = tuple(m.contained) if m.contained else ()
    if kind == "segment":
        s = m.segment   # (segment_in, inline: one call less per value)
        return _new(Data, (m.object_id, SEGMENT, _new(Segment, (
            s.name, s.size, s.node_id, s.capacity, s.path, s.allocated, s.reused)),
            contained, b"", m))
    if kind == "error":
        return _new(Data, (m.object_id, ERROR, None, contained, m.error, m))
    return _new(Data, (m.object_id, INLINE, None, contained, b"", m))


def spec_in(m: pb.ActorSpec) -> ActorSpec:
    return ActorSpec(m.actor_id, m.name, m.namespace, m.class_name, m.detached,
                     m.get_if_exists, m.max_restarts, m.restart_count, m)


# A function's id and name, one object each for all its calls (a queued call holds
# them: ~130 bytes less per task); forgotten all at once past _SAME_MAX. The head's
# loop reads calls (a reader on another thread would only share less: dict operations
# are atomic, and any value found is an equal one).
_same: dict[Any, Any] = {}
_SAME_MAX = 4096


def _one(value: Any) -> Any:
    got = _same.get(value)
    if got is None:
        if len(_same) >= _SAME_MAX:
            _same.clear()
        got = _same[value] = value
    return got


def call_in(m: pb.Call) -> Call:
    """The scheduler's view of a call; the message rides along (``wire``). ~3 us."""
    if m.HasField("placement"):
        p = m.placement
        placement: PlacementSpec | None = _new(PlacementSpec, (
            p.strategy, p.node_id, p.soft, p.group_id, p.bundle_index, p.capture_child_tasks))
    else:
        placement = None
    return Call(m.task_id, _one(m.function_id), _one(m.name),
                tuple([r for v in m.args if (r := v.ref)]) if m.args else (),
                tuple(m.nested) if m.nested else (), m.num_returns, dict(m.resources),
                m.max_retries, m.retry_exceptions, m.generator, m.max_calls, m.job, m.actor_id,
                spec_in(m.actor) if m.HasField("actor") else None, placement, m)


def function_in(m: pb.RegisterFunctionRequest) -> FunctionDef:
    return FunctionDef(m.function_id, m)


def group_spec(m: pb.PlacementGroupSpec) -> GroupSpec:
    return GroupSpec(m.group_id, tuple(dict(b.resources) for b in m.bundles), m.strategy,
                     m.name, m.detached)


def hello(m: pb.Hello) -> ev.Hello:
    return ev.Hello(m.kind, m.pid, m.workerid, m.namespace, m.driver_key, m.resume_actor,
                    m.resume_task)


def task_done(m: pb.TaskDone) -> ev.TaskDone:
    return ev.TaskDone(m.task_id, [data_in(d) for d in m.returns], m.user_error, m.cancelled,
                       m.not_retryable, m.owner,
                       call_in(m.lineage) if m.HasField("lineage") else None)


def generator_item(m: pb.GeneratorItem) -> ev.GeneratorItem:
    return ev.GeneratorItem(m.task_id, m.index, data_in(m.data), m.owner)


def adopt_calls(m: pb.AdoptCalls) -> ev.AdoptCalls:
    return ev.AdoptCalls(m.worker_id, [call_in(c) for c in m.calls], m.actor_id, m.cancelled,
                         m.answered)


def memory_pressure(m: pb.NodeMemoryPressure) -> ev.MemoryPressure:
    return ev.MemoryPressure(m.used, m.limit, m.threshold, m.where, dict(m.workers))
