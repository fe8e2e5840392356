"""init(num_gpus=None) finds the GPUs this process may use; an explicit number wins.

CUDA_VISIBLE_DEVICES decides here, so the tests give the same answer on machines with and
without GPUs (the nvidia-smi path is unit-tested on captured outputs: tests/unit/test_gpus.py).
"""
from __future__ import annotations

from collections.abc import Callable

import pytest

import orchestra
from _probes import Cluster


def but_memory(res: dict[str, float]) -> dict[str, float]:
    """The resources without the node's "memory" (bytes of RAM, the machine's) and its
    own node:<address> and node:__internal_head__ (test_resources.py checks those)."""
    return {k: v for k, v in res.items() if k != "memory" and not k.startswith("node:")}


pytestmark = pytest.mark.timeout(60)


def test_init_counts_the_gpus_in_cuda_visible_devices(
        start_cluster: Callable[..., Cluster], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    start_cluster(num_cpus=1)
    assert but_memory(orchestra.cluster_resources()) == {"CPU": 1.0, "GPU": 3.0}


def test_init_with_no_visible_gpu_has_no_gpu_resource(
        start_cluster: Callable[..., Cluster], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    start_cluster(num_cpus=1)
    assert but_memory(orchestra.cluster_resources()) == {"CPU": 1.0}


def test_an_explicit_num_gpus_wins_over_discovery(
        start_cluster: Callable[..., Cluster], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    start_cluster(num_cpus=1, num_gpus=1)
    assert but_memory(orchestra.cluster_resources()) == {"CPU": 1.0, "GPU": 1.0}
