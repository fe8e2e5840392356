"""Generator tasks and methods on a real local cluster: streaming (the default for a
generator function or method) and dynamic, on tasks, sync actors, threaded actors and
async actors; an error midway, a worker killed midway, cancel, backpressure, and the
items' objects freed as their refs go.

The remote functions and classes live in this module: workers import it by name.
"""
from __future__ import annotations

import asyncio
import gc
import os
import signal
import time
from typing import Any

import numpy as np
import pytest

import _helpers as h
import orchestra
from _helpers import joined_cluster
from _probes import wait_until
from orchestra import DynamicObjectRefGenerator, ObjectRefGenerator
from orchestra.exceptions import (
    ActorDiedError,
    GetTimeoutError,
    TaskCancelledError,
    TaskError,
    WorkerCrashedError,
)

pytestmark = pytest.mark.timeout(90)

T = 30  # seconds: every get here has a deadline, so nothing hangs


def get(refs: Any) -> Any:
    return orchestra.get(refs, timeout=T)


def oid(ref: orchestra.ObjectRef) -> bytes:
    return ref.binary()


# ------------------------------------------------------------------ remote functions

@orchestra.remote
def count_to(n: int) -> Any:
    yield from range(n)


@orchestra.remote(num_returns="dynamic")
def count_dynamic(n: int) -> Any:
    for i in range(n):
        yield i * i


@orchestra.remote
def first_then_gate(gate: h.Gate) -> Any:
    """Yields one item, then waits for the driver before the rest."""
    yield "first"
    h.touch(gate.started)
    h.wait_for_file(gate.opened)
    yield "second"


@orchestra.remote
def fail_at(n: int, at: int) -> Any:
    for i in range(n):
        if i == at:
            raise ValueError(f"no item {i}")
        yield i


@orchestra.remote(max_retries=0)
def pid_then_gate(gate: h.Gate) -> Any:
    yield os.getpid()
    h.touch(gate.started)
    h.wait_for_file(gate.opened)
    yield "not reached"


@orchestra.remote(max_retries=1)
def crash_once_midway(marker: str) -> Any:
    """Yields 0 and 1, then its first attempt dies; the retry yields all four."""
    for i in range(4):
        if i == 2 and not os.path.exists(marker):
            h.touch(marker)
            os._exit(7)
        yield i


@orchestra.remote
def progress(directory: str, n: int) -> Any:
    """Yields n items, noting in ``directory`` how many it has made so far."""
    for i in range(n):
        h.touch(os.path.join(directory, f"made-{i}"))
        yield i


@orchestra.remote
def arrays(n: int, nbytes: int) -> Any:
    for i in range(n):
        yield np.full(nbytes // 8, i, dtype=np.int64)


@orchestra.remote
def boxed_refs(n: int) -> Any:
    """Items that hold refs: each a list with a ref to a put value."""
    for i in range(n):
        yield [orchestra.put(i * 100)]


@orchestra.remote(resources={"far": 1})
def far_arrays(n: int, nbytes: int) -> Any:
    """Runs on the node with resource "far": its items are in that node's store."""
    node = orchestra.get_runtime_context().get_node_id()
    for i in range(n):
        yield node, np.full(nbytes // 8, i, dtype=np.int64)


@orchestra.remote
def sum_of_stream(n: int) -> int:
    """A task consuming a stream of another task."""
    return sum(orchestra.get(list(count_to.remote(n))))


@orchestra.remote
def sleeper_stream(gate: h.Gate) -> Any:
    yield 0
    h.touch(gate.started)
    time.sleep(h.DEADLINE_S)
    yield 1


@orchestra.remote
class Store:
    def __init__(self) -> None:
        self.items: list[int] = []

    def add(self, x: int) -> int:
        self.items.append(x)
        return len(self.items)

    def replay(self) -> Any:
        yield from self.items

    def pid_then_gate(self, gate: h.Gate) -> Any:
        yield os.getpid()
        h.touch(gate.started)
        h.wait_for_file(gate.opened)
        yield "not reached"

    def fail_after(self, n: int) -> Any:
        yield from range(n)
        raise KeyError("stream broke")

    def slow(self, gate: h.Gate) -> Any:
        yield 0
        h.touch(gate.started)
        time.sleep(h.DEADLINE_S)
        yield 1

    def plain(self) -> int:
        return 1


@orchestra.remote
class AsyncSource:
    async def ticks(self, n: int) -> Any:
        for i in range(n):
            await asyncio.sleep(0.001)
            yield i

    async def fail_after(self, n: int) -> Any:
        for i in range(n):
            yield i
        raise RuntimeError("async stream broke")

    async def ping(self) -> str:
        return "pong"

    async def squares(self, n: int) -> Any:
        for i in range(n):
            yield i * i


# ------------------------------------------------------------------ tasks, streaming

def test_a_generator_function_streams_by_default(cluster):
    gen = count_to.remote(5)
    assert isinstance(gen, ObjectRefGenerator)
    assert [get(r) for r in gen] == [0, 1, 2, 3, 4]


def test_num_returns_streaming_streams(cluster):
    gen = count_to.options(num_returns="streaming").remote(3)
    assert [get(r) for r in gen] == [0, 1, 2]


def test_the_first_item_is_readable_while_the_task_still_runs(cluster, gates):
    gate = gates("stream")
    gen = first_then_gate.remote(gate)
    assert get(next(gen)) == "first"
    gate.wait_started()          # the task is still running, waiting for the gate
    assert not gen.is_finished()
    gate.open()
    assert get(next(gen)) == "second"
    with pytest.raises(StopIteration):
        next(gen)
    assert gen.is_finished()


def test_an_empty_generator_stops_at_once(cluster):
    gen = count_to.remote(0)
    assert list(gen) == []
    assert get(gen.completed()) == 0


def test_completed_is_ready_when_the_task_ends(cluster):
    gen = count_to.remote(3)
    assert get(gen.completed()) == 3   # the number of items
    assert gen.next_ready()
    assert [get(r) for r in gen] == [0, 1, 2]
    assert not gen.next_ready() and gen.is_finished()


def test_an_error_midway_arrives_at_the_failing_item(cluster):
    gen = fail_at.remote(5, 2)
    assert get(next(gen)) == 0
    assert get(next(gen)) == 1
    failing = next(gen)
    with pytest.raises(TaskError) as info:
        get(failing)
    assert isinstance(info.value, ValueError)
    assert "no item 2" in str(info.value)
    assert "fail_at" in str(info.value)   # the remote traceback names the generator
    with pytest.raises(StopIteration):
        next(gen)
    with pytest.raises(ValueError):
        get(gen.completed())


def test_items_may_be_large_and_come_from_shared_memory(cluster):
    values = [get(r) for r in arrays.remote(3, 4 << 20)]
    assert [int(v[0]) for v in values] == [0, 1, 2]
    assert all(v.nbytes == 4 << 20 and not v.flags.writeable for v in values)


def test_items_may_hold_refs_that_live_as_long_as_the_item(cluster):
    boxes = [get(r) for r in boxed_refs.remote(3)]
    gc.collect()
    assert [get(box[0]) for box in boxes] == [0, 100, 200]


def test_a_task_can_consume_a_stream(cluster):
    assert get(sum_of_stream.remote(10)) == 45


def test_tasks_consuming_streams_lend_their_cpus_to_the_producers(cluster):
    # Three consumers on two CPUs: each producer runs on a CPU a blocked consumer lent.
    assert get([sum_of_stream.remote(10) for _ in range(3)]) == [45, 45, 45]


def test_an_argument_that_cannot_be_pickled_leaves_no_stream_behind(cluster):
    import threading

    from orchestra._runtime import context as _context
    streams = _context.current_client().streams
    before = set(streams)
    with pytest.raises(TypeError):
        count_to.remote(threading.Lock())
    assert set(streams) == before


def test_next_with_async_for(cluster):
    async def main() -> list[int]:
        return [await ref async for ref in count_to.remote(4)]
    assert asyncio.run(main()) == [0, 1, 2, 3]


def test_wait_takes_a_generator_ready_when_its_next_item_is(cluster, gates):
    gate = gates("wait")
    gen = first_then_gate.remote(gate)
    slow = h.gated.remote(gates("other"), 1)
    ready, not_ready = orchestra.wait([slow, gen], num_returns=1, timeout=T)
    assert ready == [gen] and not_ready == [slow]
    assert get(next(gen)) == "first"
    ready, _ = orchestra.wait([gen], timeout=0.2)   # the task waits at the gate
    assert ready == []
    gate.open()
    assert orchestra.wait([gen], timeout=T)[0] == [gen]
    assert get(next(gen)) == "second"
    assert orchestra.wait([gen], timeout=T)[0] == [gen]   # ended: next() stops at once


# ------------------------------------------------------------------ dynamic

def test_dynamic_returns_a_ref_to_a_dynamic_generator(cluster):
    ref = count_dynamic.remote(4)
    assert isinstance(ref, orchestra.ObjectRef)
    dyn = get(ref)
    assert isinstance(dyn, DynamicObjectRefGenerator)
    assert len(dyn) == 4
    assert get(list(dyn)) == [0, 1, 4, 9]


def test_a_dynamic_generators_error_midway_goes_in_its_last_ref(cluster):
    # As Ray's: the values yielded before the error keep their refs; one more ref, the
    # last, holds the error.
    dyn = get(fail_at.options(num_returns="dynamic").remote(5, 3))
    refs = list(dyn)
    assert len(refs) == 4 and get(refs[:3]) == [0, 1, 2]
    with pytest.raises(ValueError, match="no item 3") as info:
        get(refs[3])
    assert isinstance(info.value, TaskError)


def test_a_generators_error_midway_with_num_returns_fails_only_the_refs_after_it(cluster):
    refs = fail_at.options(num_returns=5).remote(5, 3)
    assert get(refs[:3]) == [0, 1, 2]
    for ref in refs[3:]:
        with pytest.raises(ValueError, match="no item 3"):
            get(ref)
    # Without an error, the count must match, as for returned sequences.
    with pytest.raises(ValueError, match="yielded 3 values"):
        get(count_to.options(num_returns=4).remote(3)[0])


def test_an_error_after_all_num_returns_values_is_reported_and_the_values_stand(
        cluster, capfd):
    """As Ray (its issue 28689): a generator with num_returns=2 that yields two values
    and then raises returns both; the error is printed on the driver, not raised. It
    failed every ref before."""
    refs = fail_at.options(num_returns=2).remote(3, 2)   # yields 0, 1, then raises
    assert get(refs) == [0, 1]
    deadline = time.monotonic() + 10
    err = ""
    while "no item 2" not in err and time.monotonic() < deadline:
        time.sleep(0.1)
        err += capfd.readouterr().err
    assert "raised after yielding its 2 values" in err and "ValueError: no item 2" in err


def test_an_async_actors_dynamic_generator_error_goes_in_its_last_ref(cluster):
    a = AsyncSource.remote()
    refs = list(get(a.fail_after.options(num_returns="dynamic").remote(2)))
    assert len(refs) == 3 and get(refs[:2]) == [0, 1]
    with pytest.raises(RuntimeError, match="async stream broke"):
        get(refs[2])


# ------------------------------------------------------------------ actors

def test_a_sync_actor_generator_method_streams(cluster):
    s = Store.remote()
    for x in (5, 6, 7):
        s.add.remote(x)
    assert [get(r) for r in s.replay.remote()] == [5, 6, 7]
    # Calls after a stream keep their order, direct or through the head.
    assert get(s.add.remote(8)) == 4
    assert [get(r) for r in s.replay.remote()] == [5, 6, 7, 8]


def test_an_actor_method_with_num_returns_dynamic(cluster):
    s = Store.remote()
    get(s.add.remote(3))
    dyn = get(s.replay.options(num_returns="dynamic").remote())
    assert get(list(dyn)) == [3]


def test_a_threaded_actor_streams(cluster):
    s = Store.options(max_concurrency=2).remote()
    get([s.add.remote(i) for i in range(3)])
    assert sorted(get(r) for r in s.replay.remote()) == [0, 1, 2]


def test_an_actor_generator_error_midway_arrives_at_the_failing_item(cluster):
    s = Store.remote()
    gen = s.fail_after.remote(2)
    assert [get(next(gen)), get(next(gen))] == [0, 1]
    with pytest.raises(KeyError):
        get(next(gen))
    with pytest.raises(StopIteration):
        next(gen)
    assert get(s.plain.remote()) == 1   # the actor lives on


def test_an_async_actor_async_generator_streams(cluster):
    a = AsyncSource.remote()
    assert [get(r) for r in a.ticks.remote(5)] == [0, 1, 2, 3, 4]
    assert get(a.ping.remote()) == "pong"


def test_an_async_actor_method_with_num_returns_dynamic(cluster):
    a = AsyncSource.remote()
    assert get(list(get(a.squares.options(num_returns="dynamic").remote(4)))) == [0, 1, 4, 9]


def test_an_async_actor_error_midway_arrives_at_the_failing_item(cluster):
    a = AsyncSource.remote()
    gen = a.fail_after.remote(1)
    assert get(next(gen)) == 0
    with pytest.raises(RuntimeError, match="async stream broke"):
        get(next(gen))
    assert list(gen) == []


def test_an_async_actor_stream_with_async_for(cluster):
    a = AsyncSource.remote()

    async def main() -> list[int]:
        out = []
        async for ref in a.ticks.remote(3):
            out.append(await ref)
        return out
    assert asyncio.run(main()) == [0, 1, 2]


# ------------------------------------------------------------------ crashes and cancel

def test_a_worker_killed_midway_fails_the_next_item(cluster, gates):
    gate = gates("killed")
    gen = pid_then_gate.remote(gate)
    pid = get(next(gen))
    gate.wait_started()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerCrashedError):
        get(next(gen))
    with pytest.raises(StopIteration):
        next(gen)


def test_a_retried_generator_goes_on_from_where_it_was_without_repeats(cluster, tmp_path):
    gen = crash_once_midway.remote(str(tmp_path / "crashed"))
    assert [get(r) for r in gen] == [0, 1, 2, 3]


def test_an_actor_killed_midway_fails_the_next_item(cluster, gates):
    gate = gates("actor-killed")
    s = Store.remote()
    get(s.plain.remote())   # calls go straight to the actor's process from here on
    gen = s.pid_then_gate.remote(gate)
    pid = get(next(gen))
    gate.wait_started()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ActorDiedError):
        get(next(gen))


def test_a_cancelled_stream_fails_the_next_item(cluster, gates):
    gate = gates("cancel")
    gen = sleeper_stream.remote(gate)
    assert get(next(gen)) == 0
    gate.wait_started()
    orchestra.cancel(gen)   # the generator stands for its task, as in Ray
    with pytest.raises(TaskCancelledError):
        get(next(gen))


def test_a_cancelled_actor_stream_fails_the_next_item(cluster, gates):
    gate = gates("actor-cancel")
    s = Store.remote()
    get(s.plain.remote())   # calls go straight to the actor's process from here on
    gen = s.slow.remote(gate)
    assert get(next(gen)) == 0
    gate.wait_started()
    orchestra.cancel(gen.completed())
    with pytest.raises(TaskCancelledError):
        get(next(gen))
    assert get(s.plain.remote()) == 1


def test_next_with_a_timeout_raises_get_timeout_error(cluster, gates):
    gate = gates("timeout")
    gen = first_then_gate.remote(gate)
    assert get(gen._next(T)) == "first"
    with pytest.raises(GetTimeoutError):
        gen._next(0.2)
    gate.open()
    assert get(next(gen)) == "second"


# ------------------------------------------------------------------ backpressure

def test_backpressure_pauses_a_producer_ahead_of_its_consumer(cluster, tmp_path):
    gen = progress.options(_generator_backpressure_num_objects=2).remote(str(tmp_path), 8)

    def made() -> int:
        return len(os.listdir(tmp_path))

    wait_until(lambda: made() >= 2, T, "two items made")
    time.sleep(0.5)   # were it not paused, it would make all 8 in this time
    assert made() == 2
    assert get(next(gen)) == 0
    wait_until(lambda: made() >= 3, T, "one more item made once one was read")
    time.sleep(0.3)
    assert made() == 3
    assert [get(r) for r in gen] == list(range(1, 8))


def test_backpressure_on_an_actor_method(cluster):
    s = Store.remote()
    get([s.add.remote(i) for i in range(6)])
    gen = s.replay.options(_generator_backpressure_num_objects=1).remote()
    assert [get(r) for r in gen] == list(range(6))


def test_dropping_a_paused_stream_lets_its_producer_finish(cluster, tmp_path):
    gen = progress.options(_generator_backpressure_num_objects=1).remote(str(tmp_path), 5)
    end = gen.completed()
    wait_until(lambda: len(os.listdir(tmp_path)) >= 1, T, "the first item made")
    del gen
    gc.collect()
    assert get(end) == 5


# ------------------------------------------------------------------ reference counting

def test_a_stream_of_large_items_does_not_fill_the_store(start_cluster):
    c = start_cluster(num_cpus=2, object_store_memory=64 << 20)
    ids = []
    for ref in arrays.remote(40, 8 << 20):   # 320 MiB through a 64 MiB store
        assert get(ref).nbytes == 8 << 20
        ids.append(oid(ref))
        del ref
    gc.collect()
    wait_until(lambda: not set(ids) & set(c.objects()), 10, "every item freed")
    assert c.store().spilled_bytes == 0   # never full: nothing had to spill


def test_items_of_a_dropped_generator_are_freed(cluster):
    gen = count_to.remote(5)
    end = gen.completed()
    get(end)   # every item was pushed here, none taken
    tid = oid(end)[:-4]
    del gen
    gc.collect()
    item_ids = {tid + i.to_bytes(4, "big") for i in range(1, 6)}
    wait_until(lambda: not item_ids & set(cluster.objects()), 10, "the items freed")


def test_a_consumer_remembers_only_the_last_streams_it_ended(cluster):
    from orchestra._runtime import context as _context
    from orchestra._runtime.generators import _KEEP_CLOSED
    for _ in range(_KEEP_CLOSED + 20):
        list(count_to.remote(0))
    assert len(_context.current_client().streams) <= _KEEP_CLOSED


def test_an_item_ref_lives_after_the_generator(cluster):
    gen = count_to.remote(3)
    first = next(gen)
    del gen
    gc.collect()
    assert get(first) == 0


def test_a_stream_from_another_node_brings_its_large_items_here():
    with joined_cluster({"num_cpus": 1}, {"num_cpus": 1, "resources": {"far": 1}}):
        here = orchestra.get_runtime_context().get_node_id()
        got = [get(r) for r in far_arrays.remote(4, 2 << 20)]
        assert {node for node, _ in got} != {here}
        assert [int(a[0]) for _, a in got] == [0, 1, 2, 3]
        assert all(a.nbytes == 2 << 20 for _, a in got)


# ------------------------------------------------------------------ bad input

def test_num_returns_dynamic_on_a_plain_function_says_it_needs_a_generator():
    with pytest.raises(ValueError, match="needs a generator function"):
        @orchestra.remote(num_returns="dynamic")
        def plain() -> int:
            return 1


def test_num_returns_streaming_on_a_plain_method_says_it_needs_a_generator(cluster):
    s = Store.remote()
    with pytest.raises(ValueError, match="needs a generator function"):
        s.plain.options(num_returns="streaming")


def test_an_unknown_num_returns_string_is_refused():
    with pytest.raises(ValueError, match="dynamic"):
        count_to.options(num_returns="lots")


def test_a_bad_backpressure_value_is_refused():
    with pytest.raises(ValueError, match="_generator_backpressure_num_objects"):
        count_to.options(_generator_backpressure_num_objects="2")


def test_a_generator_cannot_be_passed_to_a_task(cluster):
    gen = count_to.remote(1)
    with pytest.raises(TypeError, match="ObjectRefGenerator cannot be pickled"):
        h.identity.remote(gen)
    list(gen)
