"""A node of a cluster dies (SIGKILL, or silence): its running tasks are retried on
other nodes, its actors restart elsewhere or die, objects whose only copy it held are
made again when their task may be retried or raise ObjectLostError naming the node;
the cluster carries on, and orchestra.nodes() says the node is dead and why."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import orchestra
from _helpers import Gate, joined_cluster, node_of, wait_for_file
from orchestra.exceptions import ActorDiedError, ObjectLostError, WorkerCrashedError
from orchestra.util.scheduling_strategies import NodeAffinitySchedulingStrategy

MB = 1 << 20


@pytest.fixture
def cluster():
    with joined_cluster({"num_cpus": 1, "node_timeout_s": 2.0},
                        {"num_cpus": 1, "resources": {"x": 1, "shared": 1}},
                        {"num_cpus": 1, "resources": {"y": 1, "shared": 1}}) as nodes:
        yield nodes


@orchestra.remote(resources={"shared": 1}, max_retries=1)
def gated_where(gate: Gate, path: str) -> str:
    me = orchestra.get_runtime_context().get_node_id()
    if not os.path.exists(path):   # the first run says where it runs, then waits
        with open(path + ".tmp", "w") as f:
            f.write(me)
        os.replace(path + ".tmp", path)
        gate.started and open(gate.started, "a").close()
        wait_for_file(gate.opened, 120)
    return me


@orchestra.remote
def big(seed: int) -> np.ndarray:
    return np.full(4 * MB, seed, dtype=np.uint8)


@orchestra.remote
class Where:
    def node(self) -> str:
        return orchestra.get_runtime_context().get_node_id()


def test_a_running_task_is_retried_on_another_node(cluster, tmp_path):
    c, x, y = cluster
    path = str(tmp_path / "where")
    ref = gated_where.remote(Gate(tmp_path), path)
    wait_for_file(path)
    first = open(path).read()
    victim = x if first == x.node_id else y
    c.remove_node(victim, allow_graceful=False)   # SIGKILL
    other = y if victim is x else x
    assert orchestra.get(ref, timeout=60) == other.node_id
    dead = [n for n in orchestra.nodes() if not n["Alive"]]
    assert [n["NodeID"] for n in dead] == [victim.node_id]
    assert dead[0]["DeathReason"]


def test_a_running_task_without_retries_fails_naming_its_nodes_death(cluster, tmp_path):
    """It read "died of its node died (...)"."""
    c, x, y = cluster
    path = str(tmp_path / "where")
    ref = gated_where.options(resources={"x": 1}, max_retries=0).remote(Gate(tmp_path), path)
    wait_for_file(path)
    c.remove_node(x, allow_graceful=False)   # SIGKILL
    with pytest.raises(WorkerCrashedError, match=r"running task \S*gated_where\(\) died of "
                       r"its node's death \(.+\); attempts made: 1\."):
        orchestra.get(ref, timeout=60)


def test_an_actor_on_a_dead_node_dies_or_restarts_elsewhere(cluster):
    c, x, y = cluster
    gone = Where.options(resources={"x": 1}).remote()
    # max_task_retries: a call sent straight to the old process before this driver saw
    # its connection close is in flight when it dies (as in Ray, it fails without
    # retries); with one it runs again on the new incarnation.
    moves = Where.options(resources={"shared": 1}, max_restarts=1, max_task_retries=1).remote()
    assert orchestra.get(gone.node.remote()) == x.node_id
    at = orchestra.get(moves.node.remote())
    victim = x
    c.remove_node(victim, allow_graceful=False)
    with pytest.raises(ActorDiedError):
        orchestra.get(gone.node.remote(), timeout=60)
    if at == victim.node_id:
        assert orchestra.get(moves.node.remote(), timeout=60) == y.node_id
    else:
        assert orchestra.get(moves.node.remote(), timeout=60) == at


def test_an_object_only_the_dead_node_held_is_lost_naming_it_or_made_again(cluster):
    c, x, y = cluster
    lost = big.options(resources={"x": 1}, max_retries=0).remote(1)
    # Made on x too (soft affinity: it may run again elsewhere).
    again = big.options(resources={"shared": 1}, max_retries=2, scheduling_strategy=
                        NodeAffinitySchedulingStrategy(x.node_id, soft=True)).remote(2)
    orchestra.wait([lost, again], num_returns=2)
    c.remove_node(x, allow_graceful=False)
    with pytest.raises(ObjectLostError, match=f"node {int(x.node_id, 16)}"):
        orchestra.get(lost, timeout=60)
    arr = orchestra.get(again, timeout=60)
    assert arr.shape == (4 * MB,) and int(arr[0]) == 2 and int(arr[-1]) == 2
    # The cluster carries on with the nodes it has.
    assert orchestra.get(node_of.options(resources={"y": 1}).remote()) == y.node_id


def test_a_lost_result_of_a_task_sent_straight_to_a_lent_worker_is_made_again(cluster):
    # Tasks submitted one after another go straight to a worker lent to this driver:
    # the head never scheduled them, and had no lineage of their results (they were
    # lost with their node although max_retries=2). Their worker sends the call with
    # a result in shared memory.
    from orchestra.util.state import list_tasks
    c, x, y = cluster
    refs = []
    for i in range(8):
        refs.append(big.options(resources={"shared": 1}, max_retries=2).remote(i))
        orchestra.wait(refs[-1:], timeout=60)   # made, not read: its only copy is there
    rows = {r["task_id"]: r for r in list_tasks(limit=0)}
    made = [rows[r.hex()[:-8]] for r in refs]
    direct = [r for r, row in zip(refs, made, strict=True) if row["creation_time_ms"] is None]
    assert direct, "no task went straight to a lent worker"
    dead = x if made[-1]["node_id"] == x.node_id else y
    c.remove_node(dead, allow_graceful=False)
    for i, r in enumerate(refs):
        arr = orchestra.get(r, timeout=60)
        assert int(arr[0]) == i and int(arr[-1]) == i


def test_a_silent_node_is_declared_dead_after_the_timeout(cluster):
    c, x, y = cluster
    os.kill(x.pid, signal.SIGSTOP)
    try:
        deadline_nodes = None
        import time
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            deadline_nodes = [n for n in orchestra.nodes() if not n["Alive"]]
            if deadline_nodes:
                break
            time.sleep(0.1)
        assert deadline_nodes and deadline_nodes[0]["NodeID"] == x.node_id
        assert "heartbeat" in deadline_nodes[0]["DeathReason"]
        assert orchestra.get(node_of.options(resources={"shared": 1}).remote()) == y.node_id
    finally:
        os.kill(x.pid, signal.SIGCONT)


@orchestra.remote
def plus(a: np.ndarray, k: int) -> np.ndarray:
    return a + np.uint8(k)


@orchestra.remote
def after(a: np.ndarray, _gate_result: object) -> list[int]:
    return [int(a[0]), int(a[-1]), a.shape[0]]


@orchestra.remote(resources={"y": 1})
def gate_on_y(gate: Gate) -> int:
    open(gate.started, "a").close()
    wait_for_file(gate.opened, 120)
    return 0


@pytest.mark.parametrize("steps", [2, 4])
def test_a_waiting_task_gets_an_argument_whose_own_arguments_were_freed(cluster, tmp_path, steps):
    # A chain whose driver keeps only the last ref: each step's argument is held by that
    # step alone and freed when it ends. The last result lives on x and a task waiting
    # on y still needs it; x dies. Making it again needs the step before it, whose value
    # was freed: its lineage was kept (freed values, remembered calls), so the whole
    # chain runs again and the waiting task gets the right value (before: ObjectLostError,
    # "freed when its last ref was dropped", shared/repros/retried_argument_lost.py).
    c, x, y = cluster
    on_x = NodeAffinitySchedulingStrategy(x.node_id, soft=True)
    gate = Gate(tmp_path)
    held = gate_on_y.remote(gate)
    gate.wait_started()
    ref = big.options(scheduling_strategy=on_x, max_retries=2).remote(5)
    for _ in range(steps):
        ref = plus.options(scheduling_strategy=on_x, max_retries=2).remote(ref, 1)
    orchestra.wait([ref], timeout=60, fetch_local=False)   # its one copy is on x
    last = after.remote(ref, held)     # waits on y's gate, holding ``ref`` alone
    del ref
    from orchestra.util.state import list_objects
    deadline = time.monotonic() + 30   # the steps' own results freed, the last one held
    while len(list_objects(filters=[("location", "=", "SHARED_MEMORY")], limit=0)) > 1 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    c.remove_node(x, allow_graceful=False)
    gate.open()
    assert orchestra.get(last, timeout=60) == [5 + steps, 5 + steps, 4 * MB]
