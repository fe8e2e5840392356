"""The node's memory monitor: it acts before the kernel's OOM killer does.

    every refresh (ORCHESTRA_MEMORY_MONITOR_REFRESH_MS, 100 by default; 0: off), on the
    node's loop: read() -> MemoryReading(used, limit, where): the node's memory cgroup
        where it has a limit (v2: memory.current of memory.max; v1: memory.usage_in_bytes
        of memory.limit_in_bytes; both less the inactive file pages the kernel reclaims
        first), else the machine's (/proc/meminfo: MemTotal - MemAvailable)
    used > threshold * limit (ORCHESTRA_MEMORY_USAGE_THRESHOLD, 0.95 by default), and no
        victim of ours still alive -> host.memory_pressure(node id, NodeMemoryPressure:
        the reading and each worker's private bytes); the head picks the worker to kill
        (_scheduler/memory.py: the newest retriable task first, actors last; never the
        head, the store or a driver, which are no workers) and sends kill_worker with
        the reason; its task fails with OutOfMemoryError, or is retried
    the next victim waits until that one's death is seen (at most VICTIM_WAIT_S)
    within NEAR of the threshold, the next reading comes FAST times sooner (wait_s)

Reads files only; what it decides is whether to ask, never whom to kill.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import NamedTuple

from .._protocol import pb

DEFAULT_THRESHOLD = 0.95
DEFAULT_REFRESH_MS = 100
# A victim asked for and not dead yet: no other is asked for meanwhile (its memory is
# about to come back), for at most this long.
VICTIM_WAIT_S = 5.0
# Within NEAR (a fraction of the limit) below the threshold the monitor reads FAST times
# as often: past 95% of a 768 MiB limit only 38 MiB are left, which two tasks growing
# 200 MB/s each take in ~0.1 s, a refresh; a reading late by a busy loop then came
# after the kernel's OOM killer.
NEAR = 0.10
FAST = 5
_NO_LIMIT = 1 << 60   # a cgroup v1 limit at or above this is none (9223372036854771712)
_PAGE = os.sysconf("SC_PAGE_SIZE")


class MemoryReading(NamedTuple):
    used: int
    limit: int
    where: str


def settings(env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(threshold, refresh in seconds; 0: off), from the environment. ValueError names a
    value that is not one."""
    if env is None:
        env = os.environ
    raw_t = env.get("ORCHESTRA_MEMORY_USAGE_THRESHOLD", "")
    raw_r = env.get("ORCHESTRA_MEMORY_MONITOR_REFRESH_MS", "")
    try:
        threshold = float(raw_t) if raw_t else DEFAULT_THRESHOLD
        refresh = float(raw_r) if raw_r else DEFAULT_REFRESH_MS
    except ValueError:
        raise ValueError(
            f"ORCHESTRA_MEMORY_USAGE_THRESHOLD={raw_t!r} / ORCHESTRA_MEMORY_MONITOR_REFRESH_MS="
            f"{raw_r!r}: numbers are expected (a fraction such as 0.95; milliseconds, 0 to "
            "turn the memory monitor off)") from None
    if not 0.0 < threshold <= 1.0 or refresh < 0:
        raise ValueError(
            f"ORCHESTRA_MEMORY_USAGE_THRESHOLD={threshold:g} must be in (0, 1] and "
            f"ORCHESTRA_MEMORY_MONITOR_REFRESH_MS={refresh:g} at least 0 (0: off)")
    return threshold, refresh / 1000.0


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _stat_value(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _cgroup(proc_cgroup: str, root: str) -> MemoryReading | None:
    """This process's memory cgroup reading, where it has a limit."""
    v2 = None
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):   # v1
            base = os.path.join(root, "memory", path.lstrip("/"))
            try:
                limit = int(_read(os.path.join(base, "memory.limit_in_bytes")))
                if limit >= _NO_LIMIT:
                    return None
                usage = int(_read(os.path.join(base, "memory.usage_in_bytes")))
                stat = _read(os.path.join(base, "memory.stat"))
            except (OSError, ValueError):
                return None
            inactive = _stat_value(stat, "total_inactive_file")
            return MemoryReading(max(usage - inactive, 0), limit, f"cgroup v1 {path}")
        if hid == "0" and not controllers:
            v2 = path
    if v2 is None:
        return None
    base = os.path.join(root, v2.lstrip("/"))
    try:
        raw = _read(os.path.join(base, "memory.max")).strip()
        if raw == "max":
            return None
        limit = int(raw)
        usage = int(_read(os.path.join(base, "memory.current")))
        inactive = _stat_value(_read(os.path.join(base, "memory.stat")), "inactive_file")
    except (OSError, ValueError):
        return None
    return MemoryReading(max(usage - inactive, 0), limit, f"cgroup v2 {v2}")


def _machine(meminfo: str) -> MemoryReading:
    kib = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields:
            kib[name] = int(fields[0])
    total = kib.get("MemTotal", 0) << 10
    available = kib.get("MemAvailable", kib.get("MemFree", 0)) << 10
    return MemoryReading(total - available, total, "the machine")


def read(cgroup_root: str = "/sys/fs/cgroup") -> MemoryReading:
    """The memory this node may use and uses: its cgroup's where it has a limit below
    the machine's, else the machine's."""
    machine = _machine(_read("/proc/meminfo"))
    try:
        group = _cgroup(_read("/proc/self/cgroup"), cgroup_root)
    except OSError:
        group = None
    if group is not None and group.limit < machine.limit:
        return group
    return machine


def private_bytes(pid: int) -> int:
    """The resident memory a process holds alone (resident less shared pages): what its
    death gives back. 0 when it is gone."""
    try:
        fields = _read(f"/proc/{pid}/statm").split()
        return max(int(fields[1]) - int(fields[2]), 0) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class MemoryMonitor:
    """Asks the head for a victim when the node's memory is past the threshold (see the
    module docstring). ``check`` runs on the node's loop; ``victim`` is told the worker
    the head chose (Node.kill_worker) and ``gone`` its death."""

    def __init__(self, threshold: float, cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.threshold = threshold
        self.cgroup_root = cgroup_root
        self.victims: dict[int, float] = {}   # worker id -> when its kill was asked
        self.asked = 0.0   # when the head was asked and has not named a victim yet (0: none)
        self.near = False   # the last reading was within NEAR of the threshold, or past it

    def victim(self, worker_id: int) -> None:
        self.victims[worker_id] = time.monotonic()
        self.asked = 0.0

    def gone(self, worker_id: int) -> None:
        self.victims.pop(worker_id, None)

    def wait_s(self, refresh_s: float) -> float:
        """How long until the next check: ``refresh_s``, a FAST-th of it near the limit."""
        return refresh_s / FAST if self.near else refresh_s

    def check(self, pids: dict[int, int]) -> pb.NodeMemoryPressure | None:
        """``pids``: worker id -> pid. The pressure to report now, or None: under the
        threshold, a victim still alive, or the head asked a moment ago (it answers with
        a kill, or had no worker to kill)."""
        now = time.monotonic()
        for wid, since in list(self.victims.items()):
            if now - since > VICTIM_WAIT_S:
                del self.victims[wid]
        if self.victims or self.asked and now - self.asked < VICTIM_WAIT_S:
            return None
        r = read(self.cgroup_root)
        self.near = r.used > (self.threshold - NEAR) * r.limit
        if r.used <= self.threshold * r.limit:
            return None
        self.asked = now
        return pb.NodeMemoryPressure(
            used=r.used, limit=r.limit, threshold=self.threshold, where=r.where,
            workers={wid: private_bytes(pid) for wid, pid in pids.items() if pid})
