"""The scheduler's instructions: typed values in the scheduler's words, each naming its
node or connection; the head carries out every kind, and the head's edge
(_head/outbound.py) alone turns those to a process into frames."""
from __future__ import annotations

import inspect
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from _head_helpers import RecordingTransport, unstarted_head
from orchestra._head.head import Conn, Head
from orchestra._head.inbound import call_in, data_in, function_in
from orchestra._head.outbound import FRAME_OF
from orchestra._proto import types_pb2
from orchestra._protocol import pb
from orchestra._protocol import wire as _wire
from orchestra._scheduler import data as values
from orchestra._scheduler import instructions as _ins
from orchestra._scheduler.instructions import (
    LATE,
    FreeSegment,
    Instruction,
    KillWorker,
    Push,
    StartWorker,
    ToConn,
)

pytestmark = pytest.mark.timeout(10)

KINDS = typing.get_args(Instruction)
TO_CONN = typing.get_args(ToConn)
# The head's own records (Durable) concern no node; the rest name theirs.
NODE_KINDS = [k for k in KINDS if k not in TO_CONN and k.__name__ != "Durable"]

CALL = types_pb2.Call(task_id=b"t" * 12, function_id=b"f" * 16, name="f", resources={"CPU": 1.0})
ARG_MSG = pb.ObjectData(object_id=b"o" * 16, inline=b"x")
ARG = data_in(ARG_MSG)   # a value as received: written as it came
MADE = values.error_value(b"e" * 16, b"boom", [b"c" * 16])   # one the scheduler made
# One of each instruction to a process, and the (kind, message) its frame must decode to.
SAMPLES = [
    (_ins.Execute(3, call_in(CALL), [ARG, MADE], [1], 2), _wire.EXECUTE, pb.Execute(
        invoke=pb.InvokeCallRequest(call=CALL, resolved=[ARG_MSG, pb.ObjectData(
            object_id=b"e" * 16, error=b"boom", contained=[b"c" * 16])], gpu_ids=[1], attempt=2))),
    (_ins.Execute(3, call_in(CALL), [], [], 0, nested=True), _wire.EXECUTE_NESTED,
     pb.Execute(invoke=pb.InvokeCallRequest(call=CALL))),
    (_ins.Function(3, function_in(pb.RegisterFunctionRequest(function_id=b"f", pickled=b"p"))),
     _wire.FUNCTION,
     pb.RegisterFunctionRequest(function_id=b"f", pickled=b"p")),
    (_ins.CancelTask(3, b"t" * 12, True), _wire.CANCEL_TASK,
     pb.CancelTask(task_id=b"t" * 12, recursive=True)),
    (_ins.ReturnTasks(3, [b"a", b"b"]), _wire.STEAL, pb.ReturnTasks(task_ids=[b"a", b"b"])),
    (_ins.Shutdown(3), _wire.SHUTDOWN, pb.AckReply()),
    (_ins.Warn(3, "no node can hold it"), _wire.WARNING, pb.ClusterWarning(text="no node can hold it")),
    (_ins.Stalled(3, "stuck", [b"a"]), _wire.STALLED, pb.Stalled(text="stuck", task_ids=[b"a"])),
    (_ins.GeneratorAck(3, b"t", 5), _wire.GENERATOR_ACK, pb.GeneratorAck(task_id=b"t", consumed=5)),
    (_ins.Loan(3, 7, "/w7.sock", {"CPU": 1.0}, 70, b"t", 2), _wire.LOAN, pb.Loan(
        worker_id=7, path="/w7.sock", resources={"CPU": 1.0}, pid=70, busy_task=b"t", pinned_node=2)),
    (_ins.LoanRecall(3, 7), _wire.LOAN_RECALL, pb.LoanRecall(worker_id=7)),
    (_ins.ActorAddress(3, b"a" * 16, 7, "/w7.sock", 4), _wire.ACTOR_ADDRESS,
     pb.ActorAddress(actor_id=b"a" * 16, worker_id=7, path="/w7.sock", dispatched=4)),
]


def test_every_instruction_class_of_the_module_is_an_instruction():
    classes = {obj for obj in vars(_ins).values()
               if inspect.isclass(obj) and obj.__module__ == _ins.__name__}
    assert classes == set(KINDS)


@pytest.mark.parametrize("kind", NODE_KINDS, ids=lambda k: k.__name__)
def test_an_instruction_that_concerns_a_node_names_it_first(kind):
    assert kind._fields[0] == "node_id"


@pytest.mark.parametrize("kind", TO_CONN, ids=lambda k: k.__name__)
def test_an_instruction_to_a_process_names_its_connection_first(kind):
    assert kind._fields[0] == "conn"


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in TO_CONN or k is Push],
                         ids=lambda k: k.__name__)
def test_the_head_carries_out_every_kind_of_instruction(kind):
    assert f"type(ins) is {kind.__name__}" in inspect.getsource(Head.carry_out)


def test_every_instruction_to_a_process_but_a_push_has_its_frame_and_a_sample_here():
    assert set(FRAME_OF) == set(TO_CONN) - {Push}
    assert {type(i) for i, _, _ in SAMPLES} == set(FRAME_OF)


@pytest.mark.parametrize("ins,kind,msg", SAMPLES, ids=lambda v: type(v).__name__)
def test_an_instruction_becomes_the_frame_a_process_reads(ins, kind, msg):
    assert _wire.FrameDecoder().feed(FRAME_OF[type(ins)](ins)) == [(kind, msg)]


def test_instructions_are_immutable_and_compare_by_value():
    ins = KillWorker(0, 3, "cancelled with force=True")
    assert ins == KillWorker(node_id=0, worker_id=3, reason="cancelled with force=True")
    with pytest.raises(AttributeError):
        ins.worker_id = 4  # type: ignore[misc]


def test_fields_are_named_for_what_they_hold():
    assert StartWorker(0, 7).worker_id == 7
    assert FreeSegment(1, "/orchestra-seg").key == "/orchestra-seg"


# ------------------------------------------------------------------ the head writes them

@pytest.fixture
def head(tmp_path: Path) -> Iterator[Head]:
    h = unstarted_head(tmp_path)
    yield h
    h.local.close()


def _connect(head: Head, conn_id: int) -> RecordingTransport:
    conn = Conn(head, conn_id, head.local)
    conn.transport = RecordingTransport()  # type: ignore[assignment]
    head.conns[conn_id] = conn
    return conn.transport  # type: ignore[return-value]


def test_a_grant_is_written_after_every_other_frame_of_its_batch(head: Head) -> None:
    """A Loan or ActorAddress queued before an Execute of the same batch still reaches
    its connection after it, in a write of its own."""
    driver = _connect(head, 5)
    late = [i for i, _, _ in SAMPLES if type(i) in LATE]
    first = [i for i, _, _ in SAMPLES if type(i) not in LATE]
    head.state.out = [i._replace(conn=5) for i in late + first]
    head.carry_out()
    frames = [_wire.FrameDecoder().feed(w) for w in driver.writes]
    assert [k for k, _ in frames[0]] == [k for i, k, _ in SAMPLES if type(i) not in LATE]
    assert [f for [(f, _)] in frames[1:]] == [k for i, k, _ in SAMPLES if type(i) in LATE]


def test_an_instruction_to_a_connection_gone_is_dropped(head: Head) -> None:
    other = _connect(head, 6)
    head.state.out = [i for i, _, _ in SAMPLES]   # all to connection 3, not connected
    head.carry_out()
    assert other.writes == []
