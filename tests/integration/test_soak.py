"""Soaks: ordinary concurrent work on a two-node cluster, checked round by round, first
with nothing injected, then with faults (workers SIGKILLed every few seconds, the
joined node killed and replaced every NODE_KILL_S), then on `orchestra start` with the
head SIGKILLed every HEAD_KILL_S as well. Workload: tests/integration/_soak.py.

Each soak lasts ORCHESTRA_SOAK_S seconds (6 by default, in the normal run); run longer
ones with ``ORCHESTRA_SOAK_S=600 pytest -m soak tests/integration/test_soak.py``.

    promise                                   checked by
    ----------------------------------------  --------------------------------------
    no hang                                   every get() has a timeout: "hung" == 0
    no lost object, no wrong value            "ObjectLostError" / "wrong" == 0
    faults are survived                       tasks with max_retries, actors with
                                              max_restarts=-1: the same counts == 0
    nothing left behind                       after shutdown: no process of the
                                              cluster, nothing of it in /dev/shm
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import _soak
import orchestra
from _cli import cli, records, start_head
from _probes import child_env, pid_gone, wait_until
from orchestra._cluster.supervisor import MAX_RESTARTS, WINDOW_S, head_pid
from orchestra._platform.procutil import process_tree
from orchestra._runtime import cluster_file as cf
from orchestra.cluster_utils import Cluster

SOAK_S = float(os.environ.get("ORCHESTRA_SOAK_S", "6"))
# With faults, the joined node is SIGKILLed (and replaced) this often: once in the
# normal run (at ~4 s), every 40 s in a long one.
NODE_KILL_S = float(os.environ.get("ORCHESTRA_SOAK_NODE_KILL_S", 0)) or min(SOAK_S * 0.6, 40.0)
THREADS = 3
PROCESSES = 2
HERE = Path(__file__).resolve().parent

pytestmark = [pytest.mark.soak, pytest.mark.alone, pytest.mark.timeout(int(SOAK_S) * 4 + 120)]


def _driver_env(wait_s: float) -> dict[str, str]:
    """A driver process's environment: a driver still running 10 s before the test
    stops waiting for it prints every thread's stack (faulthandler, to the test's
    captured output), so that a hang shows where it waits."""
    return {**child_env(), "ORCHESTRA_SOAK_DUMP_S": str(max(wait_s - 10, 1))}


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def _shm_of(pids: set[int]) -> list[str]:
    """/dev/shm entries named for these processes (a store's directory carries the
    pid of the process that made it)."""
    marks = tuple(f"orchestra-{os.geteuid()}-{pid}-" for pid in pids)
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(marks))


class Soak:
    """A head (2 CPUs) and a joined node (2 CPUs, resource "far"), this process a
    driver; drivers: THREADS threads here and PROCESSES processes."""

    def __init__(self) -> None:
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
        self.node = self.cluster.add_node(num_cpus=2, resources={"far": 100})
        orchestra.init(address=self.cluster.address, token=self.cluster.token)
        self.pids: set[int] = set()

    def note_pids(self) -> None:
        """Remember every process of the cluster seen so far (checked after shutdown)."""
        for root in (self.cluster.head_node.pid, self.node.pid):
            self.pids |= process_tree(root)

    def run(self, seconds: float, faults: bool = False) -> list[dict[str, int]]:
        results: list[dict[str, int]] = []
        procs = [subprocess.Popen(
            [sys.executable, str(HERE / "_soak.py"), self.cluster.address, self.cluster.token,
             str(seconds), str(100 + k), "faults" if faults else "-"],
            stdout=subprocess.PIPE, text=True,
            env=_driver_env(seconds + 2 * _soak.GET_TIMEOUT_S + 60)) for k in range(PROCESSES)]
        options = _soak.make_options(faults)
        threads = [threading.Thread(target=lambda k=k: results.append(
            _soak.rounds(seconds, k + 1, options))) for k in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 2 * _soak.GET_TIMEOUT_S + 60)
            assert not t.is_alive(), "a driver thread never came back"
        for p in procs:
            out, _ = p.communicate(timeout=seconds + 2 * _soak.GET_TIMEOUT_S + 60)
            assert p.returncode == 0, f"a driver process exited with {p.returncode}"
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results

    def shutdown(self) -> None:
        self.note_pids()
        orchestra.shutdown()
        # What the head said (shown when the test failed): why it stopped, if it did.
        head = self.cluster.head_node
        log = Path(head._started.run_dir) / cf.LOG if head is not None else None
        if log is not None and log.exists():
            text = log.read_text(errors="replace")
            keep = os.environ.get("ORCHESTRA_SOAK_HEAD_LOG")   # the whole log, kept there
            if keep:
                Path(keep).write_text(text)
            if len(text) > 30000:   # its beginning says what went wrong first
                text = text[:20000] + "\n[...]\n" + text[-10000:]
            print(f"--- the head's log ({log}):\n{text}")
        self.cluster.shutdown()


@pytest.fixture
def soak(no_cluster: None) -> Iterator[Soak]:
    s = Soak()
    try:
        yield s
    finally:
        s.shutdown()
    # Nothing of the cluster is left: no process, nothing in /dev/shm.
    wait_until(lambda: all(pid_gone(p) for p in s.pids), 20, "the cluster's processes to exit")
    wait_until(lambda: not _shm_of(s.pids), 10, "the cluster's /dev/shm entries to go")


def _check(results: list[dict[str, int]], logs: str = "") -> None:
    """``logs``: a state directory whose processes' logs a failure shows."""
    assert len(results) == THREADS + PROCESSES
    bad = [_soak.failures(r) for r in results if _soak.failures(r)]
    assert bad == [], f"rounds that failed: {bad}" + "".join(
        f"\n--- the {rec['kind']}'s log (pid {rec['pid']}):\n"
        + _tail(Path(rec["run_dir"], cf.LOG), 40) for rec in (records(logs) if logs else ()))
    done = sum(sum(r.values()) for r in results)
    by_kind = {k: sum(r.get(k, 0) for r in results) for k in ("chain", "steps", "big", "nested", "actor")}
    print(f"soak: {done} rounds right, by kind {by_kind}")   # shown with -s
    assert done >= THREADS + PROCESSES, f"too few rounds ran: {results}"


def test_concurrent_drivers_on_two_nodes_see_every_result_right(soak: Soak) -> None:
    results = soak.run(SOAK_S)
    _check(results)


def test_with_workers_killed_and_the_node_replaced_every_result_is_still_right(soak: Soak) -> None:
    stop = threading.Event()
    killed: list[int] = []
    node_kills: list[int] = []

    def faults() -> None:
        rng = random.Random(7)
        last_node_kill = time.monotonic()
        while not stop.wait(2.0):
            soak.note_pids()
            workers = [p for p in process_tree(soak.cluster.head_node.pid) | process_tree(soak.node.pid)
                       if _title(p).startswith("orchestra::worker")]
            if workers:
                victim = rng.choice(sorted(workers))
                try:
                    os.kill(victim, signal.SIGKILL)
                    killed.append(victim)
                except ProcessLookupError:
                    pass
            if time.monotonic() - last_node_kill > NODE_KILL_S:
                last_node_kill = time.monotonic()
                node_kills.append(soak.node.pid)
                os.kill(soak.node.pid, signal.SIGKILL)
                soak.node = soak.cluster.add_node(num_cpus=2, resources={"far": 100})

    killer = threading.Thread(target=faults, daemon=True)
    killer.start()
    try:
        results = soak.run(SOAK_S, faults=True)
    finally:
        stop.set()
        killer.join(30)
    assert killed, "no worker was killed: the faults never ran"
    assert node_kills, "the joined node was never killed"
    _check(results)


# With head kills: the head is SIGKILLed this often (once or twice in the normal run).
HEAD_KILL_S = float(os.environ.get("ORCHESTRA_SOAK_HEAD_KILL_S", 0)) or min(SOAK_S * 0.4, 20.0)


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_with_the_head_and_workers_killed_every_result_is_still_right(
        state: str, store: str, request: pytest.FixtureRequest) -> None:
    """`orchestra start --head` and a joined node, PROCESSES + THREADS drivers running the
    soak's rounds (chains whose driver keeps only the last ref, large arrays, nested
    tasks, a detached actor) while a worker is SIGKILLed every 2 s and the head every
    HEAD_KILL_S: the supervisor starts it again, the node joins again, each driver carries
    its work over (_runtime/replay.py), and no round fails, hangs or is lost. The head's
    records in its SQLite file (the default) or in a redis-server of the test's own."""
    url = request.getfixturevalue("redis_server").url if store == "redis" else \
        "sqlite://" + str(Path(state, "s.db"))
    head = start_head(state, "--num-cpus", "2", "--object-store-memory", str(256 << 20),
                      "--state-store", url)
    r = cli("start", "--address", head["address"], "--token", head["token"], "--num-cpus", "2",
            "--object-store-memory", str(256 << 20), "--resources", '{"far": 100}')
    assert r.returncode == 0, r.stderr
    stop = threading.Event()
    killed: list[int] = []
    head_kills: list[int] = []
    head_kill_times: list[float] = []

    def faults() -> None:
        rng = random.Random(11)
        last_head_kill = time.monotonic()
        while not stop.wait(2.0):
            pids = process_tree(int(head["pid"]))
            for n in records(state):
                if n["kind"] == "node":
                    pids |= process_tree(int(n["pid"]))
            workers = [p for p in pids if _title(p).startswith("orchestra::worker")]
            if workers:
                victim = rng.choice(sorted(workers))
                try:
                    os.kill(victim, signal.SIGKILL)
                    killed.append(victim)
                except ProcessLookupError:
                    pass
            pid = head_pid(head["run_dir"])
            now = time.monotonic()
            recent = sum(1 for t in head_kill_times if now - t < WINDOW_S + 5)
            # Fewer deaths in a window than its supervisor allows (else it stays down, as
            # it should): on a slow machine the drivers' last gets outlast the soak.
            if now - last_head_kill > HEAD_KILL_S and pid and recent < MAX_RESTARTS - 1:
                last_head_kill = now
                os.kill(pid, signal.SIGKILL)
                head_kills.append(pid)
                head_kill_times.append(now)

    procs = [subprocess.Popen(
        [sys.executable, str(HERE / "_soak.py"), head["address"], head["token"], str(SOAK_S),
         str(200 + k), "head-kills"], stdout=subprocess.PIPE, text=True,
        env=_driver_env(SOAK_S + 2 * _soak.GET_TIMEOUT_S + 120)) for k in range(PROCESSES + THREADS)]
    killer = threading.Thread(target=faults, daemon=True)
    killer.start()
    try:
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=SOAK_S + 2 * _soak.GET_TIMEOUT_S + 120)
            assert p.returncode == 0, (
                f"a driver process exited with {p.returncode}; the head's supervisor said: "
                + _tail(Path(head["run_dir"], "stderr.log")))
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        stop.set()
        killer.join(30)
        for p in procs:
            p.kill()
    assert killed, "no worker was killed: the faults never ran"
    assert head_kills, "the head was never killed"
    print(f"{len(head_kills)} head kills, {len(killed)} worker kills")
    _check(results, state)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({e})"
