"""The memory monitor (orchestra/_node/memory.py asks, orchestra/_scheduler/memory.py
picks) in a memory cgroup of its own, as a container's limit gives (cgroup v1 here, or
v2; made as root, else skipped with the reason): a task that grows past the limit gets
OutOfMemoryError naming the figures, the kernel's OOM killer kills nothing (the
cgroup's own count of its kills stays 0), the cluster goes on; of two tasks that do not
fit together the newest is killed and, retried, succeeds once the other is done; an
actor that grows dies with the same error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from _probes import child_env

pytestmark = pytest.mark.timeout(120)

LIMIT = 768 << 20


class MemoryCgroup:
    def __init__(self, path: Path, v2: bool) -> None:
        self.path, self.v2 = path, v2

    def oom_kills(self) -> int:
        name = "memory.events" if self.v2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0


def _make(limit: int) -> MemoryCgroup:
    """A memory cgroup limited to ``limit`` bytes (pytest.skip naming why it cannot be)."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root (CI runs as root)")
    name = f"orchestra-test-{os.getpid()}"
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists():
        path = v1 / name
        path.mkdir(exist_ok=True)
        (path / "memory.limit_in_bytes").write_text(str(limit))
        return MemoryCgroup(path, False)
    v2 = Path("/sys/fs/cgroup")
    if "memory" in (v2 / "cgroup.subtree_control").read_text().split() if \
            (v2 / "cgroup.subtree_control").exists() else False:
        path = v2 / name
        path.mkdir(exist_ok=True)
        (path / "memory.max").write_text(str(limit))
        (path / "memory.swap.max").write_text("0")
        return MemoryCgroup(path, True)
    pytest.skip("no memory cgroup controller to make a limit with (cgroup v1 memory/, or "
                "v2 with memory in cgroup.subtree_control)")


@pytest.fixture
def cgroup() -> Iterator[MemoryCgroup]:
    group = _make(LIMIT)
    try:
        yield group
    finally:
        procs = group.path / "cgroup.procs"
        for pid in procs.read_text().split():   # what a failed test left (none, normally)
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        for _ in range(100):
            try:
                group.path.rmdir()
                break
            except OSError:
                import time
                time.sleep(0.05)


def entering(group: MemoryCgroup) -> Callable[[], None]:
    """A preexec_fn that puts the new process (and all it starts) in ``group``."""
    procs = str(group.path / "cgroup.procs")

    def enter() -> None:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    return enter


def run_in(group: MemoryCgroup, script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run a driver ``script`` inside ``group``."""
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                          timeout=100, env=child_env(), preexec_fn=entering(group))


def printed(r: subprocess.CompletedProcess[str]) -> Any:
    """The JSON of the last line a driver that exited 0 printed."""
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


FILL = """
def fill(held, mb):   # grows by 8 MiB every 40 ms (200 MB/s)
    for _ in range(mb // 8):
        held.append(b"x" * (8 << 20))
        time.sleep(0.04)
    return len(held)
"""


HOG = """
import json, os, time, orchestra
from orchestra.exceptions import OutOfMemoryError, WorkerCrashedError
orchestra.init(num_cpus=2, object_store_memory=64 << 20, include_dashboard=False)

{fill}
@orchestra.remote(max_retries=0)
def hog(mb):   # past the cgroup's limit
    return fill([], mb)

@orchestra.remote
def small(x):
    return x + 1

out = []
try:
    orchestra.get(hog.remote(2048), timeout=60)
    out.append("hog finished")
except OutOfMemoryError as exc:
    out += ["OutOfMemoryError", isinstance(exc, MemoryError), isinstance(exc, WorkerCrashedError),
            str(exc)]
out.append(orchestra.get(small.remote(41), timeout=30))
print(json.dumps(out))
orchestra.shutdown()
""".replace("{fill}", FILL)


def test_a_task_past_the_limit_gets_out_of_memory_error_before_the_kernel_acts(
        cgroup: MemoryCgroup) -> None:
    name, is_memory, is_crash, text, after = printed(run_in(cgroup, HOG))
    assert (name, is_memory, is_crash, after) == ("OutOfMemoryError", True, True, 42)
    assert "task __main__.hog() ran out of memory" in text and "killed by the memory monitor" in text
    assert "of 0.75 GiB" in text and "past its threshold of 95%" in text, text
    assert "cgroup v" in text and "this process held" in text
    assert cgroup.oom_kills() == 0   # the kernel's OOM killer never ran


TWO = """
import json, sys, time, orchestra
orchestra.init(num_cpus=2, object_store_memory=64 << 20, include_dashboard=False)
ATTEMPTS = sys.argv[1]

{fill}
@orchestra.remote(max_retries=6)
def grow(tag, mb, hold_s):   # about 0.6 of the limit each: two do not fit together
    with open(ATTEMPTS, "a") as f:
        f.write(tag + "\\n")   # one line per attempt
    held = []
    fill(held, mb)
    time.sleep(hold_s)
    return len(held)

first = grow.remote("first", 448, 1.5)
time.sleep(0.3)
second = grow.remote("second", 448, 0.0)   # the newest: the monitor's victim
print(json.dumps([orchestra.get(first, timeout=90), orchestra.get(second, timeout=90)]))
orchestra.shutdown()
""".replace("{fill}", FILL)


def test_of_two_tasks_that_do_not_fit_together_the_newest_is_killed_and_retried(
        cgroup: MemoryCgroup, tmp_path: Path) -> None:
    attempts = tmp_path / "attempts"
    assert printed(run_in(cgroup, TWO, str(attempts))) == [56, 56]
    ran = attempts.read_text().split()
    assert ran.count("first") == 1 and ran.count("second") >= 2, ran
    assert cgroup.oom_kills() == 0


LENT = """
import json, time, orchestra
orchestra.init(num_cpus=2, object_store_memory=64 << 20, include_dashboard=False)

{fill}
@orchestra.remote(max_retries=10)
def grow(mb):
    return fill([], mb)

@orchestra.remote
def noop():
    return 0

orchestra.get([noop.remote() for _ in range(1000)])   # its workers are lent to it now
print(json.dumps(orchestra.get([grow.remote(400) for _ in range(4)], timeout=150)))
orchestra.shutdown()
""".replace("{fill}", FILL)


def test_workers_lent_to_the_driver_are_victims_too(cgroup: MemoryCgroup) -> None:
    """A driver's tasks on workers lent to it run as direct calls the head does not see:
    the monitor's victims all the same (they were not, and the kernel killed 4)."""
    assert printed(run_in(cgroup, LENT)) == [50] * 4
    assert cgroup.oom_kills() == 0


ACTOR = """
import json, time, orchestra
from orchestra.exceptions import ActorDiedError, OutOfMemoryError
orchestra.init(num_cpus=2, object_store_memory=64 << 20, include_dashboard=False)

{fill}
@orchestra.remote
class Cache:
    def __init__(self):
        self.held = []
    def grow(self, mb):
        return fill(self.held, mb)

c = Cache.remote()
out = []
try:
    orchestra.get(c.grow.remote(2048), timeout=60)
except OutOfMemoryError as exc:
    out += ["OutOfMemoryError", "ran out of memory" in str(exc)]
try:
    orchestra.get(c.grow.remote(16), timeout=30)
except ActorDiedError as exc:
    out += ["ActorDiedError", "memory monitor" in str(exc)]
print(json.dumps(out))
orchestra.shutdown()
""".replace("{fill}", FILL)


def test_an_actor_that_grows_past_the_limit_dies_of_out_of_memory_error(
        cgroup: MemoryCgroup) -> None:
    assert printed(run_in(cgroup, ACTOR)) == [
        "OutOfMemoryError", True, "ActorDiedError", True]
    assert cgroup.oom_kills() == 0


JOINED_HOG = """
import json, sys, time, orchestra
from orchestra.exceptions import OutOfMemoryError
orchestra.init(address=sys.argv[1], token=sys.argv[2])

{fill}
@orchestra.remote(max_retries=0, resources={"far": 1})
def hog(mb):
    fill([], mb)
    return orchestra.get_runtime_context().get_node_id()

try:
    orchestra.get(hog.remote(2048), timeout=60)
    print(json.dumps(["hog finished"]))
except OutOfMemoryError as exc:
    print(json.dumps(["OutOfMemoryError", str(exc)]))
orchestra.shutdown()
""".replace("{fill}", FILL)


def test_a_joined_nodes_monitor_asks_the_head_over_the_network(
        cgroup: MemoryCgroup, state: str) -> None:
    """The joined node (its process and workers in the cgroup; the head outside it)
    reports its pressure to the head as a NodeEvent, and the head kills its worker."""
    from _cli import REPO, SMALL, cli, start_head
    head = start_head(state)
    try:
        joined = subprocess.run(
            [sys.executable, "-m", "orchestra._cli", "start", "--address", head["address"],
             "--token", head["token"], *SMALL, "--resources", '{"far": 1}'],
            capture_output=True, text=True, timeout=60, preexec_fn=entering(cgroup),
            env=dict(os.environ, PYTHONPATH=REPO))
        assert joined.returncode == 0, joined.stderr
        name, text = printed(subprocess.run(
            [sys.executable, "-c", JOINED_HOG, head["address"], head["token"]],
            capture_output=True, text=True, timeout=100, env=child_env()))
        assert name == "OutOfMemoryError" and "killed by the memory monitor" in text, text
        assert f"cgroup v{2 if cgroup.v2 else 1} /{cgroup.path.name}" in text
        assert "node 0000000000000000" not in text   # the joined node's, not the head's
        assert cgroup.oom_kills() == 0
    finally:
        cli("stop")
