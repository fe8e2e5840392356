"""Failures on a real local cluster: exceptions in tasks, worker crashes, cancel.

Crash and force-cancel tests start a cluster of their own: they kill worker processes.
"""
from __future__ import annotations

import os
import time

import pytest

import _helpers as h
import orchestra
from _probes import pid_gone, wait_until
from orchestra.exceptions import ActorDiedError, TaskCancelledError, TaskError, WorkerCrashedError

pytestmark = pytest.mark.timeout(60)

T = 30


# ------------------------------------------------------------------ exceptions in tasks

def test_an_exception_in_a_task_raises_task_error_at_get(cluster):
    with pytest.raises(TaskError):
        orchestra.get(h.raise_value_error.remote("bad input"), timeout=T)


def test_the_task_error_is_also_an_instance_of_the_original_class(cluster):
    ref = h.raise_value_error.remote("bad input")
    try:
        orchestra.get(ref, timeout=T)
    except ValueError as err:   # `except ValueError` catches the remote ValueError
        assert isinstance(err, TaskError)
        assert isinstance(err.cause, ValueError)
    else:
        pytest.fail("get() did not raise")


def test_the_task_error_carries_the_message_and_the_remote_traceback(cluster):
    with pytest.raises(TaskError) as info:
        orchestra.get(h.raise_value_error.remote("bad input 1234"), timeout=T)
    err = info.value
    assert "bad input 1234" in str(err)
    assert "raise_value_error" in str(err)
    assert "Traceback" in err.traceback_str and "raise ValueError(message)" in err.traceback_str
    assert err.traceback_str in str(err)
    assert err.pid != os.getpid() and err.pid > 0


def test_an_exception_class_with_its_own_constructor_is_kept(cluster):
    with pytest.raises(h.CustomError) as info:
        orchestra.get(h.raise_custom_error.remote(42), timeout=T)
    assert isinstance(info.value, TaskError)
    assert info.value.cause.code == 42
    assert "code 42: custom detail" in str(info.value)


def test_an_exception_pickle_cannot_rebuild_still_raises_task_error_with_its_text(cluster):
    pids = set(cluster.worker_pids())
    with pytest.raises(TaskError) as info:
        orchestra.get(h.raise_unrebuildable_error.remote(42), timeout=T)
    assert "UnrebuildableError: code 42: custom detail" in str(info.value)
    assert set(cluster.worker_pids()) == pids   # reported as an error, not a crash


def test_an_unpicklable_return_value_raises_at_get_naming_it(cluster):
    with pytest.raises(TaskError, match="lock"):
        orchestra.get(h.return_unpicklable.options(max_retries=0).remote(), timeout=T)


def test_an_error_propagates_to_dependent_tasks_without_running_them(cluster, tmp_path):
    failed = h.raise_value_error.remote("upstream")
    marker = str(tmp_path / "downstream-ran")
    downstream = h.touch_marker.remote(marker, failed)
    further = h.touch_marker.remote(marker, downstream)
    for ref in (downstream, further):
        with pytest.raises(ValueError, match="upstream"):
            orchestra.get(ref, timeout=T)
    assert not os.path.exists(marker)


def test_an_error_propagates_to_a_task_submitted_before_the_failure(cluster, gates, tmp_path):
    gate = gates()
    upstream = h.gated.remote(gate)
    failed = h.raise_value_error.remote("late failure")
    marker = str(tmp_path / "downstream-ran")
    downstream = h.touch_marker.remote(marker, failed, upstream)   # waits for both
    with pytest.raises(ValueError, match="late failure"):
        orchestra.get(failed, timeout=T)
    gate.open()
    with pytest.raises(ValueError, match="late failure"):
        orchestra.get(downstream, timeout=T)
    assert not os.path.exists(marker)


def test_an_error_a_task_lets_escape_from_its_subtask_keeps_the_original_class(cluster):
    @orchestra.remote(max_retries=0)
    def outer() -> None:
        orchestra.get(h.raise_value_error.remote("two tasks down"), timeout=T)

    with pytest.raises(ValueError, match="two tasks down") as info:
        orchestra.get(outer.remote(), timeout=T)
    assert isinstance(info.value, TaskError)
    assert "outer" in str(info.value) and "raise_value_error" in str(info.value)


def test_a_task_that_raises_is_not_retried_by_default(cluster, tmp_path):
    marker = str(tmp_path / "attempt")

    @orchestra.remote(max_retries=3)
    def fail_and_count(path: str) -> None:
        with open(path, "a") as f:
            f.write("x")
        raise RuntimeError("always")

    with pytest.raises(RuntimeError, match="always"):
        orchestra.get(fail_and_count.remote(marker), timeout=T)
    assert open(marker).read() == "x"


def test_retry_exceptions_reruns_a_task_that_raised(cluster, tmp_path):
    marker = str(tmp_path / "attempt")

    @orchestra.remote(max_retries=2, retry_exceptions=True)
    def fail_twice(path: str) -> int:
        with open(path, "a") as f:
            f.write("x")
        n = len(open(path).read())
        if n < 3:
            raise RuntimeError(f"attempt {n}")
        return n

    assert orchestra.get(fail_twice.remote(marker), timeout=T) == 3


@pytest.mark.parametrize("raised, attempts", [(ValueError, 3), (KeyError, 1)])
def test_retry_exceptions_with_classes_reruns_only_those(cluster, tmp_path, raised, attempts):
    marker = str(tmp_path / "attempt")

    @orchestra.remote(max_retries=2, retry_exceptions=[ValueError, TimeoutError])
    def fail_and_count(path: str, kind: type[Exception]) -> None:
        with open(path, "a") as f:
            f.write("x")
        raise kind("always")

    with pytest.raises(TaskError) as info:
        orchestra.get(fail_and_count.remote(marker, raised), timeout=T)
    assert isinstance(info.value, raised)
    assert open(marker).read() == "x" * attempts


@pytest.mark.parametrize("bad", ["yes", [ValueError, "KeyError"], [], [int]])
def test_retry_exceptions_rejects_what_is_not_a_bool_or_exception_classes(cluster, bad):
    with pytest.raises(ValueError, match="retry_exceptions must be True, False or a list"):
        h.add.options(retry_exceptions=bad)


# ------------------------------------------------------------------ worker crashes

@pytest.mark.parametrize("how, cause", [
    ("exit", "exit code 3"),
    ("sigkill", "SIGKILL"),
    ("segfault", "SIGSEGV"),
])
def test_a_worker_that_dies_mid_task_gives_worker_crashed_error(start_cluster, how, cause):
    start_cluster(num_cpus=1)
    with pytest.raises(WorkerCrashedError) as info:
        orchestra.get(h.crash.remote(how), timeout=T)
    message = str(info.value)
    assert cause in message
    assert "crash" in message and "max_retries" in message   # names the remedy


@orchestra.remote(max_retries=0)
def _last_words() -> None:
    import sys
    print("said on stdout before the end", flush=True)
    print("a line of before", file=sys.stderr, flush=True)
    print("fatal: the config at /etc/x is unreadable", file=sys.stderr, flush=True)
    os._exit(3)


@orchestra.remote(max_restarts=0)
class _DiesTalking:
    def die(self) -> None:
        import sys
        print("actor: giving up", file=sys.stderr, flush=True)
        os._exit(4)


def test_a_crashed_workers_last_lines_on_stderr_are_in_its_error(start_cluster, capfd):
    """A task that prints to stderr and calls os._exit: its lines went to its log file
    but not (in time) to its driver, and the error said only 'exit code 3'; now the
    error carries what it last wrote to stderr (that task's, not an earlier one's)."""
    start_cluster(num_cpus=1)
    with pytest.raises(WorkerCrashedError) as info:
        orchestra.get(_last_words.remote(), timeout=T)
    message = str(info.value)
    assert "exit code 3" in message and "its last lines on stderr: " \
        "'a line of before' / 'fatal: the config at /etc/x is unreadable'" in message, message
    assert "said on stdout" not in message
    # What it printed before os._exit reached the driver too (it waited to be batched).
    out = capfd.readouterr().out
    assert "said on stdout before the end" in out, out
    a = _DiesTalking.remote()
    with pytest.raises(ActorDiedError) as died:
        orchestra.get(a.die.remote(), timeout=T)
    assert "'actor: giving up'" in str(died.value) and "exit code 4" in str(died.value)


def test_the_cluster_keeps_working_after_a_worker_crash(start_cluster):
    c = start_cluster(num_cpus=1)
    before = set(c.worker_pids())
    with pytest.raises(WorkerCrashedError):
        orchestra.get(h.crash.remote("sigkill"), timeout=T)
    assert orchestra.get(h.add.remote(1, 2), timeout=T) == 3
    assert all(pid_gone(p) for p in before)
    assert set(c.worker_pids()).isdisjoint(before)


def test_a_crashing_task_is_retried_then_fails(start_cluster, tmp_path):
    start_cluster(num_cpus=1)
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    with pytest.raises(WorkerCrashedError, match="attempts made: 3"):
        orchestra.get(h.count_attempts_and_crash.options(max_retries=2).remote(str(attempts)),
                      timeout=T)
    assert len(os.listdir(attempts)) == 3


def test_a_task_that_crashes_only_on_its_first_attempt_succeeds_on_retry(start_cluster, tmp_path):
    start_cluster(num_cpus=1)
    ref = h.crash_on_first_attempt.remote(str(tmp_path / "crashed-once"))
    assert orchestra.get(ref, timeout=T) == "second attempt"


def test_tasks_queued_behind_a_crash_still_run(start_cluster):
    # With one worker, the quick tasks are pipelined to the worker that will die; they
    # never started there, so they run elsewhere without spending a retry.
    start_cluster(num_cpus=1)
    crashed = h.crash.remote("exit")
    after = [h.add.options(max_retries=0).remote(i, 1) for i in range(5)]
    with pytest.raises(WorkerCrashedError):
        orchestra.get(crashed, timeout=T)
    assert orchestra.get(after, timeout=T) == [1, 2, 3, 4, 5]


def test_a_worker_crash_in_a_nested_task_reaches_the_outer_task(start_cluster):
    start_cluster(num_cpus=2)

    @orchestra.remote(max_retries=0)
    def outer() -> str:
        try:
            orchestra.get(h.crash.remote("exit"), timeout=T)
        except WorkerCrashedError as err:
            return f"caught: {err}"
        return "no error"

    assert orchestra.get(outer.remote(), timeout=T).startswith("caught: ")


# ------------------------------------------------------------------ cancel

def _assert_cancelled(ref: orchestra.ObjectRef) -> None:
    with pytest.raises(TaskCancelledError, match="cancel"):
        orchestra.get(ref, timeout=T)


@pytest.mark.parametrize("where", ["pipelined-to-a-busy-worker", "in-the-scheduler-queue"])
def test_cancel_a_queued_task(cluster, gates, tmp_path, where):
    blockers = [h.gated.remote(gates(f"b{i}")) for i in range(2)]
    for i in range(2):
        gates(f"b{i}").wait_started()
    marker = str(tmp_path / "queued-ran")
    # Same resource shape as the blockers: pipelined into a worker's own queue; another
    # shape waits in the scheduler for a free worker.
    opts = {} if where == "pipelined-to-a-busy-worker" else {"num_cpus": 2}
    queued = h.touch_marker.options(**opts).remote(marker)
    orchestra.cancel(queued)
    _assert_cancelled(queued)
    for i in range(2):
        gates(f"b{i}").open()
    orchestra.get(blockers, timeout=T)
    assert orchestra.get(h.add.options(**opts).remote(1, 1), timeout=T) == 2
    assert not os.path.exists(marker)


@pytest.mark.parametrize("task", ["sleep_loop", "one_long_sleep", "blocked_in_io", "busy_loop"])
def test_cancel_a_running_task(cluster, gates, task):
    gate = gates()
    ref = getattr(h, task).remote(gate)
    gate.wait_started()
    pids = set(cluster.worker_pids())
    start = time.monotonic()
    orchestra.cancel(ref)
    _assert_cancelled(ref)
    assert time.monotonic() - start < 5
    # A cooperative cancel keeps the worker: the same processes serve the next task.
    assert orchestra.get(h.add.remote(1, 2), timeout=T) == 3
    assert set(cluster.worker_pids()) == pids


def test_cancelled_task_error_is_an_orchestra_error(cluster, gates):
    gate = gates()
    ref = h.sleep_loop.remote(gate)
    gate.wait_started()
    orchestra.cancel(ref)
    with pytest.raises(orchestra.exceptions.OrchestraError):
        orchestra.get(ref, timeout=T)


@pytest.mark.timeout(90)
def test_cancel_a_task_while_it_sends_keeps_its_worker_and_the_cluster_working(start_cluster,
                                                                                gates):
    # The cancel lands inside the client's sendall: raised there, it cut a frame in half,
    # the head waited for the rest, and the task never finished.
    start_cluster(num_cpus=2)
    for i in range(3):
        gate = gates(f"sender{i}")
        ref = h.submit_large_calls.remote(gate)
        gate.wait_started()
        pid = int(open(gate.started).read())
        orchestra.cancel(ref)
        _assert_cancelled(ref)
        assert not pid_gone(pid)
        assert orchestra.get(h.add.remote(i, 1), timeout=T) == i + 1


def test_cancel_with_force_kills_the_worker(start_cluster, gates):
    c = start_cluster(num_cpus=1)
    gate = gates()
    ref = h.uninterruptible_sleep.remote(gate)
    gate.wait_started()
    [victim] = c.worker_pids()
    orchestra.cancel(ref, force=True)
    _assert_cancelled(ref)
    wait_until(lambda: pid_gone(victim), 5, f"worker {victim} killed")
    assert orchestra.get(h.add.remote(2, 2), timeout=T) == 4   # a new worker replaced it


def test_cancel_a_task_waiting_for_its_dependencies(cluster, gates, tmp_path):
    gate = gates()
    upstream = h.gated.remote(gate, "upstream value")
    marker = str(tmp_path / "dependent-ran")
    dependent = h.touch_marker.remote(marker, upstream)
    orchestra.cancel(dependent)
    _assert_cancelled(dependent)
    gate.open()
    assert orchestra.get(upstream, timeout=T) == "upstream value"
    assert not os.path.exists(marker)


def test_cancel_a_task_blocked_in_get(cluster, gates):
    gate = gates()

    @orchestra.remote(max_retries=0)
    def waits_for(inner: list) -> str:
        orchestra.get(inner[0], timeout=T)
        return "not cancelled"

    inner = h.gated.remote(gate)
    outer = waits_for.remote([inner])
    gate.wait_started()
    wait_until(lambda: any(w.state == "blocked" for w in cluster.debug().workers), 10,
               "the outer task blocks in get()")
    orchestra.cancel(outer)
    _assert_cancelled(outer)
    gate.open()
    assert orchestra.get(inner, timeout=T) is None


def test_cancelling_a_finished_task_does_nothing(cluster):
    ref = h.add.remote(20, 22)
    assert orchestra.get(ref, timeout=T) == 42
    orchestra.cancel(ref)
    orchestra.cancel(ref, force=True)
    assert orchestra.get(ref, timeout=T) == 42
    assert orchestra.get(h.add.remote(1, 1), timeout=T) == 2


def test_cancelling_a_failed_task_keeps_its_error(cluster):
    ref = h.raise_value_error.remote("original")
    with pytest.raises(ValueError):
        orchestra.get(ref, timeout=T)
    orchestra.cancel(ref)
    with pytest.raises(ValueError, match="original"):
        orchestra.get(ref, timeout=T)


def test_cancelling_a_put_does_nothing(cluster):
    ref = orchestra.put("kept")
    orchestra.cancel(ref)
    assert orchestra.get(ref, timeout=T) == "kept"


def test_cancel_takes_an_object_ref(cluster):
    with pytest.raises(TypeError, match="ObjectRef"):
        orchestra.cancel("not a ref")
