"""The scheduler's instructions to a process, as the frames that carry them. No I/O.

    SchedulerState.out: Execute(conn, call, ...), Loan(...), ...
        --> Head.carry_out: FRAME_OF[type(ins)](ins) -> the frame's bytes, queued on
            connection ``ins.conn`` (those of LATE written after the batch's others)

The one place where what the scheduler decided becomes a message of the wire protocol
(_protocol/wire.py's kinds, the messages of orchestra.proto); frames coming in become
the scheduler's calls in frames.py. Pushes of objects are coalesced per connection
into one Objects frame by the head itself (Head.carry_out).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._protocol import pb
from .._protocol import wire as _wire
from .._scheduler import instructions as ins
from .._scheduler.call import ActorSpec, Call
from .._scheduler.data import ERROR, SEGMENT, Data, Segment
from .._scheduler.groups import GroupInfo, GroupSpec

_encode = _wire.encode


def segment_out(s: Segment) -> pb.Segment:
    return pb.Segment(name=s.name, size=s.size, node_id=s.node_id, capacity=s.capacity,
                      path=s.path, allocated=s.allocated, reused=s.reused)


def data_out(d: Data) -> pb.ObjectData:
    """The ObjectData of a value: the message it came in, unchanged, or (a value the
    scheduler made) one made from its fields."""
    if d.wire is not None:
        return d.wire
    if d.kind == SEGMENT:
        assert d.segment is not None
        return pb.ObjectData(object_id=d.object_id, segment=segment_out(d.segment),
                             contained=d.contained)
    if d.kind == ERROR:
        return pb.ObjectData(object_id=d.object_id, error=d.payload, contained=d.contained)
    return pb.ObjectData(object_id=d.object_id, inline=d.payload, contained=d.contained)


def spec_out(s: ActorSpec | None) -> pb.ActorSpec:
    """An actor's spec as the message it came in, with what the head set written into
    it (its namespace, its restarts; _scheduler/call.py)."""
    if s is None:
        return pb.ActorSpec()
    m = s.wire
    if m.namespace != s.namespace:
        m.namespace = s.namespace
    if m.restart_count != s.restart_count:
        m.restart_count = s.restart_count
    if m.get_if_exists != s.get_if_exists:
        m.get_if_exists = s.get_if_exists
    return m


def call_out(c: Call) -> pb.Call:
    """A call as the message it came in, with what the scheduler changed written into
    it (_scheduler/call.py: an actor's spec, a restore's job, a captured placement)."""
    m = c.wire
    if c.actor is not None:
        spec_out(c.actor)
    if c.edited:
        if m.job != c.job:
            m.job = c.job
        p = c.placement
        if p is not None:
            m.placement.CopyFrom(pb.Placement(
                strategy=p.strategy, node_id=p.node_id, soft=p.soft, group_id=p.group_id,
                bundle_index=p.bundle_index, capture_child_tasks=p.capture_child_tasks))
    return m


def group_spec(s: GroupSpec) -> pb.PlacementGroupSpec:
    return pb.PlacementGroupSpec(group_id=s.group_id, strategy=s.strategy, name=s.name,
                                 detached=s.detached,
                                 bundles=[pb.PlacementBundle(resources=b) for b in s.bundles])


def group_info(i: GroupInfo) -> pb.PlacementGroupInfo:
    return pb.PlacementGroupInfo(spec=group_spec(i.spec), state=i.state,
                                 bundle_nodes=i.bundle_nodes)


def _execute(i: ins.Execute) -> bytes:
    return _encode(_wire.EXECUTE_NESTED if i.nested else _wire.EXECUTE, pb.Execute(
        invoke=pb.InvokeCallRequest(call=call_out(i.call), resolved=[data_out(d) for d in i.resolved],
                                    gpu_ids=i.gpu_ids, attempt=i.attempt)))


def _function(i: ins.Function) -> bytes:
    return _encode(_wire.FUNCTION, i.fn.wire)


def _cancel(i: ins.CancelTask) -> bytes:
    return _encode(_wire.CANCEL_TASK, pb.CancelTask(task_id=i.task_id, recursive=i.recursive))


def _return_tasks(i: ins.ReturnTasks) -> bytes:
    return _encode(_wire.STEAL, pb.ReturnTasks(task_ids=i.task_ids))


def _shutdown(i: ins.Shutdown) -> bytes:
    return _encode(_wire.SHUTDOWN, pb.AckReply())


def _warn(i: ins.Warn) -> bytes:
    return _encode(_wire.WARNING, pb.ClusterWarning(text=i.text))


def _stalled(i: ins.Stalled) -> bytes:
    return _encode(_wire.STALLED, pb.Stalled(text=i.text, task_ids=i.task_ids))


def _generator_ack(i: ins.GeneratorAck) -> bytes:
    return _encode(_wire.GENERATOR_ACK, pb.GeneratorAck(task_id=i.task_id, consumed=i.consumed))


def _loan(i: ins.Loan) -> bytes:
    return _encode(_wire.LOAN, pb.Loan(worker_id=i.worker_id, path=i.path, resources=i.resources,
                                       pid=i.pid, busy_task=i.busy_task, pinned_node=i.pinned_node))


def _loan_recall(i: ins.LoanRecall) -> bytes:
    return _encode(_wire.LOAN_RECALL, pb.LoanRecall(worker_id=i.worker_id))


def _actor_address(i: ins.ActorAddress) -> bytes:
    return _encode(_wire.ACTOR_ADDRESS, pb.ActorAddress(
        actor_id=i.actor_id, worker_id=i.worker_id, path=i.path, dispatched=i.dispatched))


# Each instruction to a process (but Push) -> its frame's bytes.
FRAME_OF: dict[type, Callable[[Any], bytes]] = {
    ins.Execute: _execute,
    ins.Function: _function,
    ins.CancelTask: _cancel,
    ins.ReturnTasks: _return_tasks,
    ins.Shutdown: _shutdown,
    ins.Warn: _warn,
    ins.Stalled: _stalled,
    ins.GeneratorAck: _generator_ack,
    ins.Loan: _loan,
    ins.LoanRecall: _loan_recall,
    ins.ActorAddress: _actor_address,
}
# Written after every other frame of the batch (instructions.py says why).
LATE = frozenset(ins.LATE)
