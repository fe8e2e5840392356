"""Hardening: no silent hangs, the cluster's lifetime, and smaller defects.

    failure                                  what the user gets
    ---------------------------------------  ---------------------------------------------
    a worker's frame handling raises         the worker exits: its task fails as a crash
                                             (WorkerCrashedError), queued tasks run elsewhere
    init() from a thread that then ends      the cluster lives as long as the driver process
    the head dies                            every blocked and later call: ClusterLostError;
                                             is_initialized() False; init() works again
    many threads submit, nest, call, put     every ref becomes ready (stress, 6 s in the
                                             suite; ORCHESTRA_STRESS_S sets the length)
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest

import _helpers as h
import orchestra
from _probes import pid_gone, wait_until
from orchestra.exceptions import ClusterLostError, TaskCancelledError, TaskError, WorkerCrashedError

T = 30


# ------------------------------------------------------------------ no silent hangs

@orchestra.remote(max_retries=0)
def break_frame_handling(gate: h.Gate) -> int:
    """Make this worker's next frame raise in orchestra's own handler, then wait."""
    from orchestra._runtime import context as _context
    from orchestra._worker.frames import HEAD_FRAMES

    def broken(*args: Any) -> None:
        raise RuntimeError("a fault injected into the worker's frame handling")

    client = _context.client_or_none()
    for kind in HEAD_FRAMES:   # the worker's own kinds: EXECUTE, CANCEL_TASK, ...
        client.handlers[kind] = broken
    client.direct.on_peer_frame = broken
    h.touch(gate.started)
    h.wait_for_file(gate.opened, 30)
    return os.getpid()


@pytest.mark.timeout(90)
def test_a_worker_whose_frame_handling_raises_exits_and_its_tasks_run_elsewhere(start_cluster, gates):
    start_cluster(num_cpus=1)
    gate = gates("broken")
    broken = break_frame_handling.remote(gate)
    gate.wait_started()
    # Sent to the only worker while its task runs (queued there, or straight to it): its
    # reader thread meets the fault. It used to die there, the frame with it, and this
    # task waited forever on a live worker that no longer read.
    later = h.identity.remote(5)
    assert orchestra.get(later, timeout=T) == 5
    with pytest.raises(WorkerCrashedError, match="exit code 1"):
        orchestra.get(broken, timeout=T)


@orchestra.remote
class Accumulator:
    def __init__(self) -> None:
        self.total = 0

    def add(self, k: int) -> int:
        self.total += k
        return k

    def nested(self, n: int) -> int:
        """An actor call that submits tasks and waits for them."""
        return sum(orchestra.get([h.add.remote(i, 1) for i in range(n)], timeout=60))


def _cluster_state() -> str:
    """What the head knows of unfinished tasks and of its workers, for a failure message."""
    from orchestra._api import session as _session
    d = _session.debug_info()
    tasks = [f"{t.name or t.method}:{t.task_id.hex()}" for t in d.task]
    workers = [f"{w.workerid}/{w.pid}/{w.state}:{[r.hex() for r in w.running]}"
               for w in d.workers]
    return f"unfinished tasks at the head: {tasks}; workers: {workers}"


STRESS_S = float(os.environ.get("ORCHESTRA_STRESS_S", "6"))


@pytest.mark.load
@pytest.mark.timeout(STRESS_S + 150)
def test_stress_threads_submitting_nesting_calling_and_putting_see_every_ref_ready(start_cluster):
    """8 threads submit tasks, nested tasks and actor calls and wait on them, 3 threads
    put and get, for STRESS_S seconds: every ref becomes ready with the right value."""
    start_cluster(num_cpus=2)
    actors = [Accumulator.remote(), Accumulator.remote()]
    deadline = time.monotonic() + STRESS_S
    errors: list[str] = []
    rounds: dict[str, int] = {}

    def check(name: str, what: str, got: Any, want: Any) -> None:
        if got != want:
            errors.append(f"{name}: {what} gave {got!r}, not {want!r}")

    def submitter(i: int) -> None:
        name = f"submitter-{i}"
        n = 0
        try:
            while time.monotonic() < deadline and not errors:
                kind = (n + i) % 4
                if kind == 0:
                    refs = [h.add.remote(j, i) for j in range(20)]
                    check(name, "tasks", orchestra.get(refs, timeout=60), [j + i for j in range(20)])
                elif kind == 1:
                    refs = [h.submit_and_get.remote(4) for _ in range(3)]
                    ready, rest = orchestra.wait(refs, num_returns=3, timeout=60)
                    if rest:
                        errors.append(f"{name}: {len(rest)} nested tasks not ready after 60 s "
                                      f"({[r.hex() for r in rest]}); {_cluster_state()}")
                    check(name, "nested", orchestra.get(ready, timeout=60), [[100, 101, 102, 103]] * 3)
                elif kind == 2:
                    a = actors[n % 2]
                    refs = [a.add.remote(k) for k in range(10)]
                    check(name, "actor calls", orchestra.get(refs, timeout=60), list(range(10)))
                else:
                    ref = actors[(n + 1) % 2].nested.remote(3)
                    check(name, "nested actor call", orchestra.get(ref, timeout=60), 6)
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(f"{name} after {n} rounds: {type(exc).__name__}: {exc}")
        rounds[name] = n

    def putter(i: int) -> None:
        name = f"putter-{i}"
        rng = np.random.default_rng(i)
        n = 0
        try:
            while time.monotonic() < deadline and not errors:
                size = int(rng.choice([10, 1000, 50_000, 300_000]))   # inline and shared memory
                value = rng.integers(0, 1 << 30, size)
                ref = orchestra.put(value)
                if not np.array_equal(orchestra.get(ref, timeout=60), value):
                    errors.append(f"{name}: get of a put array of {size} gave other values")
                if n % 5 == 0:
                    check(name, "a task reading a put", orchestra.get(h.array_sum.remote(ref), timeout=60),
                          float(value.sum()))
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(f"{name} after {n} rounds: {type(exc).__name__}: {exc}")
        rounds[name] = n

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(8)]
    threads += [threading.Thread(target=putter, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(STRESS_S + 120)
    assert not [t.name for t in threads if t.is_alive()], "threads still waiting on refs"
    assert not errors, "\n".join(errors)
    print(f"stress rounds in {STRESS_S:g} s: {rounds}")
    assert all(n > 0 for n in rounds.values()), rounds
    # The cluster is still whole: a trivial task runs.
    assert orchestra.get(h.identity.remote("after"), timeout=T) == "after"


# ------------------------------------------------------------------ lifetime

@pytest.mark.timeout(60)
def test_a_cluster_started_from_a_thread_that_ends_lives_on(no_cluster):
    infos: list[dict[str, Any]] = []
    t = threading.Thread(target=lambda: infos.append(orchestra.init(num_cpus=1)))
    t.start()
    t.join(T)
    assert infos, "init() in a thread did not return"
    # The head's parent-death signal followed the thread: it died ~1.5 s after the
    # thread ended, and the cluster with it.
    time.sleep(3)
    assert orchestra.is_initialized()
    assert orchestra.get(h.identity.remote(7), timeout=T) == 7


@pytest.mark.timeout(90)
def test_when_the_head_dies_every_call_raises_cluster_lost_and_init_works_again(start_cluster, gates):
    c = start_cluster(num_cpus=1)
    gate = gates("held")
    blocked = h.gated.remote(gate, "never")
    gate.wait_started()
    ref = orchestra.put(np.arange(10))
    errors: list[BaseException] = []

    def blocked_get() -> None:
        try:
            orchestra.get(blocked, timeout=60)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            errors.append(exc)

    waiter = threading.Thread(target=blocked_get)
    waiter.start()
    time.sleep(0.2)
    killed = time.monotonic()
    os.kill(c.head_pid, signal.SIGKILL)
    waiter.join(10)
    assert not waiter.is_alive(), "a get blocked when the head died did not return"
    assert time.monotonic() - killed < 5
    assert len(errors) == 1 and isinstance(errors[0], ClusterLostError), errors
    assert "head process exited" in str(errors[0]) and "orchestra.init()" in str(errors[0])
    # Every later call raises the same public error, at once.
    calls = {
        "get": lambda: orchestra.get(ref, timeout=5),
        "put": lambda: orchestra.put(1),
        "remote": lambda: h.identity.remote(1),
        "wait": lambda: orchestra.wait([ref], timeout=5),
        "cluster_resources": orchestra.cluster_resources,
    }
    for name, call in calls.items():
        with pytest.raises(ClusterLostError):
            call()
            pytest.fail(f"{name}() after the head died did not raise")
    assert not orchestra.is_initialized()
    # A new cluster, no shutdown() first.
    c2 = start_cluster(num_cpus=1)
    assert c2.head_pid != c.head_pid
    assert orchestra.get(h.identity.remote(3), timeout=T) == 3
    assert not os.path.exists(c.session_dir), "the dead session's directory was left behind"
    wait_until(lambda: pid_gone(c.head_pid), 10, "the killed head is gone")


@pytest.mark.timeout(60)
def test_a_head_stopped_by_a_signal_says_so_in_every_later_error(start_cluster, gates):
    c = start_cluster(num_cpus=1)
    gate = gates("held")
    blocked = h.gated.remote(gate, "never")
    gate.wait_started()
    os.kill(c.head_pid, signal.SIGTERM)   # e.g. a system shutting down
    with pytest.raises(ClusterLostError, match=r"head process stopped \(signal SIGTERM\)"):
        orchestra.get(blocked, timeout=30)
    with pytest.raises(ClusterLostError, match=r"signal SIGTERM.*orchestra.init\(\)"):
        orchestra.put(1)
    assert not orchestra.is_initialized()


# ------------------------------------------------------------------ smaller defects

@pytest.mark.parametrize("timeout", [float("nan"), -1.0])
def test_get_and_wait_reject_a_timeout_that_is_not_a_duration(cluster, timeout):
    ref = orchestra.put(1)
    for call in (lambda: orchestra.get(ref, timeout=timeout),
                 lambda: orchestra.wait([ref], timeout=timeout)):
        with pytest.raises(ValueError, match="timeout must be None or a number of seconds"):
            call()


def test_an_infinite_timeout_waits_without_a_limit(cluster):
    ref = h.identity.remote(4)
    assert orchestra.get(ref, timeout=float("inf")) == 4
    assert orchestra.wait([ref], timeout=float("inf")) == ([ref], [])


def test_wait_for_more_refs_than_given_raises_naming_both(cluster):
    refs = [orchestra.put(1)]
    with pytest.raises(ValueError, match=r"between 1 and len\(refs\)=1, got 2"):
        orchestra.wait(refs, num_returns=2)


@pytest.mark.timeout(60)
def test_connecting_to_another_users_session_says_permission_denied(cluster):
    """A process of another uid (forked, then setuid) connects to this session."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a process as another user")
    import warnings
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # fork with threads: the child
        pid = os.fork()                                       # only stats and raises
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(_OTHER_UID)
            os.setuid(_OTHER_UID)
            from orchestra._api import session as _session
            from orchestra._runtime import context as _context
            _session._session = None
            _context.set_client(None)
            try:
                orchestra.init(address=cluster.session_dir)
                msg = "connected"
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                msg = f"{type(exc).__name__}: {exc}"
            os.write(w, msg.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    os.waitpid(pid, 0)
    assert msg.startswith("PermissionError: permission denied"), msg
    assert "belongs to user 'root'" in msg and f"uid {_OTHER_UID}" in msg, msg


_OTHER_UID = 54321   # no such user needed: a uid that owns nothing here


@orchestra.remote
class AsyncSleeper:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def sleep(self, gate: h.Gate) -> str:
        import asyncio
        h.touch(gate.started)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.seen.append("CancelledError")
            raise
        return "finished"

    async def seen_so_far(self) -> list[str]:
        return self.seen


@orchestra.remote(max_concurrency=2)
class ThreadedSleeper:
    def sleep(self, gate: h.Gate) -> str:
        h.touch(gate.started)
        h.wait_for_file(gate.opened, 30)
        return "finished"

    def ping(self) -> str:
        return "pong"


def _cancel_once_running(actor: Any, gate: h.Gate) -> orchestra.ObjectRef:
    ref = actor.sleep.remote(gate)
    gate.wait_started()
    orchestra.cancel(ref)
    return ref


@pytest.mark.timeout(60)
def test_cancel_of_a_running_call_on_an_async_actor_cancels_its_coroutine(cluster, gates):
    a = AsyncSleeper.remote()
    ref = _cancel_once_running(a, gates("async"))   # the first call: through the head
    with pytest.raises(TaskCancelledError) as info:
        orchestra.get(ref, timeout=T)
    # Also a TaskError caused by the coroutine's CancelledError (Ray's RayTaskError).
    assert isinstance(info.value, TaskError) and isinstance(info.value.cause, asyncio.CancelledError)
    assert "while it ran" in str(info.value) and "sleep" in info.value.traceback_str
    assert orchestra.get(a.seen_so_far.remote(), timeout=T) == ["CancelledError"]
    ref = _cancel_once_running(a, gates("async-direct"))   # later calls go straight to it
    with pytest.raises(TaskError) as info:
        orchestra.get(ref, timeout=T)
    assert isinstance(info.value, TaskCancelledError)
    orchestra.kill(a)


@pytest.mark.timeout(60)
def test_cancel_of_a_running_call_on_a_threaded_actor_drops_its_result(cluster, gates):
    a = ThreadedSleeper.remote()
    assert orchestra.get(a.ping.remote(), timeout=T) == "pong"   # later calls go direct
    gate = gates("threaded")
    ref = _cancel_once_running(a, gate)
    # A call after the cancel, on the same connection: once it answers, the actor has
    # seen the cancel (else the call could end before the cancel arrives, on a busy machine).
    assert orchestra.get(a.ping.remote(), timeout=T) == "pong"
    gate.open()
    with pytest.raises(TaskCancelledError):
        orchestra.get(ref, timeout=T)
    assert orchestra.get(a.ping.remote(), timeout=T) == "pong"   # the actor serves on
    orchestra.kill(a)
