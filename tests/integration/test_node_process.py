"""The node (object store, worker pool, fork server) in a process of its own: a real
cluster started with _system_config={"node_process": True} does what the default one
does, its processes are head -> node -> fork server -> workers, and it fate-shares both
ways (shutdown, or the node killed: nothing left behind, the driver told why).

The actor class lives in this module: workers import it by name.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import _helpers as h
import orchestra
from _probes import Cluster, in_segment, pid_gone, shm_entries_of, wait_until
from orchestra._platform.procutil import all_stats
from orchestra.exceptions import ClusterLostError

pytestmark = pytest.mark.timeout(90)

T = 30
MiB = 1 << 20


def get(refs: Any) -> Any:
    return orchestra.get(refs, timeout=T)


@orchestra.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> int:
        self.n += k
        return self.n

    def block(self, gate: h.Gate) -> int:
        h.touch(gate.started)
        h.wait_for_file(gate.opened)
        return self.n


# ------------------------------------------------------------------ processes

def _children(pid: int) -> list[int]:
    return sorted(p for p, st in all_stats().items() if st.ppid == pid)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _node_pid(c: Cluster) -> int:
    nodes = [p for p in _children(c.head_pid) if _cmdline(p).startswith("orchestra::node")]
    assert len(nodes) == 1, f"children of the head {c.head_pid}: {_children(c.head_pid)}"
    return nodes[0]


def _tree(pid: int) -> list[int]:
    out = [pid]
    for child in _children(pid):
        out += _tree(child)
    return out


@pytest.fixture
def node_cluster(start_cluster: Callable[..., Cluster]) -> Iterator[Callable[..., Cluster]]:
    """``node_cluster(num_cpus=2, ...)``: a cluster whose node runs in its own process."""
    def start(**init_args: Any) -> Cluster:
        cfg = {"node_process": True, **init_args.pop("_system_config", {})}
        return start_cluster(_system_config=cfg, **init_args)
    yield start


# ------------------------------------------------------------------ what it runs

def test_many_tasks_and_tasks_with_large_numpy_arguments_run(node_cluster):
    node_cluster(num_cpus=2)
    assert get([h.add.remote(i, 1) for i in range(2000)]) == [i + 1 for i in range(2000)]
    arrays = [np.full(2 * MiB // 8, i, dtype=np.int64) for i in range(6)]
    sums = get([h.array_sum.remote(a) for a in arrays])
    assert sums == [float(i * (2 * MiB // 8)) for i in range(6)]


def test_without_a_fork_server_the_node_starts_workers_by_exec(node_cluster):
    c = node_cluster(num_cpus=1, _system_config={"zygote": False})
    assert get([h.add.remote(i, 1) for i in range(20)]) == list(range(1, 21))
    assert set(c.worker_pids()) <= set(_children(_node_pid(c)))


def test_actors_take_calls_and_later_calls_go_straight_to_them(node_cluster, gates):
    c = node_cluster(num_cpus=2)
    a = Counter.remote()
    assert get([a.add.remote(1) for _ in range(50)]) == list(range(1, 51))
    gate = gates()
    ref = a.block.remote(gate)
    gate.wait_started()
    # Sent straight to the actor's process: the head never saw it.
    assert not any(t.name == "Counter.block" for t in c.debug().task)
    gate.open()
    assert get(ref) == 50


def test_a_64_mib_array_is_put_once_and_read_zero_copy(node_cluster):
    node_cluster(num_cpus=1, object_store_memory=256 * MiB)
    ref = orchestra.put(np.arange(64 * MiB // 8, dtype=np.int64))
    a, b = get(ref), get(ref)
    assert not a.flags.writeable
    assert np.shares_memory(a, b)   # two gets, one map of the node's segment
    assert in_segment(a.__array_interface__["data"][0])   # the node's segment, mapped here
    assert int(a[-1]) == 64 * MiB // 8 - 1
    assert get(h.array_info.remote(ref)) == {"writeable": False, "sum": int(a.sum()),
                                            "nbytes": 64 * MiB}


def test_objects_beyond_a_small_store_spill_and_come_back_intact(node_cluster):
    c = node_cluster(num_cpus=1, object_store_memory=64 * MiB)
    piece = 16 * MiB // 8
    refs = [orchestra.put(np.full(piece, i, dtype=np.int64)) for i in range(12)]
    wait_until(lambda: c.store().spilled_objects >= 12 - 4, 10, "objects spilled")
    assert c.spill_files()
    for i, ref in enumerate(refs):
        assert bool((get(ref) == i).all())
    assert get([h.array_sum.remote(r) for r in refs]) == [float(i * piece) for i in range(12)]
    del refs, ref
    wait_until(lambda: c.spill_files() == [], 10, "spill files removed once the refs are gone")
    wait_until(lambda: c.store().used == 0, 10, "the store's memory returned")


def test_a_worker_crash_is_retried_on_a_new_worker(node_cluster, tmp_path):
    node_cluster(num_cpus=1)
    marker = str(tmp_path / "crashed-once")
    assert get(h.crash_on_first_attempt.remote(marker)) == "second attempt"
    assert os.path.exists(marker)


# ------------------------------------------------------------------ processes and fate

def test_the_node_is_a_process_of_its_own_between_the_head_and_the_workers(node_cluster):
    c = node_cluster(num_cpus=2)
    node = _node_pid(c)
    assert node != c.head_pid
    below_node = set(_tree(node))
    workers = c.worker_pids()
    assert len(workers) == 2 and set(workers) <= below_node
    assert not set(workers) & set(_children(c.head_pid))
    assert shm_entries_of(node) and not shm_entries_of(c.head_pid)   # the node's segments


def test_shutdown_leaves_no_process_and_no_segment_directory(node_cluster):
    c = node_cluster(num_cpus=2)
    kept = [orchestra.put(np.ones(MiB)) for _ in range(3)]
    node = _node_pid(c)
    pids = _tree(c.head_pid)
    assert len(pids) >= 5   # head, node, fork server, two workers
    assert shm_entries_of(node)
    orchestra.shutdown()
    wait_until(lambda: all(pid_gone(p) for p in pids), 10, f"processes {pids} gone",
               lambda: f"alive: {[p for p in pids if not pid_gone(p)]}")
    assert not shm_entries_of(node) and not os.path.exists(c.session_dir)
    del kept


def test_killing_the_node_ends_the_session_naming_its_death_and_leaves_nothing(
        node_cluster, gates):
    c = node_cluster(num_cpus=2)
    gate = gates()
    kept = orchestra.put(np.ones(MiB))
    running = h.gated.remote(gate)
    gate.wait_started()
    node = _node_pid(c)
    pids = _tree(c.head_pid)
    os.kill(node, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(ClusterLostError, match=r"node process .* died \(signal SIGKILL"):
        get(running)
    assert time.monotonic() - start < 10
    with pytest.raises(ClusterLostError, match=r"node process .* died"):   # every later call too
        get(h.add.remote(1, 2))
    assert not orchestra.is_initialized()
    wait_until(lambda: all(pid_gone(p) for p in pids), 10, f"processes {pids} gone",
               lambda: f"alive: {[p for p in pids if not pid_gone(p)]}")
    orchestra.shutdown()
    assert not shm_entries_of(node) and not os.path.exists(c.session_dir)
    del kept


def test_killing_the_head_closes_the_node_which_removes_its_segments(node_cluster):
    c = node_cluster(num_cpus=2)
    kept = orchestra.put(np.ones(MiB))
    node = _node_pid(c)
    pids = _tree(c.head_pid)
    assert shm_entries_of(node)
    os.kill(c.head_pid, signal.SIGKILL)
    # The node itself (not the driver's cleanup) kills its workers and removes its files.
    wait_until(lambda: all(pid_gone(p) for p in pids) and not shm_entries_of(node), 10,
               f"processes {pids} gone and the node's segments removed",
               lambda: f"alive: {[p for p in pids if not pid_gone(p)]}, "
                       f"left: {shm_entries_of(node)}")
    with pytest.raises(ClusterLostError):
        get(h.add.remote(1, 2))
    del kept
