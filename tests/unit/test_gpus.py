"""GPU discovery for ``init(num_gpus=None)``: parsing captured outputs, and the decision
between CUDA_VISIBLE_DEVICES, nvidia-smi and zero (nvidia-smi is faked: no process runs)."""
from __future__ import annotations

import logging
import subprocess
from typing import Any

import pytest

from orchestra._platform.gpus import detect_num_gpus, parse_cuda_visible_devices, parse_nvidia_smi_list

pytestmark = pytest.mark.timeout(10)

EIGHT_H200 = "".join(
    f"GPU {i}: NVIDIA H200 (UUID: GPU-{i:08x}-1111-2222-3333-444455556666)\n" for i in range(8))

A100_WITH_MIG = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5f9ea5b0-0c8e-1c4d-2f43-0d5bd2a36ca1)
  MIG 3g.20gb     Device  0: (UUID: MIG-2a3b4c5d-6e7f-5a8b-9c0d-1e2f3a4b5c6d)
  MIG 3g.20gb     Device  1: (UUID: MIG-7a6b5c4d-3e2f-5a1b-8c9d-0e1f2a3b4c5d)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-0c7a1c8e-5e4d-11c4-a2f3-7d6bd2a36cb2)
"""


@pytest.mark.parametrize("output, expected", [
    (EIGHT_H200, 8),
    ("GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-1a2b3c4d-0000-1111-2222-333344445555)\n", 1),
    (A100_WITH_MIG, 2),                     # MIG instances are not GPUs of their own
    ("", 0),
    ("No devices were found\n", 0),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 0),
    ("GPU 0: NVIDIA H200 (UUID: GPU-x)", 1),   # no trailing newline
])
def test_nvidia_smi_list_counts_gpu_lines(output: str, expected: int) -> None:
    assert parse_nvidia_smi_list(output) == expected


@pytest.mark.parametrize("value, expected", [
    ("0,1,2,3", 4),
    ("2", 1),
    ("", 0),
    ("-1", 0),
    ("0,-1,2", 1),                         # CUDA stops at the first invalid entry
    (" 0 , 1 ", 2),
    ("GPU-5f9ea5b0-0c8e,GPU-0c7a1c8e-5e4d", 2),
    ("MIG-2a3b4c5d-6e7f", 1),
    ("NoDevFiles", 0),
])
def test_cuda_visible_devices_counts_entries_up_to_the_first_invalid_one(value: str,
                                                                         expected: int) -> None:
    assert parse_cuda_visible_devices(value) == expected


class FakeRun:
    """Stands in for subprocess.run: records the command, returns or raises as told."""

    def __init__(self, stdout: str = "", returncode: int = 0, stderr: str = "",
                 raises: BaseException | None = None) -> None:
        self.result = subprocess.CompletedProcess(["nvidia-smi", "-L"], returncode, stdout, stderr)
        self.raises = raises
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(cmd)
        assert kwargs.get("timeout"), "nvidia-smi must run with a timeout"
        if self.raises is not None:
            raise self.raises
        return self.result


def smi_at(path: str | None) -> Any:
    return lambda name: path if name == "nvidia-smi" else None


def test_cuda_visible_devices_wins_over_nvidia_smi() -> None:
    run = FakeRun(EIGHT_H200)
    assert detect_num_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, smi_at("/usr/bin/nvidia-smi"), run) == 2
    assert run.calls == []


def test_an_empty_cuda_visible_devices_means_no_gpus() -> None:
    run = FakeRun(EIGHT_H200)
    assert detect_num_gpus({"CUDA_VISIBLE_DEVICES": ""}, smi_at("/usr/bin/nvidia-smi"), run) == 0


def test_without_nvidia_smi_there_are_no_gpus_and_nothing_runs() -> None:
    run = FakeRun(EIGHT_H200)
    assert detect_num_gpus({}, smi_at(None), run) == 0
    assert run.calls == []


def test_nvidia_smi_list_is_counted() -> None:
    run = FakeRun(EIGHT_H200)
    assert detect_num_gpus({}, smi_at("/opt/bin/nvidia-smi"), run) == 8
    assert run.calls == [["/opt/bin/nvidia-smi", "-L"]]


def test_no_devices_found_is_zero_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    run = FakeRun("No devices were found\n", returncode=6)
    with caplog.at_level(logging.WARNING):
        assert detect_num_gpus({}, smi_at("/usr/bin/nvidia-smi"), run) == 0
    assert caplog.records == []


@pytest.mark.parametrize("run, cause", [
    (FakeRun("", returncode=9, stderr="NVIDIA-SMI has failed because it couldn't communicate "
             "with the NVIDIA driver.\n"), "exited with code 9"),
    (FakeRun(raises=subprocess.TimeoutExpired(["nvidia-smi", "-L"], 10)), "timed out"),
    (FakeRun(raises=PermissionError(13, "Permission denied")), "Permission denied"),
])
def test_a_failing_nvidia_smi_gives_zero_and_a_warning_naming_the_remedy(
        run: FakeRun, cause: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert detect_num_gpus({}, smi_at("/usr/bin/nvidia-smi"), run) == 0
    message = caplog.text
    assert cause in message
    assert "orchestra.init(num_gpus=N)" in message
