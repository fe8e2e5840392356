"""Actors on a real local cluster: creation, call order, handles, names, concurrency, GPUs,
death (a crash matrix), restarts and handle-counted lifetime.

The actor classes live in this module: workers import it by name (``test_actors``), as
they import ``_helpers``. Most actors here hold no CPU (the default), so they do not starve
the tasks of the 2-CPU shared cluster; the fixture's teardown waits for all resources to
be free, so a test kills the actors that reserve some (the others go with their handles).
"""
from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from typing import Any

import pytest

import _helpers as h
import orchestra
from _probes import pid_gone, wait_until
from orchestra.exceptions import ActorDiedError, TaskError

pytestmark = pytest.mark.timeout(60)

T = 30  # seconds: every get in these tests has a deadline, so nothing hangs


def get(refs: Any) -> Any:
    return orchestra.get(refs, timeout=T)


# ------------------------------------------------------------------ actor classes

@orchestra.remote
class Counter:
    def __init__(self, start: int = 0) -> None:
        self.n = start

    def inc(self, by: int = 1) -> int:
        self.n += by
        return self.n

    def value(self) -> int:
        return self.n

    def pid(self) -> int:
        return os.getpid()

    def block(self, gate: h.Gate, exit_after: bool = False) -> int:
        """Runs until the driver opens the gate; then returns, or exits the process."""
        h.touch(gate.started)
        h.wait_for_file(gate.opened)
        if exit_after:
            os._exit(3)
        return self.n

    def fail(self, message: str) -> None:
        self.n += 100
        raise ValueError(message)

    def pair(self) -> tuple[int, str]:
        return self.n, "second"


@orchestra.remote
class Log:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def append(self, item: Any) -> int:
        self.items.append(item)
        return len(self.items)

    def get_items(self) -> list[Any]:
        return list(self.items)


@orchestra.remote
class Relay:
    """Calls another actor through a handle it was given."""

    def inc_there(self, counter: Any, by: int) -> int:
        return orchestra.get(counter.inc.remote(by), timeout=T)

    def put_value(self, value: Any) -> Any:
        return orchestra.put(value)

    def task_ref(self, a: int, b: int) -> Any:
        return h.add.remote(a, b)

    def task_results(self, n: int) -> list[int]:
        return orchestra.get([h.add.remote(i, 100) for i in range(n)], timeout=T)


@orchestra.remote
class Sleeper:
    """Counts how many calls run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0

    def sleep(self, seconds: float) -> int:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(seconds)
        with self.lock:
            self.active -= 1
        return threading.get_ident()

    def get_peak(self) -> int:
        return self.peak

    def fail(self, message: str) -> None:
        self.peak += 100
        raise ValueError(message)

    def pid(self) -> int:
        return os.getpid()


@orchestra.remote
class AsyncSleeper:
    def __init__(self) -> None:
        self.active = 0
        self.peak = 0

    async def sleep(self, seconds: float) -> tuple[int, int]:
        self.active += 1
        self.peak = max(self.peak, self.active)
        await asyncio.sleep(seconds)
        self.active -= 1
        return os.getpid(), threading.get_ident()

    async def get_peak(self) -> int:
        return self.peak

    async def fail(self, message: str) -> None:
        self.peak += 100
        raise ValueError(message)

    async def pid(self) -> int:
        return os.getpid()


@orchestra.remote(num_gpus=1)
class GpuActor:
    def ids(self) -> tuple[str | None, list[int]]:
        return os.environ.get("CUDA_VISIBLE_DEVICES"), orchestra.get_gpu_ids()


@orchestra.remote
class FailingConstructor:
    def __init__(self, gate: h.Gate) -> None:
        h.touch(gate.started)
        h.wait_for_file(gate.opened)
        raise h.CustomError(7, "constructor refused")

    def inc(self) -> int:
        return 1


@orchestra.remote
def append_from(log: Any, caller: str, n: int) -> int:
    """A caller holding the handle: n ordered appends of (caller, i)."""
    return len(orchestra.get([log.append.remote((caller, i)) for i in range(n)], timeout=T))


@orchestra.remote
def inc_through(counter: Any, by: int) -> int:
    return orchestra.get(counter.inc.remote(by), timeout=T)


@orchestra.remote
def value_of_named(name: str) -> int:
    return orchestra.get(orchestra.get_actor(name).value.remote(), timeout=T)


def avail(resource: str) -> float:
    return orchestra.available_resources().get(resource, 0.0)


# ------------------------------------------------------------------ the class and its options

def test_remote_on_a_class_gives_an_actor_class_whose_handle_calls_it(cluster):
    assert isinstance(Counter, orchestra.ActorClass)
    a = Counter.remote(5)
    assert isinstance(a, orchestra.ActorHandle)
    ref = a.inc.remote(2)
    assert isinstance(ref, orchestra.ObjectRef)
    assert get(ref) == 7


def test_remote_with_options_on_a_class_reserves_its_resources(cluster):
    @orchestra.remote(num_cpus=1, num_gpus=1, resources={"widget": 1}, max_restarts=1,
                      max_concurrency=2)
    class Heavy:
        def where(self) -> list[int]:
            return orchestra.get_gpu_ids()

    assert isinstance(Heavy, orchestra.ActorClass)
    before = orchestra.available_resources()
    a = Heavy.remote()
    assert len(get(a.where.remote())) == 1
    now = orchestra.available_resources()
    assert (now["CPU"], now["GPU"], now["widget"]) == (before["CPU"] - 1, before["GPU"] - 1, 0)
    orchestra.kill(a)
    wait_until(lambda: orchestra.available_resources() == before, 10, "resources returned")


def test_options_give_an_actor_class_with_those_options(cluster):
    cls = Sleeper.options(name="opts", max_restarts=2, max_concurrency=2, num_cpus=1, num_gpus=1)
    assert isinstance(cls, orchestra.ActorClass)
    a = cls.remote()
    try:
        assert orchestra.get_actor("opts") == a
        assert avail("CPU") == 1 and avail("GPU") == 1
        get(a.get_peak.remote())   # constructed: its start-up is not timed
        start = time.monotonic()
        get([a.sleep.remote(0.6), a.sleep.remote(0.6)])
        assert time.monotonic() - start < 1.1   # max_concurrency=2: side by side
    finally:
        orchestra.kill(a)
    wait_until(lambda: avail("CPU") == 2 and avail("GPU") == 2, 10, "resources returned")
    # options() made a new class: the original keeps none of them.
    b = Sleeper.remote()
    get(b.sleep.remote(0))
    assert avail("CPU") == 2 and avail("GPU") == 2
    with pytest.raises(ValueError):
        orchestra.get_actor("opts")


@orchestra.remote
class _SlowToStart:
    def __init__(self, fail: bool) -> None:
        time.sleep(0.3)
        if fail:
            raise ValueError("no start")

    async def work(self) -> int:
        return 1


def test_every_actor_answers_ray_ready_once_it_is_up(cluster):
    """Ray's built-in `handle.__ray_ready__.remote()`: True once the constructor ran (an
    async actor's too); a constructor that raised makes it raise as any call does."""
    assert orchestra.get(_SlowToStart.remote(False).__ray_ready__.remote(), timeout=T) is True
    with pytest.raises(Exception, match="no start"):
        orchestra.get(_SlowToStart.remote(True).__ray_ready__.remote(), timeout=T)


def test_instantiating_an_actor_class_directly_raises_type_error(cluster):
    with pytest.raises(TypeError, match=r"Counter\.remote\(\.\.\.\)"):
        Counter()


def test_calling_a_method_directly_raises_type_error(cluster):
    a = Counter.remote()
    with pytest.raises(TypeError, match=r"handle\.inc\.remote"):
        a.inc()


def test_an_unknown_method_raises_attribute_error_naming_the_methods(cluster):
    a = Counter.remote()
    with pytest.raises(AttributeError, match="no method 'nope'") as info:
        a.nope.remote()
    for name in ("inc", "value", "pid", "block"):
        assert name in str(info.value)


def test_method_options_num_returns_gives_k_refs(cluster):
    a = Counter.remote(4)
    refs = a.pair.options(num_returns=2).remote()
    assert isinstance(refs, list) and len(refs) == 2
    assert all(isinstance(r, orchestra.ObjectRef) for r in refs)
    assert get(refs) == [4, "second"]


# ------------------------------------------------------------------ state and order

def test_state_persists_across_calls(cluster):
    a = Counter.remote(10)
    assert get(a.inc.remote()) == 11
    assert get(a.inc.remote(5)) == 16
    assert get(a.value.remote()) == 16


def test_calls_from_one_caller_run_in_submission_order(cluster):
    log = Log.remote()
    refs = [log.append.remote(i) for i in range(200)]
    assert get(refs) == list(range(1, 201))
    assert get(log.get_items.remote()) == list(range(200))


def test_calls_from_several_callers_keep_each_callers_order(cluster):
    log = Log.remote()
    n = 100
    callers = [append_from.remote(log, f"task{i}", n) for i in range(2)]
    mine = [log.append.remote(("driver", i)) for i in range(n)]
    get(callers + mine)
    items = get(log.get_items.remote())
    assert len(items) == 3 * n
    for caller in ("task0", "task1", "driver"):
        assert [i for c, i in items if c == caller] == list(range(n)), caller


# ------------------------------------------------------------------ handles travel

def test_a_handle_passed_to_a_task_calls_the_same_actor(cluster):
    a = Counter.remote()
    assert get(inc_through.remote(a, 3)) == 3
    assert get(a.inc.remote(1)) == 4


def test_a_handle_passed_to_another_actor_calls_the_same_actor(cluster):
    a, relay = Counter.remote(), Relay.remote()
    assert get(relay.inc_there.remote(a, 2)) == 2
    assert get(a.value.remote()) == 2


def test_a_handle_inside_a_put_object_calls_the_same_actor(cluster):
    a = Counter.remote()
    boxed = orchestra.put({"handle": a})
    assert get(get(boxed)["handle"].inc.remote(7)) == 7


# ------------------------------------------------------------------ arguments and returns

def test_top_level_ref_arguments_arrive_as_values(cluster):
    log = Log.remote()
    get(log.append.remote(orchestra.put([1, 2])))
    get(log.append.remote(item=h.add.remote(2, 3)))
    assert get(log.get_items.remote()) == [[1, 2], 5]


def test_a_call_waits_for_a_running_tasks_ref_and_later_calls_stay_behind_it(cluster, gates):
    gate = gates("producer")
    log = Log.remote()
    get(log.append.remote("first"))
    produced = h.gated.remote(gate, "from the task")
    waiting = log.append.remote(produced)
    later = log.append.remote("later")
    gate.wait_started()
    ready, _ = orchestra.wait([waiting, later], num_returns=1, timeout=0.3)
    assert ready == []
    gate.open()
    assert get([waiting, later]) == [2, 3]
    assert get(log.get_items.remote()) == ["first", "from the task", "later"]


def test_a_method_may_return_a_ref(cluster):
    relay = Relay.remote()
    put_ref = get(relay.put_value.remote([1, 2, 3]))
    assert isinstance(put_ref, orchestra.ObjectRef)
    assert get(put_ref) == [1, 2, 3]
    assert get(get(relay.task_ref.remote(1, 2))) == 3


def test_a_method_may_submit_tasks_and_get_their_results(cluster):
    relay = Relay.remote()
    assert get(relay.task_results.remote(4)) == [100, 101, 102, 103]


# ------------------------------------------------------------------ names

def test_get_actor_finds_a_named_actor_from_the_driver_and_from_a_task(cluster):
    a = Counter.options(name="finder").remote(41)
    try:
        found = orchestra.get_actor("finder")
        assert found == a
        assert get(found.inc.remote()) == 42
        assert get(value_of_named.remote("finder")) == 42
    finally:
        orchestra.kill(a)


def test_get_actor_of_a_missing_name_raises_value_error(cluster):
    with pytest.raises(ValueError, match="no-such-actor"):
        orchestra.get_actor("no-such-actor")


def test_a_duplicate_name_raises_value_error_at_creation(cluster):
    a = Counter.options(name="unique").remote()
    try:
        with pytest.raises(ValueError, match="unique"):
            Counter.options(name="unique").remote()
        assert get(orchestra.get_actor("unique").inc.remote()) == 1   # the first one lives on
    finally:
        orchestra.kill(a)


def test_a_killed_actors_name_is_free_again(cluster):
    a = Counter.options(name="reused").remote()
    get(a.inc.remote())
    orchestra.kill(a)
    with pytest.raises(ActorDiedError):
        get(a.inc.remote())
    b = Counter.options(name="reused").remote(5)
    try:
        assert get(orchestra.get_actor("reused").value.remote()) == 5
    finally:
        orchestra.kill(b)


# ------------------------------------------------------------------ concurrency

def timed_calls(actor: Any, n: int, seconds: float) -> tuple[float, list[Any]]:
    get(actor.get_peak.remote())   # constructed: its start-up is not timed
    start = time.monotonic()
    results = get([actor.sleep.remote(seconds) for _ in range(n)])
    return time.monotonic() - start, results


def test_max_concurrency_runs_calls_at_once_in_threads(cluster):
    elapsed, threads = timed_calls(Sleeper.options(max_concurrency=4).remote(), 4, 0.5)
    assert elapsed < 1.5
    assert len(set(threads)) == 4


def test_max_concurrency_one_runs_one_call_at_a_time(cluster):
    a = Sleeper.options(max_concurrency=1).remote()
    elapsed, _ = timed_calls(a, 4, 0.5)
    assert elapsed >= 2.0
    assert get(a.get_peak.remote()) == 1


def test_a_plain_actor_runs_one_call_at_a_time(cluster):
    a = Sleeper.remote()
    _, threads = timed_calls(a, 6, 0.05)
    assert get(a.get_peak.remote()) == 1
    assert len(set(threads)) == 1


def test_async_methods_run_concurrently_on_one_event_loop(cluster):
    a = AsyncSleeper.remote()
    elapsed, where = timed_calls(a, 50, 0.2)
    assert elapsed < 3.0   # one at a time would take 10 s
    assert len(set(where)) == 1   # one process, one loop thread
    assert get(a.get_peak.remote()) > 1


def test_async_actor_runs_at_most_max_concurrency_calls_at_once(cluster):
    a = AsyncSleeper.options(max_concurrency=2).remote()
    elapsed, _ = timed_calls(a, 4, 0.3)
    assert elapsed >= 0.6
    assert get(a.get_peak.remote()) == 2


# ------------------------------------------------------------------ GPUs

def test_gpu_actors_hold_their_gpu_ids_for_life(cluster):
    assert orchestra.cluster_resources()["GPU"] == 2
    a, b = GpuActor.remote(), GpuActor.remote()
    seen_a = {tuple(map(str, get(a.ids.remote())[1])) for _ in range(5)}
    cuda_a, ids_a = get(a.ids.remote())
    cuda_b, ids_b = get(b.ids.remote())
    assert len(seen_a) == 1 and len(ids_a) == 1 and len(ids_b) == 1
    assert cuda_a == str(ids_a[0]) and cuda_b == str(ids_b[0])
    assert ids_a != ids_b
    assert avail("GPU") == 0
    orchestra.kill(a)
    wait_until(lambda: avail("GPU") == 1, 10, "the killed actor's GPU returned")
    assert get(b.ids.remote()) == (cuda_b, ids_b)
    orchestra.kill(b)
    wait_until(lambda: avail("GPU") == 2, 10, "both GPUs returned")


# ------------------------------------------------------------------ death (crash matrix)

@pytest.mark.parametrize("how", ["kill", "sigkill_from_outside", "exit_in_a_method"])
def test_every_pending_and_later_call_of_a_dead_actor_raises_actor_died_error(cluster, gates, how):
    gate = gates(how)
    a = Counter.remote()
    pid = get(a.pid.remote())
    running = a.block.remote(gate, exit_after=how == "exit_in_a_method")
    gate.wait_started()
    pending = [a.inc.remote() for _ in range(3)]
    if how == "kill":
        orchestra.kill(a)
    elif how == "sigkill_from_outside":
        os.kill(pid, signal.SIGKILL)
    else:
        gate.open()
    for ref in [running, *pending]:
        with pytest.raises(ActorDiedError) as info:
            get(ref)
        assert type(info.value) is ActorDiedError   # one error type for every death
        assert "Counter" in str(info.value)
    with pytest.raises(ActorDiedError):
        get(a.inc.remote())
    wait_until(lambda: pid_gone(pid), 10, f"actor pid {pid} gone")


@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_calls_in_flight_on_a_concurrent_actor_fail_when_its_process_dies(cluster, kind):
    # A thread to spare for get_peak while four calls sleep.
    cls = Sleeper.options(max_concurrency=5) if kind == "threaded" else AsyncSleeper
    a = cls.remote()
    pid = get(a.pid.remote())
    in_flight = [a.sleep.remote(h.DEADLINE_S) for _ in range(4)]
    wait_until(lambda: get(a.get_peak.remote()) >= 3, 10, "the calls running")
    os.kill(pid, signal.SIGKILL)
    for ref in in_flight:
        with pytest.raises(ActorDiedError):
            get(ref)
    with pytest.raises(ActorDiedError):
        get(a.get_peak.remote())


def test_a_constructor_that_raised_fails_every_call_with_its_exception_as_cause(cluster, gates):
    gate = gates("constructor")
    a = FailingConstructor.remote(gate)
    gate.wait_started()
    pending = [a.inc.remote() for _ in range(3)]   # queued while the constructor runs
    gate.open()
    later = a.inc.remote()
    for ref in [*pending, later]:
        with pytest.raises(ActorDiedError) as info:
            get(ref)
        err = info.value
        assert type(err) is ActorDiedError
        assert isinstance(err.__cause__, h.CustomError)
        assert err.__cause__.code == 7
        text = str(err)
        assert "code 7: constructor refused" in text
        assert "Remote traceback" in text and "in __init__" in text
    with pytest.raises(ActorDiedError):
        get(a.inc.remote())


# ------------------------------------------------------------------ restarts

def crash_while_running(actor: Any, gate: h.Gate) -> None:
    """SIGKILL the actor while a call runs there and two wait behind it: the calls in
    flight fail with ActorDiedError."""
    pid = get(actor.pid.remote())
    in_flight = [actor.block.remote(gate), actor.inc.remote(), actor.inc.remote()]
    gate.wait_started()
    os.kill(pid, signal.SIGKILL)
    for ref in in_flight:
        with pytest.raises(ActorDiedError):
            get(ref)


def test_a_crashed_actor_restarts_with_fresh_state_up_to_max_restarts(cluster, gates):
    a = Counter.options(max_restarts=2).remote()
    pids = set()
    for attempt in range(3):
        # A fresh instance each time: the constructor ran again, the count starts over.
        assert get([a.inc.remote(), a.inc.remote()]) == [1, 2], attempt
        pids.add(get(a.pid.remote()))
        crash_while_running(a, gates(f"crash{attempt}"))
    assert len(pids) == 3
    # The third crash used up max_restarts=2: dead for good.
    with pytest.raises(ActorDiedError, match=r"restarted 2 times \(max_restarts=2\)") as err:
        get(a.inc.remote())
    # It had restarts: the advice is to allow more, not to set max_restarts.
    assert "give it max_restarts=" not in str(err.value)
    assert "max_restarts=-1" in str(err.value)


def test_an_actor_without_max_restarts_is_dead_after_one_crash(cluster, gates):
    a = Counter.remote()
    crash_while_running(a, gates())
    with pytest.raises(ActorDiedError):
        get(a.inc.remote())


def test_kill_with_no_restart_false_lets_the_actor_restart(cluster):
    a = Counter.options(max_restarts=2).remote()
    assert get(a.inc.remote(5)) == 5
    pid = get(a.pid.remote())
    orchestra.kill(a, no_restart=False)
    wait_until(lambda: pid_gone(pid), 10, f"actor pid {pid} gone")
    # Later calls reach the restarted instance.
    assert get(a.inc.remote()) == 1
    assert get(a.pid.remote()) != pid
    orchestra.kill(a)   # no_restart=True by default: dead for good with a restart left
    with pytest.raises(ActorDiedError, match="killed by orchestra.kill"):
        get(a.inc.remote())


def test_calls_made_right_after_kill_with_no_restart_false_reach_the_new_instance(cluster):
    a = Counter.options(max_restarts=1).remote()
    pid = get(a.pid.remote())
    orchestra.kill(a, no_restart=False)
    after = a.inc.remote()   # submitted before the old process is seen to die
    assert get(after) == 1
    assert get(a.pid.remote()) != pid


# ------------------------------------------------------------------ lifetime

def test_an_actor_with_no_handle_left_is_stopped_and_its_resources_return(cluster):
    a = Counter.options(resources={"widget": 1}, num_gpus=1).remote()
    pid = get(a.pid.remote())
    assert avail("widget") == 0 and avail("GPU") == 1
    del a
    gc.collect()
    wait_until(lambda: pid_gone(pid), 5, f"actor pid {pid} gone")
    wait_until(lambda: avail("widget") == 1 and avail("GPU") == 2, 5, "resources returned")


def test_an_actor_handed_to_a_task_lives_while_the_task_holds_its_handle(cluster):
    a = Counter.remote()
    ref = inc_through.remote(a, 2)
    pid = get(a.pid.remote())
    del a
    gc.collect()
    assert get(ref) == 2
    wait_until(lambda: pid_gone(pid), 5, f"actor pid {pid} gone")


def test_an_actor_whose_handles_are_gone_finishes_the_calls_it_has(cluster, gates):
    gate = gates()
    a = Counter.remote(3)
    pid = get(a.pid.remote())
    running = a.block.remote(gate)
    queued = a.inc.remote()
    gate.wait_started()
    del a
    gc.collect()
    gate.open()
    assert get([running, queued]) == [3, 4]
    wait_until(lambda: pid_gone(pid), 5, f"actor pid {pid} gone")


def test_a_named_actor_lives_on_without_handles_until_killed(cluster):
    named = Counter.options(name="keeper").remote()
    unnamed = Counter.remote()
    get(named.inc.remote())
    named_pid, unnamed_pid = get(named.pid.remote()), get(unnamed.pid.remote())
    del named, unnamed
    gc.collect()
    # Both handles went in the same ref flush: once the unnamed one is gone, the named
    # one would be gone too if handles decided its life.
    wait_until(lambda: pid_gone(unnamed_pid), 5, f"unnamed actor pid {unnamed_pid} gone")
    assert not pid_gone(named_pid)
    found = orchestra.get_actor("keeper")
    assert get(found.inc.remote()) == 2
    orchestra.kill(found)
    with pytest.raises(ActorDiedError):
        get(found.inc.remote())
    wait_until(lambda: pid_gone(named_pid), 10, f"named actor pid {named_pid} gone")
    with pytest.raises(ValueError):
        orchestra.get_actor("keeper")


# ------------------------------------------------------------------ errors in methods

def test_a_method_exception_raises_task_error_and_the_actor_lives_on(cluster):
    a = Counter.remote()
    get(a.inc.remote())
    with pytest.raises(TaskError) as info:
        get(a.fail.remote("bad input"))
    assert isinstance(info.value, ValueError)
    assert "bad input" in str(info.value) and "Counter.fail" in str(info.value)
    assert get(a.value.remote()) == 101   # the state it had, including the failed call's change


@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_a_method_exception_in_a_concurrent_actor_raises_task_error(cluster, kind):
    cls = Sleeper.options(max_concurrency=2) if kind == "threaded" else AsyncSleeper
    a = cls.remote()
    with pytest.raises(TaskError) as info:
        get(a.fail.remote("bad input"))
    assert isinstance(info.value, ValueError) and "bad input" in str(info.value)
    assert get(a.get_peak.remote()) == 100


# ------------------------------------------------------------------ many actors

def test_twenty_actors_alive_at_once(cluster):
    actors = [Counter.remote(i) for i in range(20)]
    assert get([a.inc.remote() for a in actors]) == [i + 1 for i in range(20)]
    assert len(set(get([a.pid.remote() for a in actors]))) == 20


@pytest.mark.load
@pytest.mark.timeout(120)
def test_two_hundred_actors_alive_at_once_answer_and_go_away(cluster):
    from orchestra._cli.microbenchmark import _children, _mem
    n = 200
    start = time.monotonic()
    actors = [Counter.remote(i) for i in range(n)]
    assert get([a.inc.remote() for a in actors]) == [i + 1 for i in range(n)]
    elapsed = time.monotonic() - start
    pids = get([a.pid.remote() for a in actors])
    assert len(set(pids)) == n
    procs = [cluster.head_pid, *_children(cluster.head_pid)]   # head, zygote, workers, actors
    rss, pss = (sum(m) for m in zip(*(_mem(p) for p in procs), strict=True))
    print(f"\n{n} actors: created and answered in {elapsed:.2f} s; {len(procs)} processes "
          f"hold {pss / (1 << 30):.2f} GiB PSS, {rss / (1 << 30):.2f} GiB RSS")
    del actors
    gc.collect()
    wait_until(lambda: all(pid_gone(p) for p in pids), 30, f"the {n} actor processes gone")


@orchestra.remote(num_cpus=0)
class Rounds:
    def rounds(self) -> int:
        from orchestra._runtime import context
        return int(context.current_client().pacer.rounds)   # type: ignore[attr-defined]


@pytest.mark.load
def test_an_idle_actor_wakes_a_few_times_a_second(cluster):
    # The client's background thread waits longer while nothing goes on (up to 0.25 s),
    # and its short round (20 ms) comes back with the next call: 200 idle actors kept
    # ~57% of a core busy when each woke 50 times a second.
    a = Rounds.remote()
    before = orchestra.get(a.rounds.remote(), timeout=30)
    time.sleep(2)
    idle = orchestra.get(a.rounds.remote(), timeout=30) - before
    assert 0 < idle <= 30, f"{idle} rounds in 2 s idle (50 a second would be ~100)"
    # Busy again: calls back to back keep the short round, and nothing waits on it.
    start = orchestra.get(a.rounds.remote(), timeout=30)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        orchestra.get(a.rounds.remote(), timeout=30)
    busy = orchestra.get(a.rounds.remote(), timeout=30) - start
    assert busy >= 15, f"only {busy} rounds in 1 s of calls: the short round did not come back"
