"""Resources on a real local cluster: CPUs, GPUs (ids only: no GPU needed) and custom
resources gate concurrency; available_resources() is exact; infeasible requests fail."""
from __future__ import annotations

import pytest

import _helpers as h
import orchestra
from _probes import wait_until
from orchestra.exceptions import InfeasibleResourcesError

pytestmark = pytest.mark.timeout(60)

T = 30
def but_memory(res: dict[str, float]) -> dict[str, float]:
    """The resources without the node's "memory" (bytes of RAM, the machine's) and its
    own node:<address> and node:__internal_head__ (test_resources.py checks those)."""
    return {k: v for k, v in res.items() if k != "memory" and not k.startswith("node:")}


FULL = {"CPU": 2.0, "GPU": 2.0, "widget": 1.0}   # the shared cluster (tests/conftest.py)


def test_cluster_resources_are_what_init_was_given(cluster):
    assert but_memory(orchestra.cluster_resources()) == FULL
    assert but_memory(orchestra.available_resources()) == FULL


def test_each_node_advertises_its_address_and_the_head_its_own_as_ray_does(cluster):
    total = orchestra.cluster_resources()
    (address,) = {n["NodeManagerAddress"] for n in orchestra.nodes()}
    assert total[f"node:{address}"] == 1.0 and total["node:__internal_head__"] == 1.0

    @orchestra.remote(num_cpus=0)
    def node() -> str:
        return orchestra.get_runtime_context().get_node_id()
    here = orchestra.get_runtime_context().get_node_id()
    assert orchestra.get(node.options(resources={f"node:{address}": 0.01}).remote()) == here
    assert orchestra.get(node.options(resources={"node:__internal_head__": 0.5}).remote()) == here
    with pytest.raises(orchestra.exceptions.InfeasibleResourcesError):
        node.options(resources={"node:10.255.255.1": 0.01}).remote()


def test_init_with_gpus_works_without_gpus(start_cluster):
    start_cluster(num_cpus=1, num_gpus=3)
    assert but_memory(orchestra.cluster_resources()) == {"CPU": 1.0, "GPU": 3.0}
    env = orchestra.get(h.environment.options(num_gpus=3).remote(), timeout=T)
    assert env["gpu_ids"] == [0, 1, 2] and env["cuda"] == "0,1,2"


# ------------------------------------------------------------------ available_resources

def test_available_resources_is_exact_while_tasks_hold_cpus_and_gpus(cluster, gates):
    gpu_gate, cpu_gate = gates("gpu"), gates("cpu")
    gpu_task = h.gated.options(num_gpus=1).remote(gpu_gate)
    gpu_gate.wait_started()
    assert but_memory(orchestra.available_resources()) == {"CPU": 1.0, "GPU": 1.0, "widget": 1.0}
    cpu_task = h.gated.options(resources={"widget": 1}).remote(cpu_gate)
    cpu_gate.wait_started()
    assert but_memory(orchestra.available_resources()) == {"CPU": 0.0, "GPU": 1.0, "widget": 0.0}
    gpu_gate.open()
    orchestra.get(gpu_task, timeout=T)
    assert but_memory(orchestra.available_resources()) == {"CPU": 1.0, "GPU": 2.0, "widget": 0.0}
    cpu_gate.open()
    orchestra.get(cpu_task, timeout=T)
    assert but_memory(orchestra.available_resources()) == FULL


def test_a_task_blocked_in_get_gives_its_cpu_back_to_available_resources(cluster, gates):
    gate = gates()

    @orchestra.remote(num_cpus=2)
    def waits(inner: list) -> None:
        orchestra.get(inner[0], timeout=T)

    inner = h.gated.options(num_cpus=0).remote(gate)
    outer = waits.remote([inner])
    gate.wait_started()
    wait_until(lambda: orchestra.available_resources()["CPU"] == 2.0, 10,
               "the blocked task's CPUs lent back")
    gate.open()
    orchestra.get(outer, timeout=T)
    assert but_memory(orchestra.available_resources()) == FULL


# ------------------------------------------------------------------ gating concurrency

def _runs_while(cluster, gate, ref) -> bool:
    """Whether ``ref`` finishes while the task behind ``gate`` holds its resources."""
    gate.wait_started()
    ready, _ = orchestra.wait([ref], timeout=0.5)
    return bool(ready)


@pytest.mark.parametrize("holder, waiter", [
    ({"num_cpus": 2}, {"num_cpus": 1}),
    ({"num_cpus": 1}, {"num_cpus": 2}),
    ({"num_gpus": 2}, {"num_gpus": 1}),
    ({"num_gpus": 2}, {"num_gpus": 0.5}),
    ({"resources": {"widget": 1}}, {"resources": {"widget": 1}}),
    ({"resources": {"widget": 0.6}}, {"resources": {"widget": 0.6}}),
], ids=["cpus", "cpus-other-way", "gpus", "gpus-fraction", "custom", "custom-fraction"])
def test_resources_gate_concurrency(cluster, gates, holder, waiter):
    gate = gates()
    held = h.gated.options(**holder).remote(gate)
    other = h.identity.options(**waiter).remote("ran")
    assert not _runs_while(cluster, gate, other)
    gate.open()
    assert orchestra.get([held, other], timeout=T) == [None, "ran"]


@pytest.mark.parametrize("first, second", [
    ({"num_cpus": 1}, {"num_cpus": 1}),
    ({"num_gpus": 1}, {"num_gpus": 1}),
    ({"num_gpus": 0.5}, {"num_gpus": 0.5}),
    ({"resources": {"widget": 0.5}}, {"resources": {"widget": 0.5}}),
    ({"num_cpus": 2}, {"num_cpus": 0}),
], ids=["cpus", "gpus", "gpu-halves", "custom-halves", "zero-cpus"])
def test_tasks_that_fit_together_run_together(cluster, gates, first, second):
    a, b = gates("a"), gates("b")
    ra = h.gated.options(**first).remote(a)
    rb = h.gated.options(**second).remote(b)
    a.wait_started()
    b.wait_started()   # both hold their resources at once
    a.open()
    b.open()
    assert orchestra.get([ra, rb], timeout=T) == [None, None]


# ------------------------------------------------------------------ GPU ids

def test_a_gpu_task_sees_its_own_gpu_ids(cluster, gates):
    a, b = gates("a"), gates("b")
    ra = h.gated_environment.options(num_gpus=1).remote(a)
    rb = h.gated_environment.options(num_gpus=1).remote(b)
    a.wait_started()
    b.wait_started()
    a.open()
    b.open()
    envs = orchestra.get([ra, rb], timeout=T)
    assert sorted(e["gpu_ids"][0] for e in envs) == [0, 1]
    for e in envs:
        assert len(e["gpu_ids"]) == 1
        assert e["cuda"] == str(e["gpu_ids"][0])


def test_a_task_with_two_gpus_sees_both(cluster):
    env = orchestra.get(h.environment.options(num_gpus=2).remote(), timeout=T)
    assert env["gpu_ids"] == [0, 1]
    assert env["cuda"] == "0,1"


def test_a_non_gpu_task_sees_no_gpus(cluster):
    # Run GPU tasks first, so the same workers would carry a stale setting over.
    orchestra.get([h.environment.options(num_gpus=1).remote() for _ in range(4)], timeout=T)
    envs = orchestra.get([h.environment.remote() for _ in range(4)], timeout=T)
    for env in envs:
        assert env["cuda"] == ""
        assert env["gpu_ids"] == []


def test_the_driver_has_no_gpu_ids(cluster):
    assert orchestra.get_gpu_ids() == []


# ------------------------------------------------------------------ infeasible requests

@pytest.mark.parametrize("options, named", [
    ({"num_cpus": 3}, "CPU=3"),
    ({"num_gpus": 3}, "GPU=3"),
    ({"resources": {"widget": 2}}, "widget=2"),
    ({"resources": {"nonexistent": 1}}, "nonexistent=1"),
])
def test_an_infeasible_request_raises_at_remote(cluster, options, named):
    with pytest.raises(InfeasibleResourcesError, match=named) as info:
        h.identity.options(**options).remote(1)
    assert isinstance(info.value, ValueError)
    assert "init(" in str(info.value)   # names the remedy


def test_an_infeasible_request_from_inside_a_task_raises_there(cluster):
    @orchestra.remote
    def submit_infeasible() -> str:
        try:
            h.identity.options(num_gpus=5).remote(1)
        except InfeasibleResourcesError as err:
            return f"raised: {err}"
        return "no error"

    assert orchestra.get(submit_infeasible.remote(), timeout=T).startswith("raised: ")


@pytest.mark.parametrize("options, error", [
    ({"num_cpus": -1}, ValueError),
    ({"num_gpus": "1"}, TypeError),
    ({"resources": {"CPU": 1}}, ValueError),
    ({"num_gpus": 1.5}, ValueError),             # above one GPU, whole GPUs only
    ({"resources": {"": 1}}, TypeError),
    ({"max_retries": -2}, ValueError),
    ({"num_returns": -1}, ValueError),
    ({"no_such_option": 1}, TypeError),
])
def test_bad_options_raise_at_once(cluster, options, error):
    with pytest.raises(error):
        h.identity.options(**options)
