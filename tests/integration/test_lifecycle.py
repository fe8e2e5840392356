"""Session lifecycle on a real local cluster: init, shutdown, what workers inherit from
the driver, and what a dead driver leaves behind (nothing)."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import _helpers as h
import orchestra
from _probes import pid_gone, shm_dirs_of, shm_entries_of, wait_until
from orchestra._platform.procutil import proc_stat

pytestmark = pytest.mark.timeout(60)

T = 30
# The orchestra this test imports (the source tree, or the installed wheel under tox).
ORCHESTRA_ROOT = str(Path(orchestra.__file__).resolve().parents[1])


def _segments_of(head_pid: int) -> list[str]:
    """The session's directory under /dev/shm and the segments in it."""
    return shm_entries_of(head_pid)


# ------------------------------------------------------------------ init / shutdown

def test_init_returns_the_session_and_its_resources(no_cluster):
    info = orchestra.init(num_cpus=1, num_gpus=1, resources={"widget": 2},
                          object_store_memory=64 << 20)
    assert orchestra.is_initialized()
    assert os.path.isdir(info["session_dir"])
    memory = info["node_resources"].pop("memory")   # bytes of RAM tasks may ask for (memory=)
    assert info["node_resources"].pop("node:__internal_head__") == 1.0   # as Ray's head
    assert info["node_resources"].pop("node:127.0.0.1") == 1.0           # its address
    assert info["node_resources"] == {"CPU": 1.0, "GPU": 1.0, "widget": 2.0} and memory > 0
    assert info["object_store_memory"] == 64 << 20


def test_init_returns_with_a_worker_ready_for_the_first_task(no_cluster):
    orchestra.init(num_cpus=2)
    from orchestra._api.session import debug_info
    states = [w.state for w in debug_info().workers]
    assert "idle" in states, states


def test_init_twice_raises_unless_told_to_ignore_it(start_cluster):
    start_cluster(num_cpus=1)
    with pytest.raises(RuntimeError, match="shutdown"):
        orchestra.init(num_cpus=1)
    info = orchestra.init(num_cpus=1, ignore_reinit_error=True)
    assert os.path.isdir(info["session_dir"])


@pytest.mark.parametrize("kwargs, error", [
    ({"num_cpus": 1.5}, TypeError),
    ({"num_gpus": "2"}, TypeError),
    ({"object_store_memory": 0}, ValueError),
    ({"resources": {"CPU": 2}}, ValueError),
])
def test_init_rejects_bad_arguments(no_cluster, kwargs, error):
    with pytest.raises(error):
        orchestra.init(**kwargs)
    assert not orchestra.is_initialized()


def test_calls_before_init_start_a_local_cluster_as_in_ray(no_cluster, caplog):
    for call in (lambda: orchestra.put(1), lambda: h.identity.remote(1),
                 orchestra.available_resources):
        try:
            with caplog.at_level("WARNING", logger="orchestra"):
                call()
            assert orchestra.is_initialized()
            assert "orchestra.init() was not called: starting a local cluster" in caplog.text
        finally:
            orchestra.shutdown()
        caplog.clear()


def test_shutdown_without_init_and_twice_does_nothing(no_cluster):
    orchestra.shutdown()
    orchestra.init(num_cpus=1)
    orchestra.shutdown()
    orchestra.shutdown()
    assert not orchestra.is_initialized()


def test_init_inside_a_task_raises(cluster):
    @orchestra.remote(max_retries=0)
    def nested_init() -> None:
        orchestra.init(num_cpus=1)

    with pytest.raises(RuntimeError, match="inside a task"):
        orchestra.get(nested_init.remote(), timeout=T)


@pytest.mark.shared_machine
def test_shutdown_stops_every_process_and_removes_every_segment(start_cluster, gates):
    c = start_cluster(num_cpus=2)
    gate = gates()
    running = h.gated.remote(gate)   # a worker busy in a task is stopped too
    gate.wait_started()
    kept = [orchestra.put(np.ones(1 << 20)) for _ in range(3)]
    pids = [c.head_pid, *c.worker_pids()]
    assert len(pids) == 3 and c.segments()
    start = time.monotonic()
    orchestra.shutdown()
    wait_until(lambda: all(pid_gone(p) for p in pids) and not _segments_of(c.head_pid),
               2.0 - (time.monotonic() - start), f"processes {pids} gone, segments removed")
    assert not orchestra.is_initialized()
    del running, kept


@orchestra.remote(max_calls=1)
def start_children_once() -> list[int]:
    """Start a process and a multiprocessing pool (as joblib or loky would), return
    their pids; max_calls=1: the worker exits after this task."""
    import multiprocessing
    child = subprocess.Popen(["sleep", "300"])
    pool = multiprocessing.get_context("fork").Pool(2)
    pids = [child.pid, *(p.pid for p in pool._pool)]  # type: ignore[attr-defined]
    return pids


@orchestra.remote
def start_child() -> int:
    return subprocess.Popen(["sleep", "300"]).pid


def test_processes_a_task_started_exit_with_its_worker(start_cluster):
    # A worker leads a process group: what its tasks start goes when it exits (a
    # GridSearchCV(n_jobs=2) left loky's workers running for minutes under pid 1).
    start_cluster(num_cpus=1)
    pids = orchestra.get(start_children_once.remote(), timeout=T)
    assert len(pids) == 3
    wait_until(lambda: all(pid_gone(p) for p in pids), 10,
               "the task's processes to go with its worker")


def test_processes_tasks_started_exit_with_the_cluster(start_cluster):
    start_cluster(num_cpus=1)
    pid = orchestra.get(start_child.remote(), timeout=T)
    assert not pid_gone(pid)   # the worker lives: so does what its task started
    orchestra.shutdown()
    wait_until(lambda: pid_gone(pid), 10, "the task's process to go with the cluster")


def test_a_new_cluster_starts_after_shutdown(start_cluster):
    start_cluster(num_cpus=1)
    assert orchestra.get(h.add.remote(1, 1), timeout=T) == 2
    orchestra.shutdown()
    start_cluster(num_cpus=1)
    assert orchestra.get(h.add.remote(2, 2), timeout=T) == 4


def test_refs_of_a_finished_session_do_not_work_in_the_next(start_cluster):
    start_cluster(num_cpus=1)
    old = orchestra.put("old")
    orchestra.shutdown()
    start_cluster(num_cpus=1)
    start = time.monotonic()
    with pytest.raises(orchestra.exceptions.ObjectLostError, match="shut down"):
        orchestra.get(old, timeout=5)
    with pytest.raises(orchestra.exceptions.ObjectLostError):
        orchestra.wait([old], timeout=5)
    assert time.monotonic() - start < 1


# ------------------------------------------------------------------ a dead driver

_DRIVER = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import orchestra
    from orchestra._api import session as _session
    info = orchestra.init(num_cpus=2)
    ref = orchestra.put(np.ones(4 << 20))
    deadline = time.monotonic() + 30
    while sum(1 for w in _session.debug_info().workers if w.pid) < 2:
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.01)
    with open(info["session_dir"] + "/head.pid") as f:
        head = int(f.read())
    workers = [w.pid for w in _session.debug_info().workers if w.pid]
    print(json.dumps({"session_dir": info["session_dir"], "head": head,
                      "workers": workers}), flush=True)
    if sys.argv[1] == "block":
        sys.stdin.read()   # until killed
""")


def _start_driver(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], dict]:
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    env = {**os.environ, "PYTHONPATH": ORCHESTRA_ROOT}
    proc = subprocess.Popen([sys.executable, str(script), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    ready, _, _ = select.select([proc.stdout], [], [], T)
    if not ready:
        proc.kill()
        proc.wait()
        pytest.fail("the driver did not report its session in time")
    line = proc.stdout.readline()
    assert line, f"the driver exited early with code {proc.wait()}"
    return proc, json.loads(line)


def _assert_nothing_left(info: dict, timeout: float) -> None:
    pids = [info["head"], *info["workers"]]
    assert len(pids) == 3
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if not pid_gone(p)]
        segments = _segments_of(info["head"])
        if not alive and not segments:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"after {timeout:g} s: processes alive {alive} (head {info['head']}), "
                        f"segments left {segments}")
        time.sleep(0.01)


@pytest.mark.shared_machine
def test_killing_the_driver_with_sigkill_leaves_no_process_and_no_segment(no_cluster, tmp_path):
    proc, info = _start_driver(tmp_path, "block")
    assert _segments_of(info["head"])
    proc.send_signal(signal.SIGKILL)
    proc.wait(T)
    _assert_nothing_left(info, 10.0)
    # Nor its session directory: the head removes it as it stops (it stayed until the
    # next init() swept it).
    wait_until(lambda: not os.path.exists(info["session_dir"]), 10,
               "the killed driver's session directory removed")


@pytest.mark.shared_machine
def test_a_driver_that_exits_without_shutdown_leaves_nothing(no_cluster, tmp_path):
    proc, info = _start_driver(tmp_path, "exit")
    assert proc.wait(T) == 0
    _assert_nothing_left(info, 10.0)


@pytest.mark.shared_machine
def test_a_stale_session_directory_is_swept_by_the_next_init(no_cluster, tmp_path):
    proc, info = _start_driver(tmp_path, "block")
    proc.send_signal(signal.SIGKILL)
    proc.wait(T)
    _assert_nothing_left(info, 10.0)
    # The head may stay a zombie until PID 1 reaps it; the sweep needs it fully gone.
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{info['head']}"):
        if time.monotonic() > deadline:
            pytest.skip("PID 1 here does not reap orphaned processes")
        time.sleep(0.01)
    orchestra.init(num_cpus=1)
    assert not os.path.exists(info["session_dir"])


@pytest.mark.shared_machine
def test_the_segment_directory_of_a_killed_head_is_swept_by_the_next_init(no_cluster, tmp_path):
    proc, info = _start_driver(tmp_path, "block")
    (shm,) = shm_dirs_of(info["head"])
    os.kill(info["head"], signal.SIGKILL)   # no head left to remove its segments
    proc.send_signal(signal.SIGKILL)
    proc.wait(T)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{info['head']}"):
        if time.monotonic() > deadline:
            pytest.skip("PID 1 here does not reap orphaned processes")
        time.sleep(0.01)
    # Another session of this user on the machine may sweep them first: its init() does
    # what this one is about to (the dead head's directory is gone either way).
    try:
        left: list[str] | None = os.listdir(shm)
    except FileNotFoundError:
        left = None   # swept already
    if left == []:    # being swept now by another session's init(): it goes whole
        wait_until(lambda: not os.path.exists(shm), 10,
                   "the killed head's directory, found empty, removed by another sweep")
    orchestra.init(num_cpus=1)
    assert not os.path.exists(shm)


# ------------------------------------------------------------------ what workers inherit

def test_workers_see_the_drivers_working_directory_and_sys_path(cluster):
    env = orchestra.get(h.environment.remote(), timeout=T)
    assert env["cwd"] == os.getcwd()
    missing = [p for p in sys.path if p and os.path.isdir(p) and p not in env["sys_path"]]
    assert missing == []


def _has_numpy(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "_multiarray_umath" in f.read()


def _parent(pid: int) -> int:
    st = proc_stat(pid)
    assert st is not None, f"process {pid} is gone"
    return st.ppid


@orchestra.remote
def _square_sum(n: int) -> float:
    a = np.ones((n, n))
    return float((a @ a).sum())


def test_workers_started_later_have_the_drivers_numpy_already(start_cluster):
    # This driver has numpy (the module imports it): once the cluster is idle the fork
    # server imports it too, and a worker forked after that starts with it.
    c = start_cluster(num_cpus=1)
    (first,) = c.worker_pids()
    assert not _has_numpy(first)   # forked at init, before the fork server imported it
    server = _parent(first)
    wait_until(lambda: _has_numpy(server), 20, "the fork server imported numpy")
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: [p for p in c.worker_pids() if p != first], 20, "a new worker")
    (second,) = [p for p in c.worker_pids() if p != first]
    assert _parent(second) == server and _has_numpy(second)   # before any task ran there
    assert orchestra.get(_square_sum.remote(200), timeout=T) == 200.0 ** 3   # BLAS threads work


def test_a_worker_started_with_the_cluster_imports_the_drivers_numpy_when_idle(start_cluster):
    # Forked before the fork server imported numpy, it imports it itself in its first
    # idle moment a second after it started: not in the first task given an array.
    c = start_cluster(num_cpus=1)
    (first,) = c.worker_pids()
    assert not _has_numpy(first)
    wait_until(lambda: _has_numpy(first), 10, "the idle worker imported numpy")
    assert c.worker_pids() == [first]
    assert orchestra.get(_square_sum.remote(100), timeout=T) == 100.0 ** 3


_USERLIB = textwrap.dedent('''
    import os
    import sys

    import orchestra

    with open("data.txt") as f:   # relative: the worker must run in the driver's cwd
        DATA = f.read()


    class Point:
        def __init__(self, x):
            self.x = x


    @orchestra.remote
    def where():
        return {"cwd": os.getcwd(), "data": DATA, "imported": __name__ in sys.modules,
                "point": Point(3)}


    @orchestra.remote(max_retries=0)
    def fail():
        raise ValueError("raised in userlib")
''')


def test_functions_defined_in_the_users_modules_import_in_workers(start_cluster, tmp_path,
                                                                  monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "orchestra_userlib.py").write_text(_USERLIB)
    (tmp_path / "data.txt").write_text("payload")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.delitem(sys.modules, "orchestra_userlib", raising=False)
    import orchestra_userlib as userlib
    start_cluster(num_cpus=1)
    got = orchestra.get(userlib.where.remote(), timeout=T)
    assert got["cwd"] == str(tmp_path)
    assert got["data"] == "payload"
    assert got["imported"]   # the worker imported the module, not a copy of the function
    assert isinstance(got["point"], userlib.Point) and got["point"].x == 3
    with pytest.raises(ValueError) as info:
        orchestra.get(userlib.fail.remote(), timeout=T)
    tb = info.value.traceback_str
    assert "orchestra_userlib.py" in tb and 'raise ValueError("raised in userlib")' in tb
    monkeypatch.delitem(sys.modules, "orchestra_userlib")



# ------------------------------------------------------------------ repeated sessions, Ctrl-C

def _driver_resources() -> tuple[int, int]:
    import threading
    return len(os.listdir("/proc/self/fd")), threading.active_count()


_OTHER_SESSION = """
import sys
sys.path[:0] = {paths!r}
import numpy as np
import orchestra
orchestra.init(num_cpus=1)
ref = orchestra.put(np.ones(1 << 18))   # a segment of its own
print("ready", flush=True)
sys.stdin.read()                        # until the test closes it
orchestra.shutdown()
"""


@pytest.mark.load
@pytest.mark.timeout(120)
def test_ten_init_shutdown_cycles_leak_no_fd_thread_or_segment(no_cluster):
    orchestra.init(num_cpus=1)
    orchestra.get(h.identity.remote(1), timeout=T)
    orchestra.shutdown()
    heads = []
    # Another session of the same user runs meanwhile, started after the first count:
    # its segments are not this test's leak (counting every orchestra entry under
    # /dev/shm failed this test whenever another session was running).
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_SESSION.format(paths=[ORCHESTRA_ROOT, str(Path(__file__).parent)])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "ready"
        fds, threads = _driver_resources()   # its pipes counted
        for i in range(10):   # a leak of one a cycle shows in any number
            info = orchestra.init(num_cpus=1)
            with open(os.path.join(info["session_dir"], "head.pid")) as f:
                heads.append(int(f.read()))
            ref = orchestra.put(np.ones(1 << 18))   # a segment each time
            assert orchestra.get(h.identity.remote(i), timeout=T) == i
            del ref
            orchestra.shutdown()
        fds_after, threads_after = _driver_resources()
        assert fds_after <= fds, f"file descriptors grew from {fds} to {fds_after}"
        # Daemon threads of the last client may take a moment to finish.
        wait_until(lambda: _driver_resources()[1] <= threads, 5,
                   f"the driver's threads back to {threads} (now {_driver_resources()[1]})")
        left = [e for pid in heads for e in shm_entries_of(pid)]
        assert not left, f"segments left: {left}"
    finally:
        other.communicate("", timeout=30)
    assert other.returncode == 0


_CTRL_C_DRIVER = """
import sys, time
sys.path[:0] = {paths!r}
import orchestra
import _helpers as h
orchestra.init(num_cpus=1)
ref = h.sleep_then.remote(30, "late")
print("waiting", flush=True)
t = time.monotonic()
try:
    orchestra.get(ref, timeout=60)
except KeyboardInterrupt:
    print("interrupted after %.2f s" % (time.monotonic() - t), flush=True)
print("next", orchestra.get(h.identity.options(num_cpus=0).remote(7), timeout=30), flush=True)
orchestra.shutdown()
print("done", flush=True)
"""


def _ctrl_c_as_usual() -> None:
    """In the child before exec: a test run started in the background (``cmd &`` in a
    shell without job control) ignores SIGINT, and Python then keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_get_interrupts_it_promptly_and_the_cluster_stays_usable(no_cluster):
    here = str(Path(__file__).resolve().parent)
    script = _CTRL_C_DRIVER.format(paths=[ORCHESTRA_ROOT, here])
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_as_usual)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=T)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = out.splitlines()
    assert lines[0].startswith("interrupted after ")
    assert float(lines[0].split()[2]) < 5.0
    assert lines[1:] == ["next 7", "done"]


_UNCAUGHT_CTRL_C = """
import sys, time
sys.path[:0] = {paths!r}
import orchestra
import _helpers as h
orchestra.init(num_cpus=1, exit_grace_s=60)
ref = h.sleep_then.remote(60, "late")   # pending when the script ends
print("waiting", flush=True)
orchestra.get(ref, timeout=120)         # Ctrl-C here, not caught
"""


def test_an_uncaught_ctrl_c_ends_the_script_without_the_exit_grace(no_cluster):
    """A script ended by Ctrl-C does not wait its exit grace (60 s here) for the work it
    abandoned: the cluster stops at once, the task with it. Before, it waited the whole
    grace (5 s by default) for a task the user had just interrupted."""
    here = str(Path(__file__).resolve().parent)
    script = _UNCAUGHT_CTRL_C.format(paths=[ORCHESTRA_ROOT, here])
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_as_usual)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=T)   # T (30 s) is half the grace
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "KeyboardInterrupt" in err
    assert "still pending" not in err and "waiting up to" not in err


_SHUTDOWN_DRIVER = """
import json, signal, sys, threading, time
sys.path[:0] = {paths!r}
import numpy as np
import orchestra
import _helpers as h


@orchestra.remote
class Idle:
    def ping(self):
        return "pong"


info = orchestra.init(num_cpus=2)
kept = orchestra.put(np.ones(4 << 20))   # a segment
gate = h.Gate(sys.argv[1])
running = h.gated.remote(gate)           # a worker busy in a task
actors = [Idle.remote() for _ in range(3)]
assert orchestra.get([a.ping.remote() for a in actors], timeout=30) == ["pong"] * 3
gate.wait_started()
with open(info["session_dir"] + "/head.pid") as f:
    head = int(f.read())
print(json.dumps({{"session_dir": info["session_dir"], "head": head}}), flush=True)
sys.stdin.readline()                     # the test has paused the head: go


def say_when_shutdown_started():
    deadline = time.monotonic() + 30
    while orchestra.is_initialized() and time.monotonic() < deadline:
        time.sleep(0.001)
    print("in shutdown", flush=True)


threading.Thread(target=say_when_shutdown_started, daemon=True).start()
t = time.monotonic()
try:
    orchestra.shutdown()
    outcome = "returned"
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a press that comes after shutdown
    outcome = "interrupted"
print("%s after %.2f s" % (outcome, time.monotonic() - t), flush=True)
"""


def _readline(proc: subprocess.Popen[str], what: str) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], T)
    if not ready:
        pytest.fail(f"the driver did not report {what} within {T} s")
    line = proc.stdout.readline()
    assert line, f"the driver exited (code {proc.wait(T)}) before reporting {what}"
    return line.strip()


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_during_shutdown_cuts_its_wait_short_and_leaves_nothing(no_cluster, tmp_path,
                                                                       presses):
    # The head is paused (SIGSTOP), so shutdown() waits for it (up to 5 s) and the
    # Ctrl-Cs land inside shutdown for sure; a healthy head exits within ~0.1 s. A
    # KeyboardInterrupt raised there used to abandon the cleanup: the paused head, its
    # zygote and workers, the segments and the session directory all stayed.
    from orchestra._cli.microbenchmark import _children
    here = str(Path(__file__).resolve().parent)
    script = _SHUTDOWN_DRIVER.format(paths=[ORCHESTRA_ROOT, here])
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], preexec_fn=_ctrl_c_as_usual,
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        info = json.loads(_readline(proc, "its session"))
        head = info["head"]
        pids = [head, *_children(head)]   # the zygote, 2 pool workers, 3 actors
        assert len(pids) >= 7 and _segments_of(head) and os.path.isdir(info["session_dir"])
        os.kill(head, signal.SIGSTOP)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert _readline(proc, "that shutdown started") == "in shutdown"
        proc.send_signal(signal.SIGINT)
        if presses == 2:
            # The first Ctrl-C was handled once the head is killed; the second, sent at
            # once, lands while shutdown reaps the head and cleans up after it.
            deadline = time.monotonic() + 10
            while not pid_gone(head):
                assert time.monotonic() < deadline, "the first Ctrl-C stops waiting for the head"
                time.sleep(0.001)
            proc.send_signal(signal.SIGINT)
        # One KeyboardInterrupt, raised once everything is cleaned up; well before the
        # 5 s that shutdown would have waited for the paused head. (Not communicate():
        # processes left behind hold the driver's stdout open.)
        line = _readline(proc, "how shutdown ended")
        assert proc.wait(T) == 0
        assert line.startswith("interrupted after "), line
        assert float(line.split()[2]) < 3.0
        wait_until(lambda: all(pid_gone(p) for p in pids), 10,
                   f"every process of the session ({pids}) gone")
        assert _segments_of(head) == []
        assert not os.path.exists(info["session_dir"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in pids:   # a failed run must not leave a paused head behind
            if not pid_gone(p):
                os.kill(p, signal.SIGKILL)
