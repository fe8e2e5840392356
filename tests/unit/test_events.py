"""The scheduler's events: the head's edge (_head/inbound.py) reads each from its frame's
message, every field the scheduler uses carried over."""
from __future__ import annotations

import inspect
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestra._head import inbound, outbound
from orchestra._head.outbound import call_out, data_out
from orchestra._proto import types_pb2
from orchestra._protocol import pb
from orchestra._scheduler import data as values
from orchestra._scheduler import events as ev
from orchestra._scheduler.call import Call, PlacementSpec
from orchestra._scheduler.data import ERROR, INLINE, SEGMENT, Data, Segment
from orchestra._scheduler.groups import GroupInfo, GroupSpec

pytestmark = pytest.mark.timeout(10)

CALL = types_pb2.Call(task_id=b"t" * 12, function_id=b"f" * 16, name="f", max_retries=2)
DATA = pb.ObjectData(object_id=b"o" * 16, inline=b"x")
# Fields named otherwise in the protocol: event field -> message field.
RENAMED = {("Hello", "worker_id"): "workerid", ("GeneratorItem", "number"): "index"}
# Each event, from a message with every field it reads set (not to its default).
MESSAGES = {
    ev.Hello: (inbound.hello, pb.Hello(kind="worker", pid=7, workerid=3, namespace="ns",
                                       driver_key=b"k", resume_actor=b"a", resume_task=b"t")),
    ev.TaskDone: (inbound.task_done, pb.TaskDone(task_id=b"t", returns=[DATA], user_error=True,
                                                 cancelled=True, not_retryable=True, owner=5,
                                                 lineage=CALL)),
    ev.GeneratorItem: (inbound.generator_item, pb.GeneratorItem(task_id=b"t", index=2, data=DATA,
                                                                owner=5)),
    ev.AdoptCalls: (inbound.adopt_calls, pb.AdoptCalls(worker_id=4, calls=[CALL], actor_id=b"a",
                                                       cancelled=[b"c"], answered=[b"d"])),
    ev.MemoryPressure: (inbound.memory_pressure, pb.NodeMemoryPressure(
        used=95, limit=100, threshold=0.9, where="the machine", workers={3: 40})),
}


def test_every_event_of_the_module_is_read_here():
    classes = {obj for obj in vars(ev).values()
               if inspect.isclass(obj) and obj.__module__ == ev.__name__}
    assert classes == set(typing.get_args(ev.Event)) == set(MESSAGES)


@pytest.mark.parametrize("kind", list(MESSAGES), ids=lambda k: k.__name__)
def test_an_event_carries_every_field_of_its_message(kind):
    read, msg = MESSAGES[kind]
    event = read(msg)
    assert type(event) is kind
    for field in kind._fields:
        value = getattr(msg, RENAMED.get((kind.__name__, field), field))
        got = getattr(event, field)
        if isinstance(got, Data):   # written back as the message it came in
            assert data_out(got) == value, field
        elif isinstance(got, typing.Mapping):
            assert dict(got) == dict(value) and got, field
        elif isinstance(got, Call):   # written back as the message it came in
            assert call_out(got) is value, field
        elif isinstance(got, list) and got and isinstance(got[0], Data):
            assert [data_out(d) for d in got] == list(value), field
        elif isinstance(got, list) and got and isinstance(got[0], Call):
            assert [call_out(c) for c in got] == list(value), field
        elif not isinstance(got, (bool, int, float, str, bytes)):
            # a repeated field
            assert list(got) == list(value) and got, field
        else:
            assert got == value and got, field   # each set in the message above


def test_a_call_carries_each_field_the_scheduler_reads_and_is_sent_as_it_came():
    actor = pb.ActorSpec(actor_id=b"a" * 16, name="n", namespace="ns", class_name="C",
                         detached=True, get_if_exists=True, max_restarts=3, restart_count=2,
                         max_concurrency=4, methods=["m"])
    msg = pb.Call(task_id=b"t" * 12, function_id=b"f" * 16, name="C.__init__",
                  args=[pb.Value(ref=b"r1"), pb.Value(inline=b"x"), pb.Value(ref=b"r2"),
                        pb.Value(ref=b"r1")], kwarg_names=["k"], nested=[b"n1", b"n2"],
                  num_returns=3, resources={"CPU": 2.0, "x": 0.5}, max_retries=-1,
                  retry_exceptions=True, generator=2, max_calls=9, job=7, actor=actor,
                  placement=pb.Placement(strategy="NODE_AFFINITY", node_id=5, soft=True))
    c = inbound.call_in(msg)
    assert (c.task_id, c.function_id, c.name, c.refs, c.nested, c.num_returns, c.resources,
            c.max_retries, c.retry_exceptions, c.generator, c.max_calls, c.job, c.actor_id) == (
        b"t" * 12, b"f" * 16, "C.__init__", (b"r1", b"r2", b"r1"), (b"n1", b"n2"), 3,
        {"CPU": 2.0, "x": 0.5}, -1, True, 2, 9, 7, b"")
    assert c.placement == PlacementSpec("NODE_AFFINITY", 5, True)
    a = c.actor
    assert a is not None and (a.actor_id, a.name, a.namespace, a.class_name, a.detached,
                              a.get_if_exists, a.max_restarts, a.restart_count) == (
        b"a" * 16, "n", "ns", "C", True, True, 3, 2)
    before = msg.SerializeToString()
    assert call_out(c) is msg and msg.SerializeToString() == before   # nothing made again
    plain = inbound.call_in(pb.Call(task_id=b"u" * 12, name="f", actor_id=b"b" * 16))
    assert (plain.actor, plain.placement, plain.refs, plain.actor_id) == (None, None, (), b"b" * 16)
    assert plain.group_id == b"" and not call_out(plain).HasField("placement")


def test_what_the_scheduler_changes_in_a_call_is_written_into_its_message():
    msg = pb.Call(task_id=b"t" * 12, name="C.__init__", job=7,
                  actor=pb.ActorSpec(actor_id=b"a" * 16, get_if_exists=True, methods=["m"]))
    c = inbound.call_in(msg)
    assert c.actor is not None
    c.actor.namespace, c.actor.restart_count, c.actor.get_if_exists = "mine", 4, False
    c.job = 0
    c.edited = True   # (as a restarted head's restore does: _scheduler/durable.py)
    out = pb.Call.FromString(call_out(c).SerializeToString())
    assert (out.actor.namespace, out.actor.restart_count, out.actor.get_if_exists, out.job) == (
        "mine", 4, False, 0)
    assert list(out.actor.methods) == ["m"] and out.task_id == b"t" * 12   # the rest as it came
    assert outbound.spec_out(c.actor) is msg.actor
    child = inbound.call_in(pb.Call(task_id=b"u" * 12, name="f", args=[pb.Value(inline=b"x")]))
    child.place(PlacementSpec("PLACEMENT_GROUP", group_id=b"g" * 16, bundle_index=-1,
                              capture_child_tasks=True))
    out = pb.Call.FromString(call_out(child).SerializeToString())
    assert (out.placement.strategy, out.placement.group_id, out.placement.bundle_index,
            out.placement.capture_child_tasks) == ("PLACEMENT_GROUP", b"g" * 16, -1, True)
    assert child.group_id == b"g" * 16 and out.args[0].inline == b"x"


def test_the_calls_of_a_function_share_its_id_and_name():
    first, second = (inbound.call_in(pb.Call(task_id=bytes([i]) * 12, function_id=b"f" * 16,
                                             name="mod.fn")) for i in (1, 2))
    assert first.function_id is second.function_id and first.name is second.name
    assert first.task_id != second.task_id


def test_a_task_done_without_a_lineage_carries_none():
    assert inbound.task_done(pb.TaskDone(task_id=b"t")) == ev.TaskDone(b"t", [])
    assert inbound.task_done(pb.TaskDone(task_id=b"t")).lineage is None


ids = st.binary(min_size=16, max_size=16)
segments = st.builds(Segment, name=st.text(min_size=1, max_size=12), size=st.integers(0, 2**40),
                     node_id=st.integers(0, 2**20), capacity=st.integers(0, 2**40),
                     path=st.text(max_size=12), allocated=st.integers(0, 2**40),
                     reused=st.booleans())
contents = st.lists(ids, max_size=3).map(tuple)
made = st.one_of(   # values the scheduler makes itself: no message kept
    st.builds(values.inline, ids, st.binary(max_size=64), contents),
    st.builds(values.error_value, ids, st.binary(min_size=1, max_size=64), contents),
    st.builds(values.at, ids, segments, contents))


@given(made)
def test_a_value_the_scheduler_made_is_written_with_each_field_and_reads_back_the_same(d):
    msg = data_out(d)
    assert type(msg) is pb.ObjectData and msg.WhichOneof("data") == d.kind
    back = inbound.data_in(pb.ObjectData.FromString(msg.SerializeToString()))
    assert back._replace(wire=None, payload=b"" if d.kind == INLINE else back.payload) == \
        d._replace(payload=b"" if d.kind == INLINE else d.payload)
    if d.kind == INLINE:   # a received value's bytes stay in its message
        assert back.payload == b"" and back.wire.inline == d.payload


@pytest.mark.parametrize("msg", [
    pb.ObjectData(object_id=b"o" * 16, inline=b"x", contained=[b"c" * 16]),
    pb.ObjectData(object_id=b"o" * 16, error=b"boom"),
    pb.ObjectData(object_id=b"o" * 16, segment=pb.Segment(name="s", size=5, node_id=2, capacity=8,
                                                          allocated=8, reused=True))],
    ids=["inline", "error", "segment"])
def test_a_received_value_is_read_and_written_back_as_the_same_message(msg):
    d = inbound.data_in(msg)
    assert data_out(d) is msg   # forwarded unchanged: nothing made again
    assert d.object_id == msg.object_id and list(d.contained) == list(msg.contained)
    assert d.kind == msg.WhichOneof("data") and (d.segment is None) is (d.kind != SEGMENT)
    assert d.payload == (msg.error if d.kind == ERROR else b"")
    if d.segment is not None:
        assert d.segment == Segment("s", 5, 2, 8, "", 8, True)


group_specs = st.builds(
    GroupSpec, ids, st.lists(st.dictionaries(st.sampled_from(["CPU", "GPU", "memory", "x"]),
                                             st.floats(0.001, 64), min_size=1), min_size=1,
                             max_size=4).map(tuple),
    st.sampled_from(["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]), st.text(max_size=8),
    st.booleans())


@given(group_specs, st.sampled_from(["PENDING", "CREATED", "REMOVED"]), st.data())
def test_a_placement_group_is_written_and_read_back_the_same(spec, state, data):
    msg = pb.PlacementGroupSpec.FromString(outbound.group_spec(spec).SerializeToString())
    assert inbound.group_spec(msg) == spec
    nodes = data.draw(st.lists(st.integers(0, 1000), min_size=len(spec.bundles),
                               max_size=len(spec.bundles)))
    info = outbound.group_info(GroupInfo(spec, state, nodes))
    assert (inbound.group_spec(info.spec), info.state, list(info.bundle_nodes)) == (spec, state, nodes)
