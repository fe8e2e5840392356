"""Direct calls, sent straight to a worker's process: actor calls (Submitter.submit_actor) and
the driver's tasks on workers the head lends it (Loan).

A caller's first calls go through the head; once the head has sent them to the actor's
process it gives the caller that process's socket, and later calls go there, with their
answers straight back. These tests check what a user sees across that switch: order,
results passed on to tasks, actors and puts, large and ref-holding results, death,
restarts, cancel, calls from tasks, and that nothing is left behind. For tasks: the same
on lent workers, plus retries after a crash, stealing, lending back for nested tasks,
and resources free as soon as the driver has nothing running.

The actor classes and functions live in this module: workers import it by name.
"""
from __future__ import annotations

import gc
import os
import signal
import socket
import time
from typing import Any

import numpy as np
import pytest

import _helpers as h
import orchestra
from _probes import wait_until
from orchestra import _ids
from orchestra._protocol import pb
from orchestra._protocol import wire as _wire
from orchestra._runtime import client as _client
from orchestra.exceptions import ActorDiedError, TaskCancelledError, WorkerCrashedError

pytestmark = pytest.mark.timeout(60)

T = 30


def get(refs: Any) -> Any:
    return orchestra.get(refs, timeout=T)


@orchestra.remote
class Keeper:
    def __init__(self) -> None:
        self.items: list[Any] = []
        self.kept: list[Any] = []

    def append(self, item: Any) -> int:
        self.items.append(item)
        return len(self.items)

    def items_so_far(self) -> list[Any]:
        return list(self.items)

    def pid(self) -> int:
        return os.getpid()

    def block(self, gate: h.Gate, exit_after: bool = False) -> int:
        h.touch(gate.started)
        h.wait_for_file(gate.opened)
        if exit_after:
            os._exit(3)
        return len(self.items)

    def array(self, n: int) -> np.ndarray:
        return np.arange(n, dtype=np.int64)

    def boxed_put(self, value: Any) -> list[Any]:
        return [orchestra.put(value)]

    def keep(self, box: list[Any]) -> int:
        self.kept.extend(box)   # refs inside an argument, kept past the call
        return len(self.kept)

    def read_kept(self) -> list[Any]:
        return orchestra.get(self.kept)


@orchestra.remote
def call_many(actor: Any, n: int) -> list[int]:
    return orchestra.get([actor.append.remote(i) for i in range(n)])


def _head_sees(cluster: Any, name: str) -> bool:
    return any(t.name == name for t in cluster.debug().task)


def _blocked_direct_call(gates: Any) -> tuple[Any, Any, Any]:
    """An actor with one call behind it (so later calls go straight) and a direct call
    now running in it, held by a gate: (actor, gate, its ref)."""
    a = Keeper.remote()
    get(a.append.remote(0))
    gate = gates()
    running = a.block.remote(gate)
    gate.wait_started()
    return a, gate, running


def test_the_first_call_goes_through_the_head_and_later_ones_straight_to_the_actor(cluster, gates):
    a = Keeper.remote()
    first = gates("first")
    ref = a.block.remote(first)
    first.wait_started()
    assert _head_sees(cluster, "Keeper.block")   # before the address is known: the head's
    first.open()
    assert get(ref) == 0
    later = gates("later")
    ref = a.block.remote(later)
    later.wait_started()
    assert not _head_sees(cluster, "Keeper.block")   # sent straight to the actor's process
    later.open()
    assert get(ref) == 0


def test_calls_keep_their_order_across_the_switch_to_direct_calls(cluster):
    a = Keeper.remote()
    refs = []
    for i in range(3000):
        refs.append(a.append.remote(i))
        if i % 500 == 0:
            time.sleep(0.02)   # some calls wait at the head, some go straight
    assert get(refs) == list(range(1, 3001))
    assert get(a.items_so_far.remote()) == list(range(3000))


def test_a_direct_result_passed_on_reaches_tasks_actors_and_puts(cluster):
    a = Keeper.remote()
    get(a.append.remote("x"))
    assert get(h.identity.remote(a.append.remote("y"))) == 2          # a task's argument
    assert get(h.get_nested.remote([a.append.remote("z")])) == [3]    # inside one
    boxed = orchestra.put({"r": a.append.remote("w")})
    assert get(get(boxed)["r"]) == 4                                   # inside a put
    b = Keeper.remote()
    assert get(b.append.remote(a.append.remote("v"))) == 1             # another actor
    assert get(b.items_so_far.remote()) == [5]


def test_a_direct_result_still_running_can_be_passed_on(cluster, gates):
    a, gate, running = _blocked_direct_call(gates)
    as_arg = h.identity.remote(running)      # the head waits for it
    in_put = orchestra.put([running])
    del running
    gate.open()
    assert get(as_arg) == 1
    assert get(get(in_put)[0]) == 1


def test_large_and_ref_holding_results_of_direct_calls(cluster):
    a = Keeper.remote()
    get(a.append.remote(0))
    n = 1 << 20   # 8 MiB: in shared memory
    big = a.array.remote(n)
    arr = get(big)
    assert arr.shape == (n,) and int(arr[-1]) == n - 1 and not arr.flags.writeable
    inner = get(a.boxed_put.remote("held"))[0]
    assert get(inner) == "held"
    assert get(h.identity.remote(big))[123] == 123   # a task reads it too


def test_refs_inside_a_direct_calls_argument_live_on_in_the_actor(cluster):
    a = Keeper.remote()
    get(a.append.remote(0))
    for i in range(20):
        assert get(a.keep.remote([orchestra.put(i)])) == i + 1   # the driver drops its ref
    assert get(a.read_kept.remote()) == list(range(20))


def test_a_task_calls_an_actor_direct(cluster):
    a = Keeper.remote()
    assert get(call_many.remote(a, 500)) == list(range(1, 501))
    assert get(a.items_so_far.remote()) == list(range(500))


def test_direct_calls_in_flight_when_the_process_exits_fail_naming_the_exit(cluster, gates):
    a = Keeper.remote()
    pid = get(a.pid.remote())
    gate = gates()
    running = a.block.remote(gate, exit_after=True)
    gate.wait_started()
    queued = [a.append.remote(i) for i in range(3)]
    gate.open()
    with pytest.raises(ActorDiedError) as info:
        get(running)
    assert f"pid={pid}" in str(info.value) and "exit code 3" in str(info.value)
    for ref in queued:
        with pytest.raises(ActorDiedError):
            get(ref)
    with pytest.raises(ActorDiedError):
        get(a.append.remote(9))


def test_a_restarted_actor_takes_direct_calls_again(cluster, gates):
    a = Keeper.options(max_restarts=1).remote()
    old = get(a.pid.remote())
    get(a.append.remote(0))
    os.kill(old, signal.SIGKILL)

    def restarted() -> bool:
        try:
            return get(a.pid.remote()) != old
        except ActorDiedError:   # a call in flight at the death
            return False
    wait_until(restarted, 20, "the actor restarted")
    assert get([a.append.remote(i) for i in range(100)]) == list(range(1, 101))   # fresh state
    gate = gates()
    ref = a.block.remote(gate)
    gate.wait_started()
    assert not _head_sees(cluster, "Keeper.block")
    gate.open()
    assert get(ref) == 100


def test_cancel_of_a_direct_call_running_or_queued(cluster, gates):
    a, gate, running = _blocked_direct_call(gates)
    queued = a.append.remote(1)
    orchestra.cancel(queued)
    orchestra.cancel(running)
    for ref in (running, queued):
        with pytest.raises(TaskCancelledError):
            get(ref)
    assert get(a.items_so_far.remote()) == [0]   # the actor lives on; the queued call never ran


def test_results_of_direct_calls_dropped_unread_leave_nothing_behind(cluster):
    gc.collect()   # refs an earlier test left in reference cycles (a caught error's traceback)
    a = Keeper.remote()
    get(a.append.remote(0))
    for _ in range(20):
        a.array.remote(1 << 18)   # 2 MiB each, in shared memory, never read
        a.boxed_put.remote("x")
    get(a.append.remote(1))

    def left() -> list[Any]:
        return [o for o in cluster.objects().values() if o.size > 0]
    wait_until(lambda: not left(), 10, "every dropped result freed",
               lambda: f"left: {[(o.objref.hex(), o.state, o.refcount, o.size) for o in left()]}")
    wait_until(lambda: cluster.store().used == 0, 10, "the store empty")


# ------------------------------------------------------------------ tasks on lent workers

@orchestra.remote
def exit_once(marker: str) -> int:
    """Exits its worker the first time (no marker yet), returns its pid the second."""
    if not os.path.exists(marker):
        h.touch(marker)
        os._exit(3)
    return os.getpid()


@orchestra.remote
def sleep_then(seconds: float, value: Any) -> Any:
    time.sleep(seconds)
    return value


@orchestra.remote
def fan_out(n: int) -> int:
    return sum(orchestra.get([h.identity.remote(i) for i in range(n)]))


@pytest.fixture
def keep_loans(monkeypatch):
    """Lent workers stay lent while a test looks (they go back after 0.2 s idle)."""
    monkeypatch.setattr(_client, "LOAN_IDLE_S", 30.0)


def _lent(cluster: Any) -> None:
    for i in range(3):   # the first through the head, which lends its worker
        assert get(h.identity.remote(i)) == i


def test_tasks_after_the_first_go_straight_to_a_lent_worker(cluster, gates, keep_loans):
    _lent(cluster)
    gate = gates()
    ref = h.gated.remote(gate, "v")
    gate.wait_started()
    assert not _head_sees(cluster, "_helpers.gated")
    gate.open()
    assert get(ref) == "v"
    assert get([h.add.remote(i, 1) for i in range(500)]) == list(range(1, 501))


def test_resources_are_free_as_soon_as_the_driver_has_nothing_running(cluster):
    total = orchestra.cluster_resources()
    get([h.identity.remote(i) for i in range(200)])
    assert orchestra.available_resources() == total   # lent workers went back for the query


def test_a_lent_workers_crash_retries_its_task_elsewhere(cluster, tmp_path, keep_loans):
    _lent(cluster)
    marker = str(tmp_path / "crashed")
    pid = get(exit_once.options(max_retries=1).remote(marker))
    assert os.path.exists(marker) and pid > 0
    assert get([h.add.remote(i, 1) for i in range(50)]) == list(range(1, 51))


def test_a_lent_workers_crash_without_retries_fails_naming_the_exit(cluster, tmp_path, keep_loans):
    _lent(cluster)
    with pytest.raises(WorkerCrashedError) as info:
        get(exit_once.options(max_retries=0).remote(str(tmp_path / "crashed")))
    assert "exit code 3" in str(info.value)
    assert get(h.identity.remote(5)) == 5


@pytest.mark.parametrize("force", [False, True])
def test_cancel_of_a_task_on_a_lent_worker(cluster, gates, keep_loans, force):
    _lent(cluster)
    gate = gates()
    ref = h.gated.remote(gate)
    gate.wait_started()
    assert not _head_sees(cluster, "_helpers.gated")
    orchestra.cancel(ref, force=force)
    with pytest.raises(TaskCancelledError):
        get(ref)
    assert get([h.identity.remote(i) for i in range(20)]) == list(range(20))


def test_a_quick_task_does_not_wait_behind_a_long_one_on_lent_workers(cluster, keep_loans):
    _lent(cluster)
    slow = sleep_then.remote(3.0, "slow")
    quick = [sleep_then.remote(0.01, i) for i in range(6)]
    start = time.monotonic()
    assert get(quick) == list(range(6))
    took = time.monotonic() - start
    assert get(slow) == "slow"
    assert took < 2.5, f"quick tasks waited {took:.1f} s behind the slow one"


def test_tasks_that_fan_out_from_lent_workers_finish(cluster, keep_loans):
    _lent(cluster)
    # Each runs on a lent worker and blocks in get() on subtasks the head must place:
    # lent CPUs come back and the head takes the lent workers back when it needs them.
    assert get([fan_out.remote(5) for _ in range(8)]) == [10] * 8


@orchestra.remote
def boom() -> None:
    raise ValueError("boom")


def test_a_direct_call_whose_argument_failed_fails_with_its_error_without_running(
        cluster, tmp_path, keep_loans):
    _lent(cluster)
    a = Keeper.remote()
    get(a.append.remote(0))
    bad = boom.remote()
    with pytest.raises(ValueError, match="boom"):
        get(bad)   # now here: the calls below go straight, with the error as their argument
    marker = tmp_path / "ran"
    with pytest.raises(ValueError, match="boom"):
        get(h.touch_marker.remote(str(marker), bad))
    with pytest.raises(ValueError, match="boom"):
        get(a.append.remote(bad))
    assert not marker.exists()
    assert get(a.items_so_far.remote()) == [0]


def test_a_late_steal_takes_back_only_the_tasks_its_sender_sent(start_cluster, gates):
    """A driver's STEAL can reach a worker late: after the tasks it names came back to
    the driver, went through the head, and the head queued them on that same worker.
    The worker hands a caller back only what that caller sent there: the head's tasks
    stay and run (handed to the caller, which had forgotten them, they were lost and
    the head waited for them forever)."""
    # One worker, and no worker lent to this driver: the head places both tasks below.
    cluster = start_cluster(num_cpus=1)
    gate = gates()
    # Through the head (retried on exceptions: never sent straight)...
    running = h.gated.options(retry_exceptions=True).remote(gate, "ran")
    gate.wait_started()
    # ... and one the head queues behind it on the same worker.
    queued = h.identity.options(retry_exceptions=True).remote("queued")
    tid = _ids.task_of(queued._id)
    where: list[int] = []

    def queued_on_a_worker() -> bool:
        where[:] = [w.workerid for w in cluster.debug().workers if tid in w.running]
        return bool(where)

    wait_until(queued_on_a_worker, T, "the head queues the task behind a running one")
    path = os.path.join(cluster.session_dir, f"worker-{where[0]}.sock")
    decoder = _wire.FrameDecoder()
    frames: list[Any] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(T)
        # As a driver the worker was lent to. The head sent the task there before it
        # answered the query above, and a worker reads the head's frames first.
        sock.connect(path)
        sock.sendall(_wire.encode(_wire.STEAL, pb.ReturnTasks(task_ids=[tid])))
        while not frames:
            data = sock.recv(1 << 16)
            assert data, "the worker closed the connection instead of answering the STEAL"
            frames = decoder.feed(data)
    assert [(kind, list(msg.task_ids)) for kind, msg in frames] == [(_wire.RETURN_TASKS, [])]
    gate.open()
    assert get([running, queued]) == ["ran", "queued"]
