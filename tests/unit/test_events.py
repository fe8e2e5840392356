"""The scheduler's events: the head's edge (_head/inbound.py) reads each from its frame's
message, every field the scheduler uses carried over."""
from __future__ import annotations

import inspect
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestra._head import inbound, outbound
from orchestra._proto import types_pb2
from orchestra._protocol import pb
from orchestra._scheduler import events as ev
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
        if isinstance(got, typing.Mapping):
            assert dict(got) == dict(value) and got, field
        elif not isinstance(got, (bool, int, float, str, bytes, pb.Call, pb.ObjectData)):
            # a repeated field
            assert list(got) == list(value) and got, field
        else:
            assert got == value and got, field   # each set in the message above


def test_a_task_done_without_a_lineage_carries_none():
    assert inbound.task_done(pb.TaskDone(task_id=b"t")) == ev.TaskDone(b"t", [])
    assert inbound.task_done(pb.TaskDone(task_id=b"t")).lineage is None


ids = st.binary(min_size=16, max_size=16)
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
