"""Streaming generators in the scheduler core (SchedulerState.generator_item and
generator_ack), and the choice of a call's generator mode (_generators.generator_mode),
driven directly: no processes, no sockets."""
from __future__ import annotations

import pickle
from typing import Any

import pytest

from _sched_helpers import (
    DRIVER,
    Cluster,
    executed,
    freed_segments,
    inline_data,
    make_call,
    pushes,
    rid,
    segment_data,
    sent,
    worker_conn,
)
from orchestra._runtime.generators import (
    DYNAMIC,
    NONE,
    STREAMING,
    check_backpressure,
    generator_mode,
    is_generator_function,
)
from orchestra._scheduler.events import GeneratorItem
from orchestra._scheduler.instructions import GeneratorAck

pytestmark = pytest.mark.timeout(10)


def stream_call(**kw: Any) -> Any:
    call = make_call("gen", **kw)
    call.generator = STREAMING
    return call


def item(call: Any, i: int, value: Any = None, owner: int = 0) -> Any:
    return GeneratorItem(task_id=call.task_id, number=i, owner=owner,
                            data=inline_data(rid(call, i), value if value is not None else i))


def running_stream(c: Cluster, **kw: Any) -> tuple[Any, int]:
    call = c.submit(stream_call(**kw))
    [(wid, _)] = executed(c.take())
    return call, wid


# ------------------------------------------------------------------ items

def test_each_item_is_pushed_to_the_owner_as_it_comes():
    c = Cluster(cpus=1)
    call, wid = running_stream(c)
    c.s.streams.generator_item(worker_conn(wid), item(call, 1, "a"))
    out = c.take()
    assert pickle.loads(pushes(out)[rid(call, 1)].payload) == "a"
    c.s.streams.generator_item(worker_conn(wid), item(call, 2, "b"))
    assert list(pushes(c.take())) == [rid(call, 2)]


def test_an_item_is_held_for_the_owner_until_it_lets_go():
    c = Cluster(cpus=1)
    call, wid = running_stream(c)
    c.s.streams.generator_item(worker_conn(wid), item(call, 1))
    assert c.s.objects[rid(call, 1)].count == 1
    assert c.s.clients[DRIVER].holds[rid(call, 1)] == 1
    c.s.directory.ref_delta(DRIVER, [], [rid(call, 1)])
    assert rid(call, 1) not in c.s.objects


def test_the_end_comes_after_the_items_and_holds_their_number():
    c = Cluster(cpus=1)
    call, wid = running_stream(c)
    for i in (1, 2):
        c.s.streams.generator_item(worker_conn(wid), item(call, i))
    c.take()
    c.done(wid, call, 2)
    assert pickle.loads(pushes(c.take())[rid(call, 0)].payload) == 2


def test_a_retry_yields_its_items_again_and_only_new_ones_are_taken():
    c = Cluster(cpus=2)
    call, wid = running_stream(c, max_retries=1)
    c.s.streams.generator_item(worker_conn(wid), item(call, 1))
    c.s.streams.generator_item(worker_conn(wid), item(call, 2))
    c.s.directory.ref_delta(DRIVER, [], [rid(call, 1)])   # read and dropped already
    c.take()
    c.s.worker_died(wid, "killed")
    [(wid2, _)] = executed(c.take())
    c.s.streams.generator_item(worker_conn(wid2), item(call, 1))
    c.s.streams.generator_item(worker_conn(wid2), item(call, 2))
    assert pushes(c.take()) == {}
    assert rid(call, 1) not in c.s.objects   # not made again
    c.s.streams.generator_item(worker_conn(wid2), item(call, 3))
    assert list(pushes(c.take())) == [rid(call, 3)]


def test_a_repeated_item_in_shared_memory_is_freed():
    c = Cluster(cpus=1)
    call, wid = running_stream(c)
    first = GeneratorItem(task_id=call.task_id, number=1, data=segment_data(rid(call, 1), "seg-a"))
    again = GeneratorItem(task_id=call.task_id, number=1, data=segment_data(rid(call, 1), "seg-b"))
    c.s.streams.generator_item(worker_conn(wid), first)
    c.s.streams.generator_item(worker_conn(wid), again)
    assert freed_segments(c.take()) == ["seg-b"]


def test_an_item_whose_id_is_not_its_tasks_is_dropped():
    c = Cluster(cpus=1)
    call, wid = running_stream(c)
    other = make_call("other")
    c.s.streams.generator_item(worker_conn(wid), GeneratorItem(
        task_id=call.task_id, number=1, data=inline_data(rid(other, 1))))
    c.s.streams.generator_item(worker_conn(wid), GeneratorItem(
        task_id=call.task_id, number=0, data=inline_data(rid(call, 0))))
    assert pushes(c.take()) == {}
    assert rid(other, 1) not in c.s.objects and rid(call, 0) in c.s.objects   # the end, pending


def test_an_item_of_a_task_that_ended_is_dropped():
    c = Cluster(cpus=1)
    call, wid = running_stream(c)
    c.done(wid, call, 0)
    c.take()
    c.s.streams.generator_item(worker_conn(wid), item(call, 1))
    assert pushes(c.take()) == {}
    assert rid(call, 1) not in c.s.objects


def test_an_item_of_a_direct_call_becomes_its_callers_object():
    c = Cluster(cpus=1)
    call = stream_call()   # sent straight to the actor: the head has no task for it
    c.s.streams.generator_item(worker_conn(1), item(call, 1, owner=DRIVER))
    assert rid(call, 1) in pushes(c.take())
    assert c.s.clients[DRIVER].holds[rid(call, 1)] == 1


# ------------------------------------------------------------------ acks

def test_an_ack_is_forwarded_to_the_producing_worker():
    c = Cluster(cpus=1)
    call, wid = running_stream(c)
    c.s.streams.generator_ack(call.task_id, 3)
    [msg] = sent(c.take(), GeneratorAck, worker_conn(wid))
    assert msg.consumed == 3


def test_a_retry_hears_the_acks_its_first_attempt_had():
    c = Cluster(cpus=2)
    call, wid = running_stream(c, max_retries=1)
    c.s.streams.generator_item(worker_conn(wid), item(call, 1))
    c.s.streams.generator_ack(call.task_id, 1)
    c.take()
    c.s.worker_died(wid, "killed")
    [(wid2, _)] = executed(c.take())
    c.s.streams.generator_item(worker_conn(wid2), item(call, 1))   # a repeat: told what was read
    [msg] = sent(c.take(), GeneratorAck, worker_conn(wid2))
    assert msg.consumed == 1


def test_an_ack_for_an_unknown_task_is_ignored():
    c = Cluster(cpus=1)
    c.s.streams.generator_ack(b"x" * 12, 1)
    assert c.take() == []


# ------------------------------------------------------------------ modes

def _gen() -> Any:
    yield 1


async def _agen() -> Any:
    yield 1


def _plain() -> int:
    return 1


def test_generator_functions_sync_and_async_are_recognised():
    assert is_generator_function(_gen) and is_generator_function(_agen)
    assert not is_generator_function(_plain)


@pytest.mark.parametrize(("num_returns", "is_gen", "mode"), [
    (None, True, STREAMING), (None, False, NONE), ("streaming", True, STREAMING),
    ("dynamic", True, DYNAMIC), (2, True, NONE), (1, False, NONE),
])
def test_generator_mode(num_returns: Any, is_gen: bool, mode: int):
    assert generator_mode(num_returns, is_gen, "f()") == mode


@pytest.mark.parametrize("num_returns", ["dynamic", "streaming"])
def test_a_generator_mode_on_a_plain_function_names_the_cause(num_returns: str):
    with pytest.raises(ValueError, match=r"needs a generator function, and f\(\) is not one"):
        generator_mode(num_returns, False, "f()")


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="\"dynamic\" or \"streaming\""):
        generator_mode("stream", True, "f()")


@pytest.mark.parametrize(("value", "limit"), [(None, 0), (-1, 0), (0, 0), (5, 5)])
def test_backpressure_values(value: Any, limit: int):
    assert check_backpressure(value) == limit


@pytest.mark.parametrize("value", [-2, 1.5, True, "3"])
def test_bad_backpressure_values_are_refused(value: Any):
    with pytest.raises(ValueError, match="_generator_backpressure_num_objects"):
        check_backpressure(value)
