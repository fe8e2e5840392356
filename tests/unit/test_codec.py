"""The hand encodings of orchestra/_protocol/codec.py are protobuf's own encodings.

Each test builds the same message with protobuf and compares what a receiver parses
(and, where protobuf's field order is the codec's, the bytes themselves). A renumbered
field in the .proto fails here before any frame goes wrong on the wire.
"""
from __future__ import annotations

import pickle

import pytest

from orchestra._proto import types_pb2
from orchestra._protocol import codec as _codec
from orchestra._protocol import pb
from orchestra._protocol import wire as _wire

pytestmark = pytest.mark.timeout(10)

TID = bytes(range(12))


def template(**fields: object) -> bytes:
    return pb.Call(function_id=b"f" * 16, num_returns=2, name="mod.fn", resources={"CPU": 1.0},
                   **fields).SerializeToString()


def canonical_call(*refs: bytes) -> bytes:
    """A Call serialized by protobuf itself (fields in number order): a frame carrying
    it must be byte for byte protobuf's frame."""
    return pb.Call(task_id=TID, function_id=b"f" * 16, args=[types_pb2.Value(ref=r) for r in refs],
                   num_returns=1, name="mod.fn").SerializeToString()


def parse_frame(frame: bytes) -> tuple[int, object]:
    [(kind, msg)] = _wire.FrameDecoder().feed(frame)
    return kind, msg


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16383, 16384, 2**32 + 5])
def test_varint_is_protobufs(n: int) -> None:
    # uint64 field 5 of InvokeCallRequest (owner) is tag 0x28 then the varint.
    assert pb.InvokeCallRequest(owner=n).SerializeToString() == (b"\x28" + _codec.varint(n) if n else b"")


def test_a_ref_value_and_an_inline_value_are_protobufs() -> None:
    assert _codec.ref_value(b"r" * 16) == types_pb2.Value(ref=b"r" * 16).SerializeToString()
    blob = pickle.dumps(list(range(100)))
    assert _codec.inline_value(blob) == types_pb2.Value(inline=blob).SerializeToString()


def test_a_call_without_arguments_parses_as_the_template_plus_its_task_id() -> None:
    parsed = pb.Call.FromString(_codec.call(template(), TID))
    expected = pb.Call.FromString(template())
    expected.task_id = TID
    assert parsed == expected


def test_a_call_with_arguments_keywords_and_nested_refs_is_protobufs() -> None:
    values = [_codec.ref_value(b"a" * 16), _codec.inline_value(b"\x80\x05K\x07."),
              _codec.inline_value(b"x" * 200)]   # a length needing a two-byte varint
    got = _codec.call(template(), TID, values, ["alpha"], [b"n" * 16, b"m" * 16])
    want = pb.Call.FromString(template())
    want.task_id = TID
    want.args.extend([types_pb2.Value(ref=b"a" * 16), types_pb2.Value(inline=b"\x80\x05K\x07."),
                      types_pb2.Value(inline=b"x" * 200)])
    want.kwarg_names.append("alpha")
    want.nested.extend([b"n" * 16, b"m" * 16])
    assert pb.Call.FromString(got) == want
    # Appended fields come after the template in field order: the bytes are protobuf's.
    assert got == template() + pb.Call(
        task_id=TID, args=want.args, kwarg_names=["alpha"], nested=want.nested).SerializeToString()


def test_a_default_placement_adds_no_byte_to_the_template() -> None:
    # scheduling_strategy=None/"DEFAULT" leaves Call.placement unset: a plain task's
    # bytes are those of a Call without the field.
    assert template() == pb.Call(function_id=b"f" * 16, num_returns=2, name="mod.fn",
                                 resources={"CPU": 1.0}).SerializeToString()
    assert not pb.Call.FromString(_codec.call(template(), TID)).HasField("placement")


@pytest.mark.parametrize("placement", [
    types_pb2.Placement(strategy="SPREAD"),
    types_pb2.Placement(strategy="NODE_AFFINITY", node_id=2**63 + 5, soft=True),
])
def test_a_placement_in_the_template_survives_the_per_call_fields(placement: object) -> None:
    values = [_codec.ref_value(b"a" * 16), _codec.inline_value(b"x" * 200)]
    got = pb.Call.FromString(_codec.call(template(placement=placement), TID, values, ["k"]))
    assert got.placement == placement and got.task_id == TID and len(got.args) == 2
    kind, msg = parse_frame(_codec.execute_frame(_codec.call(template(placement=placement), TID), [], 3))
    assert kind == _wire.EXECUTE and msg.invoke.call.placement == placement


def test_placement_is_call_field_15() -> None:
    # The number the cluster's parts agreed on; a renumbering breaks mixed versions.
    assert pb.Call.DESCRIPTOR.fields_by_name["placement"].number == 15
    assert _wire.WARNING == 33 and _wire.MESSAGES[_wire.WARNING] is pb.ClusterWarning


def test_frames_around_a_hand_encoded_call_parse_to_the_same_call() -> None:
    call = _codec.call(template(), TID, [_codec.ref_value(b"a" * 16)], ["k"])
    kind, msg = parse_frame(_codec.submit_frame(call))
    assert kind == _wire.SUBMIT and list(msg.calls) == [pb.Call.FromString(call)]
    kind, msg = parse_frame(_codec.execute_frame(call, [], 9))
    assert kind == _wire.EXECUTE and msg.invoke.call == pb.Call.FromString(call)
    assert (msg.invoke.attempt, msg.invoke.owner) == (1, 9)


def test_a_task_id_of_another_length_is_encoded_with_its_length() -> None:
    assert pb.Call.FromString(_codec.call(b"", b"t" * 200)).task_id == b"t" * 200


def test_a_submit_frame_is_the_frame_of_a_submit_message() -> None:
    call = canonical_call(b"a" * 16)
    frame = _codec.submit_frame(call)
    assert frame == _wire.encode(_wire.SUBMIT, pb.Submit(calls=[pb.Call.FromString(call)]))
    kind, msg = parse_frame(frame)
    assert kind == _wire.SUBMIT and msg.calls[0].task_id == TID


@pytest.mark.parametrize("owner", [1, 200, 70000])
def test_an_execute_frame_is_the_frame_of_an_execute_message(owner: int) -> None:
    call = canonical_call(b"a" * 16, b"b" * 16)
    resolved = [
        types_pb2.ObjectData(object_id=b"a" * 16, inline=b"\x80\x05K\x01."),
        types_pb2.ObjectData(object_id=b"b" * 16, segment=types_pb2.Segment(name="seg-1", size=1 << 20),
                             contained=[b"c" * 16]),
    ]
    frame = _codec.execute_frame(call, [d.SerializeToString() for d in resolved], owner)
    want = pb.Execute(invoke=pb.InvokeCallRequest(
        call=pb.Call.FromString(call), resolved=resolved, attempt=1, owner=owner))
    assert frame == _wire.encode(_wire.EXECUTE, want)
    kind, msg = parse_frame(frame)
    assert kind == _wire.EXECUTE and msg == want


def test_an_execute_frame_without_arguments_is_protobufs() -> None:
    call = canonical_call()
    want = pb.Execute(invoke=pb.InvokeCallRequest(call=pb.Call.FromString(call), attempt=1, owner=3))
    assert _codec.execute_frame(call, [], 3) == _wire.encode(_wire.EXECUTE, want)


def test_every_hand_encoded_field_is_marked_in_the_proto() -> None:
    """The .proto says which fields the codec writes by number: renumbering them breaks it."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2] / "protos" / "orchestra" / "_proto"
    text = (root / "types.proto").read_text() + (root / "orchestra.proto").read_text()
    marked = {line.split("=")[0].split()[-1] for line in text.splitlines()
              if "hand-encoded" in line and "=" in line}
    assert {"task_id", "args", "kwarg_names", "nested", "ref", "inline", "calls", "invoke",
            "call", "resolved", "attempt", "owner"} <= marked
