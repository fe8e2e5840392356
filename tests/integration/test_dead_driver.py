"""A driver of a cluster that lives on (started apart from it, as `orchestra start` does)
killed with SIGKILL: its job's work stops, as Ray stops a dead job's. Its running tasks
(sent through the head, or straight to workers lent to it) are killed, its queued ones
never run, its actors die; another driver's work goes on."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import orchestra
from _probes import child_env, pid_gone, wait_until
from orchestra._platform.procutil import process_tree
from orchestra.cluster_utils import Cluster
from orchestra.util.state import list_tasks

pytestmark = pytest.mark.timeout(120)

DRIVER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import orchestra

    out = Path(sys.argv[3])

    @orchestra.remote(max_retries=0)
    def long_task(i):
        (out / f"started-{i}-{os.getpid()}").touch()
        time.sleep(30)
        (out / f"finished-{i}").touch()

    orchestra.init(address=sys.argv[1], token=sys.argv[2])
    refs = [long_task.remote(i) for i in range(6)]   # 2 CPUs: 2 run, 4 wait
    (out / "submitted").touch()
    time.sleep(600)
""")


@pytest.mark.shared_machine
def test_a_killed_drivers_tasks_stop_and_the_cluster_serves_the_next(no_cluster, tmp_path: Path) -> None:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        driver = subprocess.Popen([sys.executable, str(script), c.address, c.token, str(tmp_path)],
                                  env=child_env())
        wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 2, 30,
                   "two of the driver's tasks to start")
        running = [int(p.name.rsplit("-", 1)[1]) for p in tmp_path.glob("started-*")]
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        # Its running tasks' workers are stopped, and nothing of it runs after.
        wait_until(lambda: all(pid_gone(p) for p in running), 15,
                   "the dead driver's running tasks to be stopped")
        orchestra.init(address=c.address, token=c.token)

        @orchestra.remote
        def quick() -> int:
            return 7
        start = time.monotonic()
        assert orchestra.get([quick.remote() for _ in range(4)], timeout=30) == [7] * 4
        assert time.monotonic() - start < 25   # not behind the dead job's 30 s tasks
        time.sleep(1.0)
        assert len(list(tmp_path.glob("started-*"))) == 2, "a dead driver's queued task ran"
        assert not list(tmp_path.glob("finished-*"))
        # Its tasks stay listed under its job, apart from this driver's.
        rows = list_tasks(limit=1000)
        dead = {r["job_id"] for r in rows if r["name"].endswith("long_task")}
        live = {r["job_id"] for r in rows if r["name"].endswith("quick")}
        assert len(dead) == 1 and None not in dead and dead != live, (dead, live)
    finally:
        orchestra.shutdown()
        c.shutdown()


SCRIPT = textwrap.dedent("""
    import json, os, sys
    from orchestra.cluster_utils import Cluster
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    n = c.add_node(num_cpus=1)
    print(json.dumps({"head": c.head_node.pid, "node": n.pid,
                      "dirs": [c.head_node.session_dir, n.session_dir],
                      "state": c._state}), flush=True)
    sys.stdin.read()   # until the test kills this process
""")


def test_a_cluster_utils_cluster_stops_when_its_script_dies(no_cluster, tmp_path: Path) -> None:
    import json
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        info = json.loads(proc.stdout.readline())
        pids = process_tree(info["head"]) | process_tree(info["node"])
        assert len(pids) >= 4   # head, node, and their fork servers and workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: all(pid_gone(p) for p in pids), 20,
                   "the head and the node to exit with the script that started them")
        wait_until(lambda: not any(os.path.exists(d) for d in info["dirs"]), 10,
                   "their session directories to be removed")
        wait_until(lambda: not os.path.exists(info["state"]), 10,
                   "the cluster's own directory (logs, records) to be removed")
    finally:
        if proc.poll() is None:
            proc.kill()


def _shm_dirs(pid: int) -> list[str]:
    prefix = f"orchestra-{os.geteuid()}-{pid}-"
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


@pytest.mark.shared_machine
def test_a_killed_node_and_a_head_stopped_by_a_signal_leave_no_directory(no_cluster) -> None:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        node = c.add_node(num_cpus=1)
        assert _shm_dirs(node.pid) and os.path.isdir(node.session_dir)
        os.kill(node.pid, signal.SIGKILL)   # nothing of it runs to clean up after it
        wait_until(lambda: not _shm_dirs(node.pid), 15,
                   "the killed node's segment directory to be swept by the head")
        head = c.head_node
        os.kill(head.pid, signal.SIGTERM)   # straight to it, not through orchestra stop
        wait_until(lambda: pid_gone(head.pid), 15, "the head to exit on SIGTERM")
        assert not os.path.exists(head.session_dir)
        assert not _shm_dirs(head.pid)
    finally:
        c.shutdown()
