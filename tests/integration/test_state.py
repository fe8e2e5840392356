"""The cluster's state on a real cluster of two nodes (a head and a node joined over TCP,
this process a driver): orchestra.util.state's lists, summarize_tasks, the timeline,
and the `orchestra list|status|memory|timeline` commands run as subprocesses."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import orchestra
from _helpers import joined_cluster
from orchestra.util import state

pytestmark = pytest.mark.timeout(120)

REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def two_nodes():
    with joined_cluster({"num_cpus": 2}, {"num_cpus": 1, "resources": {"far": 1}}) as nodes:
        yield nodes


def cli(cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # --token=: a token may begin with "-"
        [sys.executable, "-m", "orchestra._cli", *args, "--address", cluster.address,
         f"--token={cluster.token}"], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=REPO))


def task_id(ref: Any) -> str:
    return ref.hex()[:-8]   # an object id is its task's id + a 4-byte index


def tasks_by_id() -> dict[str, dict[str, Any]]:
    return {t["task_id"]: t for t in state.list_tasks(limit=0)}


@orchestra.remote
class Gate:
    """An Event as an actor: wait() returns once open() was called."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self) -> bool:
        await self.event.wait()
        return True

    async def open(self) -> None:
        self.event.set()


@orchestra.remote
def square(x: int) -> int:
    return x * x


@orchestra.remote
def fails() -> None:
    raise KeyError("on purpose")


@orchestra.remote
def waits_at(gate: Any) -> bool:
    return bool(orchestra.get(gate.wait.remote()))


@orchestra.remote(max_retries=0)
def dies() -> None:
    os._exit(3)


@orchestra.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self) -> int:
        self.n += 1
        return self.n


def test_list_tasks_shows_finished_failed_and_running_tasks(two_nodes) -> None:
    done = [square.remote(i) for i in range(4)]
    assert orchestra.get(done) == [0, 1, 4, 9]
    bad = fails.remote()
    with pytest.raises(KeyError):
        orchestra.get(bad)
    gate = Gate.remote()
    blocked = waits_at.remote(gate)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        running = state.list_tasks(filters=[("state", "=", "RUNNING")], limit=0)
        if task_id(blocked) in {t["task_id"] for t in running}:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the blocked task never showed as RUNNING: {state.list_tasks(limit=0)}")
    rows = tasks_by_id()
    for ref in done:
        assert rows[task_id(ref)]["state"] == "FINISHED"
        assert rows[task_id(ref)]["name"].endswith("square")
    failed = rows[task_id(bad)]
    assert (failed["state"], failed["error_type"], failed["type"]) == ("FAILED", "KeyError", "NORMAL_TASK")
    run = rows[task_id(blocked)]
    assert run["worker_pid"] and run["node_id"] and run["start_time_ms"] and run["end_time_ms"] is None
    assert run["job_id"] is not None
    orchestra.get(gate.open.remote())
    assert orchestra.get(blocked, timeout=20) is True
    types = {t["name"]: t["type"] for t in state.list_tasks(limit=0)}
    assert types["Gate.__init__"] == "ACTOR_CREATION_TASK" and types["Gate.wait"] == "ACTOR_TASK"


@orchestra.remote
def outer(k: int) -> int:
    return sum(orchestra.get([square.remote(j) for j in range(k)]))


@orchestra.remote
def countdown(n: int) -> int:
    return 0 if n == 0 else 1 + orchestra.get(countdown.remote(n - 1))


def test_nested_and_recursive_tasks_that_succeed_are_listed_finished_and_named(two_nodes) -> None:
    # Blocked get()s start workers beyond the pool, which are let go once idle: each
    # reports what it ran before it exits. Killed outright, it took its last reports
    # along, and successful tasks showed as nameless FAILED / TASK_NOT_RUN rows (or
    # WORKER_DIED), in list_tasks, the dashboard and /metrics alike.
    nested = [outer.remote(5) for _ in range(40)]
    recursive = [countdown.remote(4) for _ in range(20)]
    assert orchestra.get(nested + recursive, timeout=90) == [30] * 40 + [4] * 20
    time.sleep(1.0)   # the surplus workers are let go
    rows = state.list_tasks(limit=0)
    assert [r for r in rows if not r["name"]] == []
    ours = [r for r in rows if r["name"].endswith(("outer", "countdown"))]
    assert {r["state"] for r in ours} == {"FINISHED"}
    assert len(ours) == 40 + 20 * 5
    summary = state.summarize_tasks()["cluster"]["summary"]
    assert "FAILED" not in summary[rows[-1]["name"]]["state_counts"]


def test_a_tasks_name_option_is_its_name_in_list_tasks(two_nodes) -> None:
    ref = square.options(name="square-the-seven").remote(7)
    assert orchestra.get(ref) == 49
    row = tasks_by_id()[task_id(ref)]
    assert (row["name"], row["state"]) == ("square-the-seven", "FINISHED")
    with pytest.raises(ValueError, match="name must be a string"):
        square.options(name=7)


def test_direct_actor_calls_are_listed_with_their_worker(two_nodes) -> None:
    c = Counter.remote()
    assert orchestra.get(c.add.remote()) == 1   # after it, calls go straight to the actor
    refs = [c.add.remote() for _ in range(5)]
    assert orchestra.get(refs) == [2, 3, 4, 5, 6]
    rows = tasks_by_id()
    calls = [rows[task_id(r)] for r in refs]
    assert {t["state"] for t in calls} == {"FINISHED"}
    assert len({t["worker_pid"] for t in calls}) == 1
    assert any(t["creation_time_ms"] is None for t in calls), "no call went straight to the actor"
    assert all(t["actor_id"] and t["type"] == "ACTOR_TASK" for t in calls)


def test_a_task_whose_worker_died_is_failed_with_worker_died(two_nodes) -> None:
    ref = dies.remote()
    with pytest.raises(orchestra.exceptions.WorkerCrashedError):
        orchestra.get(ref, timeout=30)
    row = tasks_by_id().get(task_id(ref))
    # Its start may have died with the worker (reported every 0.5 s): it is then known
    # from the head's submit, as failed without running.
    assert row is not None and row["state"] == "FAILED"
    assert row["error_type"] in ("WORKER_DIED", "TASK_NOT_RUN")


@orchestra.remote(max_retries=0)
def _started_then_sleeps(path: str) -> None:
    open(path, "w").close()
    time.sleep(60)


def test_a_task_cancelled_with_force_while_running_is_listed_cancelled(two_nodes,
                                                                        tmp_path) -> None:
    """Its worker is killed to stop it: it read WORKER_DIED, as a crash does."""
    started = tmp_path / "started"
    ref = _started_then_sleeps.remote(str(started))
    deadline = time.monotonic() + 30
    # Listed running (workers report their starts every 0.5 s; one cancelled before
    # its start is reported is listed as never run).
    while not started.exists() or \
            (tasks_by_id().get(task_id(ref)) or {}).get("state") != "RUNNING":
        assert time.monotonic() < deadline, "the task was not listed running"
        time.sleep(0.05)
    orchestra.cancel(ref, force=True)
    with pytest.raises(orchestra.exceptions.TaskCancelledError):
        orchestra.get(ref, timeout=30)
    row = tasks_by_id().get(task_id(ref))
    assert row is not None and (row["state"], row["error_type"]) == ("FAILED", "TASK_CANCELLED")


def test_list_actors_shows_alive_then_dead_after_kill(two_nodes) -> None:
    c = Counter.options(name="counted").remote()
    orchestra.get(c.add.remote())
    (row,) = state.list_actors(filters=[("name", "=", "counted")])
    assert (row["state"], row["class_name"]) == ("ALIVE", "Counter") and row["pid"]
    orchestra.kill(c)
    deadline = time.monotonic() + 20
    while state.list_actors(filters=[("name", "=", "counted")])[0]["state"] != "DEAD":
        assert time.monotonic() < deadline, "the killed actor never showed DEAD"
        time.sleep(0.1)


def test_list_objects_and_memory_show_a_put_object_its_size_and_holder(two_nodes) -> None:
    ref = orchestra.put(np.zeros(2 << 20, dtype=np.uint8))
    objs = {o["object_id"]: o for o in state.list_objects(limit=0)}
    row = objs[ref.hex()]
    assert row["object_size"] >= 2 << 20 and row["location"] == "SHARED_MEMORY"
    assert {"pid": os.getpid(), "type": "DRIVER", "count": 1} in row["holders"]
    small = orchestra.put(b"x" * 5000)   # inline: its size counted when listed
    (srow,) = [o for o in state.list_objects(limit=0) if o["object_id"] == small.hex()]
    assert srow["location"] == "INLINE" and 5000 <= srow["object_size"] < 6000
    r = cli(two_nodes[0], "memory", "--json")
    assert r.returncode == 0, r.stderr
    mem = {o["object_id"]: o for o in json.loads(r.stdout)}
    assert os.getpid() in {h["pid"] for h in mem[ref.hex()]["holders"]}
    r = cli(two_nodes[0], "memory")
    assert ref.hex() in r.stdout and f"pid {os.getpid()} (driver)" in r.stdout
    del ref


def test_the_cli_prints_names_from_user_code_escaped_and_cut(two_nodes) -> None:
    # ESC/BEL and newlines in a name once reached the terminal raw (escape injection),
    # and a 100 kB name padded every row of the table to 100 kB.
    evil = Counter.options(name="evil\x1b]0;owned\x07\nname").remote()
    huge = Counter.options(name="h" * 100_000).remote()
    assert orchestra.get([evil.add.remote(), huge.add.remote()]) == [1, 1]
    r = cli(two_nodes[0], "list", "actors")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "evil\\x1b]0;owned\\x07\\nname" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) < 1000
    orchestra.kill(evil)
    orchestra.kill(huge)


def test_list_nodes_and_workers_on_two_nodes(two_nodes) -> None:
    _, node = two_nodes
    assert orchestra.get(square.options(resources={"far": 1}).remote(3)) == 9
    nodes = state.list_nodes()
    assert len(nodes) == 2 and {n["state"] for n in nodes} == {"ALIVE"}
    assert [n["is_head_node"] for n in nodes].count(True) == 1
    assert node.node_id in {n["node_id"] for n in nodes}
    workers = state.list_workers(limit=0)
    assert {w["node_id"] for w in workers if w["worker_type"] == "WORKER"} == {n["node_id"] for n in nodes}
    drivers = state.list_workers(filters=[("worker_type", "=", "DRIVER")])
    assert os.getpid() in {d["pid"] for d in drivers}
    far = [t for t in state.list_tasks(limit=0) if t["node_id"] == node.node_id]
    assert far, "no task listed on the joined node"


def test_summarize_tasks_counts_by_name_and_state(two_nodes) -> None:
    orchestra.get([square.remote(i) for i in range(3)])
    s = state.summarize_tasks()["cluster"]
    squares = [v for k, v in s["summary"].items() if k.endswith("square")]
    assert squares and squares[0]["state_counts"].get("FINISHED", 0) >= 3
    assert s["total_tasks"] >= 3


def test_cli_list_prints_json_rows_and_tables(two_nodes) -> None:
    orchestra.get(square.remote(5))
    r = cli(two_nodes[0], "list", "tasks", "--json", "--limit", "0", "--filter", "state=FINISHED")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows and {t["state"] for t in rows} == {"FINISHED"}
    r = cli(two_nodes[0], "list", "nodes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[:2] == ["NODE_ID", "NODE_IP"]
    assert len(r.stdout.splitlines()) == 3
    r = cli(two_nodes[0], "list", "tasks", "--filter", "nonsense")
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr


def test_status_shows_the_store_tasks_and_actors_by_state(two_nodes) -> None:
    r = cli(two_nodes[0], "status")
    assert r.returncode == 0, r.stderr
    assert "object store (in use/total)" in r.stdout and "spilled" in r.stdout
    assert "FINISHED" in r.stdout.split("tasks:")[1].splitlines()[0]
    assert "actors:" in r.stdout and "driver(s)" in r.stdout


def _check_trace(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for e in events:
        assert {"ph", "ts", "dur", "pid", "tid", "name"} <= set(e), e
    calls = [e for e in events if e["ph"] == "X"]
    assert calls
    for e in calls:
        assert e["dur"] >= 0 and e["args"]["task_id"]
    return calls


def test_timeline_is_chrome_trace_json(two_nodes, tmp_path) -> None:
    refs = [square.remote(i) for i in range(3)]
    orchestra.get(refs)
    calls = _check_trace(orchestra.timeline())
    assert {task_id(r) for r in refs} <= {e["args"]["task_id"] for e in calls}
    out = tmp_path / "trace.json"
    r = cli(two_nodes[0], "timeline", "-o", str(out))
    assert r.returncode == 0, r.stderr
    _check_trace(json.loads(out.read_text()))
    orchestra.timeline(str(tmp_path / "again.json"))
    assert json.loads((tmp_path / "again.json").read_text())


def test_cluster_summary_has_the_dashboards_keys(two_nodes) -> None:
    orchestra.get(square.remote(2))
    s = state.cluster_summary()
    assert set(s) >= {"session", "nodes", "resources_total", "resources_available", "store",
                      "tasks", "actors", "workers", "drivers", "time"}
    assert len(s["nodes"]) == 2 and all(n["alive"] for n in s["nodes"])
    assert set(s["nodes"][0]) >= {"node_id", "address", "alive", "resources_total",
                                  "resources_available", "store_used", "store_capacity",
                                  "spilled_bytes"}
    assert set(s["store"]) == {"used", "capacity", "pooled", "spilled_bytes", "spilled_objects"}
    assert s["tasks"].get("FINISHED", 0) >= 1 and s["drivers"] >= 1 and s["workers"] >= 3
    assert s["resources_total"]["CPU"] == 3
    json.dumps(s)
