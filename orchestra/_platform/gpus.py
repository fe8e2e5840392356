"""How many GPUs this machine offers, for ``orchestra.init(num_gpus=None)``.

    CUDA_VISIBLE_DEVICES set?  -> its entries, as CUDA reads them (what this process may use)
    else nvidia-smi on PATH?   -> ``nvidia-smi -L``, one "GPU <n>: ..." line per GPU
    neither, or it fails       -> 0: a machine without (working) NVIDIA GPUs

An explicit ``init(num_gpus=k)`` never gets here. ``nvidia-smi`` ships with every NVIDIA
driver and needs no Python binding; it runs once per ``init`` with a timeout, and only on
machines that have it, so CPU-only machines pay one PATH lookup. Parsing is split from
running so it is unit-tested on captured outputs.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping

__all__ = ["detect_num_gpus", "parse_cuda_visible_devices", "parse_nvidia_smi_list"]

_log = logging.getLogger(__name__)

NVIDIA_SMI_TIMEOUT_S = 10.0   # a hung driver must not hang init()
# "GPU 0: NVIDIA H200 (UUID: GPU-...)". MIG instances are listed indented under their GPU
# ("  MIG 3g.71gb Device 0: ...") and are not counted: orchestra hands out whole GPUs.
_GPU_LINE = re.compile(r"^GPU \d+:", re.MULTILINE)
_UUID_PREFIXES = ("GPU-", "MIG-")


def parse_nvidia_smi_list(output: str) -> int:
    """The number of GPUs in the output of ``nvidia-smi -L``."""
    return len(_GPU_LINE.findall(output))


def parse_cuda_visible_devices(value: str) -> int:
    """How many devices CUDA shows a process with ``CUDA_VISIBLE_DEVICES=value``.

    CUDA reads the comma-separated list up to its first invalid entry (so ``"0,-1,2"``
    shows one device and ``"-1"`` or ``""`` none); entries are indices >= 0 or UUIDs.
    """
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if entry.isdigit() or entry.startswith(_UUID_PREFIXES):
            count += 1
        else:
            break
    return count


def detect_num_gpus(
    env: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi -L``.

    Never raises: a broken driver or a hung ``nvidia-smi`` gives 0 with a warning naming
    the cause, and ``init(num_gpus=k)`` overrides the guess.
    """
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return parse_cuda_visible_devices(visible)
    exe = which("nvidia-smi")
    if exe is None:
        return 0
    try:
        proc = run([exe, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S,
                   stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        _log.warning("orchestra: could not run %s -L (%s); assuming no GPUs. Pass "
                     "orchestra.init(num_gpus=N) to set the number yourself.", exe, exc)
        return 0
    if proc.returncode != 0:
        # Exit 6 is "No devices were found"; others (9: the driver is not loaded) are worth
        # a warning, since the machine has the tools and probably meant to have GPUs.
        if proc.returncode != 6:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            _log.warning("orchestra: %s -L exited with code %d (%s); assuming no GPUs. Fix the "
                         "NVIDIA driver, or pass orchestra.init(num_gpus=N).", exe,
                         proc.returncode, detail[0] if detail else "no output")
        return 0
    return parse_nvidia_smi_list(proc.stdout)
