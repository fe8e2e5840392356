"""orchestra.util.ActorPool and orchestra.util.queue.Queue on a real local cluster, with
Ray's semantics (ordered and unordered results, timeouts, pool membership, a queue
shared by the driver, tasks and actors, Empty and Full).
"""
from __future__ import annotations

import asyncio
import queue as stdqueue
import time
from pathlib import Path
from typing import Any

import pytest

import _helpers as h
import orchestra
from orchestra.exceptions import ActorDiedError
from orchestra.util import ActorPool
from orchestra.util.queue import Empty, Full, Queue

pytestmark = pytest.mark.timeout(90)

T = 30


@orchestra.remote
class Doubler:
    def double(self, v: int) -> int:
        return 2 * v

    def slow(self, v: float) -> float:
        time.sleep(v)
        return v

    def gated(self, gate: h.Gate, v: Any) -> Any:
        h.touch(gate.started)
        h.wait_for_file(gate.opened)
        return v

    def die(self) -> None:
        import os
        os._exit(1)


def double(a: Any, v: int) -> Any:
    return a.double.remote(v)


# ------------------------------------------------------------------ ActorPool

def test_map_returns_results_in_order(cluster: Any) -> None:
    pool = ActorPool([Doubler.remote(), Doubler.remote()])
    assert list(pool.map(double, range(20))) == [2 * i for i in range(20)]


def test_map_unordered_returns_every_result(cluster: Any) -> None:
    pool = ActorPool([Doubler.remote(), Doubler.remote()])
    out = list(pool.map_unordered(lambda a, v: a.slow.remote(v), [0.3, 0.0, 0.0]))
    assert sorted(out) == [0.0, 0.0, 0.3] and out[-1] == 0.3


def test_submit_waits_for_a_free_actor_and_get_next_keeps_order(cluster: Any) -> None:
    pool = ActorPool([Doubler.remote()])
    for v in range(4):
        pool.submit(double, v)
    assert not pool.has_free()
    assert [pool.get_next(timeout=T) for _ in range(4)] == [0, 2, 4, 6]
    assert not pool.has_next() and pool.has_free()


def test_get_next_on_an_empty_pool_raises_stop_iteration(cluster: Any) -> None:
    pool = ActorPool([Doubler.remote()])
    with pytest.raises(StopIteration, match="No more results"):
        pool.get_next()
    with pytest.raises(StopIteration):
        pool.get_next_unordered()


def test_get_next_timeout_leaves_the_call_or_ignores_it(cluster: Any, tmp_path: Path) -> None:
    gate = h.Gate(tmp_path)
    pool = ActorPool([Doubler.remote()])
    pool.submit(lambda a, v: a.gated.remote(gate, v), "late")
    with pytest.raises(TimeoutError, match="Timed out"):
        pool.get_next(timeout=0.1)
    assert pool.has_next()   # still the next result
    with pytest.raises(TimeoutError, match="has been ignored"):
        pool.get_next(timeout=0.1, ignore_if_timedout=True)
    assert not pool.has_next() and pool.has_free()
    gate.open()


def test_get_next_unordered_timeout(cluster: Any, tmp_path: Path) -> None:
    gate = h.Gate(tmp_path)
    pool = ActorPool([Doubler.remote()])
    pool.submit(lambda a, v: a.gated.remote(gate, v), 1)
    with pytest.raises(TimeoutError):
        pool.get_next_unordered(timeout=0.1)
    with pytest.raises(TimeoutError, match="has been ignored"):
        pool.get_next_unordered(timeout=0.1, ignore_if_timedout=True)
    assert not pool.has_next()
    gate.open()


def test_get_next_after_get_next_unordered_is_refused(cluster: Any) -> None:
    pool = ActorPool([Doubler.remote(), Doubler.remote()])
    pool.submit(double, 1)
    pool.submit(double, 2)
    pool.get_next_unordered(timeout=T)
    pool.get_next_unordered(timeout=T)
    pool.submit(double, 3)
    assert pool.get_next(timeout=T) == 6


def test_push_and_pop_idle(cluster: Any) -> None:
    a, b = Doubler.remote(), Doubler.remote()
    pool = ActorPool([a])
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(a)
    pool.push(b)
    taken = pool.pop_idle()
    assert taken in (a, b)
    pool.pop_idle()
    assert pool.pop_idle() is None and not pool.has_free()
    pool.submit(double, 5)   # waits: no actor
    assert not pool.has_next()
    pool.push(a)             # takes the waiting submit at once
    assert pool.get_next(timeout=T) == 10


def test_a_dead_actor_leaves_the_pool(cluster: Any) -> None:
    pool = ActorPool([Doubler.remote()])
    pool.submit(lambda a, v: a.die.remote(), None)
    with pytest.raises(ActorDiedError):
        pool.get_next(timeout=T)
    assert not pool.has_free()


def test_submit_refuses_what_is_not_an_actor_call(cluster: Any) -> None:
    pool = ActorPool([Doubler.remote()])
    with pytest.raises(TypeError, match="ObjectRef"):
        pool.submit(lambda a, v: v, 1)
    with pytest.raises(TypeError, match="fn"):
        pool.submit("double", 1)   # type: ignore[arg-type]


# ------------------------------------------------------------------ Queue

def test_put_and_get_in_order(cluster: Any) -> None:
    q = Queue()
    for i in range(5):
        q.put(i)
    assert q.qsize() == len(q) == q.size() == 5 and not q.empty()
    assert [q.get(timeout=T) for _ in range(5)] == list(range(5))
    assert q.empty()
    q.shutdown()


def test_get_timeout_raises_empty(cluster: Any) -> None:
    q = Queue()
    t = time.monotonic()
    with pytest.raises(Empty, match="empty"):
        q.get(timeout=0.2)
    assert time.monotonic() - t >= 0.2
    with pytest.raises(stdqueue.Empty):   # a subclass of the standard library's
        q.get_nowait()
    with pytest.raises(Empty):
        q.get(block=False)
    q.shutdown()


def test_a_full_queue_raises_full(cluster: Any) -> None:
    q = Queue(maxsize=1)
    q.put_nowait("a")
    assert q.full()
    with pytest.raises(Full):
        q.put("b", timeout=0.1)
    with pytest.raises(stdqueue.Full):
        q.put_nowait("b")
    assert q.get() == "a"
    q.shutdown()


def test_batches_are_all_or_nothing(cluster: Any) -> None:
    q = Queue(maxsize=3)
    with pytest.raises(Full, match="Cannot add 4 items"):
        q.put_nowait_batch([1, 2, 3, 4])
    q.put_nowait_batch([1, 2])
    with pytest.raises(Empty, match="Cannot get 3 items"):
        q.get_nowait_batch(3)
    assert q.get_nowait_batch(2) == [1, 2]
    q.shutdown()


@pytest.mark.parametrize("call,err", [
    (lambda q: q.get(timeout=-1), ValueError), (lambda q: q.put(1, timeout=-1), ValueError),
    (lambda q: q.get_nowait_batch(-1), ValueError), (lambda q: q.get_nowait_batch("2"), TypeError),
    (lambda q: q.put_nowait_batch(5), TypeError)])
def test_bad_arguments_are_refused(cluster: Any, call: Any, err: type[Exception]) -> None:
    q = Queue()
    with pytest.raises(err):
        call(q)
    q.shutdown()


def test_bad_maxsize_is_refused(cluster: Any) -> None:
    with pytest.raises(TypeError, match="maxsize"):
        Queue(maxsize="3")   # type: ignore[arg-type]


@orchestra.remote
def producer(q: Queue, n: int) -> int:
    for i in range(n):
        q.put(i)
    return n


@orchestra.remote
class Consumer:
    def __init__(self, q: Queue) -> None:
        self.q = q

    async def take(self, n: int) -> list[int]:
        return [await self.q.get_async(timeout=T) for _ in range(n)]


def test_tasks_and_actors_share_a_queue(cluster: Any) -> None:
    q = Queue()
    consumer = Consumer.remote(q)
    taken = consumer.take.remote(10)
    assert orchestra.get(producer.remote(q, 10), timeout=T) == 10
    assert orchestra.get(taken, timeout=T) == list(range(10))
    q.shutdown()


def test_a_blocked_get_is_woken_by_a_put(cluster: Any) -> None:
    q = Queue()
    c = Consumer.remote(q)
    ref = c.take.remote(1)
    time.sleep(0.2)
    q.put("hello")
    assert orchestra.get(ref, timeout=T) == ["hello"]
    q.shutdown()


def test_put_async_and_get_async(cluster: Any) -> None:
    q = Queue(maxsize=1)

    async def main() -> Any:
        await q.put_async(1)
        with pytest.raises(Full):
            await q.put_async(2, block=False)
        with pytest.raises(Full):
            await q.put_async(2, timeout=0.05)
        first = await q.get_async()
        with pytest.raises(Empty):
            await q.get_async(timeout=0.05)
        return first
    assert asyncio.run(main()) == 1
    q.shutdown()


@pytest.mark.parametrize("force", [False, True])
def test_shutdown_stops_the_actor(cluster: Any, force: bool) -> None:
    q = Queue(actor_options={"name": f"q-{force}"})
    q.put(1)
    handle = orchestra.get_actor(f"q-{force}")
    q.shutdown(force=force, grace_period_s=5)
    with pytest.raises(ActorDiedError):
        orchestra.get(handle.qsize.remote(), timeout=T)
    with pytest.raises(RuntimeError, match="shut down"):
        q.put(2)
