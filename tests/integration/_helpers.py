"""Remote functions and barriers shared by the integration tests.

Workers import this module by name (``_helpers``): pytest puts tests/integration on
sys.path, init() hands the driver's sys.path to the workers. Tasks and the driver
synchronise through files in the test's tmp_path (``Gate``), so no test sleeps to
let something happen: every wait polls for a file with a deadline.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orchestra

POLL_S = 0.005
DEADLINE_S = 60.0


def wait_for_file(path: str | Path, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:g} s")
        time.sleep(POLL_S)


def touch(path: str | Path) -> None:
    with open(path, "a"):
        pass


class Gate:
    """A task touches ``started`` and waits for ``opened``; the driver opens the gate."""

    def __init__(self, directory: str | Path, name: str = "gate") -> None:
        self.started = os.path.join(directory, f"{name}.started")
        self.opened = os.path.join(directory, f"{name}.opened")

    def wait_started(self, timeout: float = 30.0) -> None:
        wait_for_file(self.started, timeout)

    def has_started(self) -> bool:
        return os.path.exists(self.started)

    def open(self) -> None:
        touch(self.opened)


# ------------------------------------------------------------------ plain tasks

@orchestra.remote
def identity(x: Any) -> Any:
    return x


@orchestra.remote
def add(a: Any, b: Any) -> Any:
    return a + b


@orchestra.remote
def describe_arg(x: Any) -> dict[str, Any]:
    """What the task received: its type, and for containers the types of the items."""
    if isinstance(x, list):
        return {"type": "list", "items": [type(v).__name__ for v in x]}
    if isinstance(x, dict):
        return {"type": "dict", "items": {k: type(v).__name__ for k, v in x.items()}}
    if isinstance(x, Box):
        return {"type": "Box", "items": [type(x.content).__name__]}
    return {"type": type(x).__name__, "items": []}


@orchestra.remote
def get_nested(x: list[Any]) -> list[Any]:
    """Resolve the refs of a list inside the task."""
    return orchestra.get(list(x))


class Box:
    def __init__(self, content: Any) -> None:
        self.content = content


@orchestra.remote
def gated(gate: Gate, value: Any = None) -> Any:
    touch(gate.started)
    wait_for_file(gate.opened)
    return value


@orchestra.remote
def mark_then_return(marker: str, value: Any) -> Any:
    touch(marker)
    return value


@orchestra.remote
def touch_marker(marker: str, *deps: Any) -> str:
    """Leaves a file behind when it runs: proves whether a task ran at all."""
    touch(marker)
    return marker


@orchestra.remote(num_returns=3)
def three(x: int) -> tuple[int, int, int]:
    return x, x + 1, x + 2


@orchestra.remote
def pid() -> int:
    return os.getpid()


@orchestra.remote
def environment() -> dict[str, Any]:
    return {"cwd": os.getcwd(), "sys_path": list(sys.path),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu_ids": orchestra.get_gpu_ids(), "pid": os.getpid()}


@orchestra.remote
def gated_environment(gate: Gate) -> dict[str, Any]:
    touch(gate.started)
    wait_for_file(gate.opened)
    return {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu_ids": orchestra.get_gpu_ids()}


# ------------------------------------------------------------------ errors

class CustomError(Exception):
    """An exception whose constructor takes two arguments."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code

    def __str__(self) -> str:
        return f"code {self.code}: {self.args[1]}"


class UnrebuildableError(Exception):
    """Its args do not match its constructor: pickle cannot rebuild it."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")


@orchestra.remote(max_retries=0)
def raise_value_error(message: str) -> None:
    raise ValueError(message)


@orchestra.remote(max_retries=0)
def raise_custom_error(code: int) -> None:
    raise CustomError(code, "custom detail")


@orchestra.remote(max_retries=0)
def raise_unrebuildable_error(code: int) -> None:
    raise UnrebuildableError(code, "custom detail")


@orchestra.remote
def return_unpicklable() -> Any:
    import threading
    return threading.Lock()


# ------------------------------------------------------------------ crashes

@orchestra.remote(max_retries=0)
def crash(how: str) -> None:
    if how == "exit":
        os._exit(3)
    elif how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(DEADLINE_S)   # not reached: the signal ends the process


@orchestra.remote(max_retries=1)
def crash_on_first_attempt(marker: str) -> str:
    """Crashes the first time (no marker yet), succeeds on the retry."""
    if not os.path.exists(marker):
        touch(marker)
        os._exit(7)
    return "second attempt"


@orchestra.remote
def count_attempts_and_crash(directory: str) -> None:
    n = len(os.listdir(directory))
    touch(os.path.join(directory, f"attempt-{n}"))
    os._exit(9)


# ------------------------------------------------------------------ cancel

@orchestra.remote(max_retries=0)
def sleep_loop(gate: Gate) -> str:
    touch(gate.started)
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "not cancelled"


@orchestra.remote(max_retries=0)
def one_long_sleep(gate: Gate) -> str:
    touch(gate.started)
    time.sleep(DEADLINE_S)
    return "not cancelled"


@orchestra.remote(max_retries=0)
def blocked_in_io(gate: Gate) -> str:
    """Blocks reading a socket nobody writes to."""
    import socket
    a, b = socket.socketpair()
    with a, b:
        touch(gate.started)
        a.recv(1)
    return "not cancelled"


@orchestra.remote(max_retries=0)
def busy_loop(gate: Gate) -> str:
    touch(gate.started)
    deadline = time.monotonic() + DEADLINE_S
    n = 0
    while time.monotonic() < deadline:
        n += 1
    return "not cancelled"


@orchestra.remote(max_retries=0)
def uninterruptible_sleep(gate: Gate) -> str:
    """Ignores the cooperative cancel: only force=True can stop it."""
    touch(gate.started)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "not cancelled"


@orchestra.remote
def ignore(*args: Any) -> None:
    return None


@orchestra.remote(max_retries=0)
def submit_large_calls(gate: Gate) -> str:
    """Submits calls of 3.6 MB (60 inline arguments, each under the 64 KiB inline limit)
    until cancelled: its main thread is mostly inside the client's sendall when the
    cancel comes."""
    payload = b"x" * 60_000
    refs = []
    deadline = time.monotonic() + DEADLINE_S
    sent = 0
    while time.monotonic() < deadline:
        refs.append(ignore.remote(*([payload] * 60)))
        del refs[:-5]
        sent += 1
        if sent == 3:   # sending steadily now: tell the driver (and who we are)
            with open(gate.started + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(gate.started + ".tmp", gate.started)
    return "not cancelled"


# ------------------------------------------------------------------ nested

@orchestra.remote
def submit_and_get(n: int) -> list[int]:
    refs = [add.remote(i, 100) for i in range(n)]
    return orchestra.get(refs, timeout=DEADLINE_S)


@orchestra.remote
def recurse(depth: int) -> int:
    if depth == 0:
        return 0
    return orchestra.get(recurse.remote(depth - 1), timeout=DEADLINE_S) + 1


@orchestra.remote(num_cpus=2)
def whole_node_then_subtask(x: int) -> int:
    """Holds every CPU of a 2-CPU node: its subtask runs only on the CPU it lends."""
    return orchestra.get(add.remote(x, 1), timeout=DEADLINE_S)


@orchestra.remote
def put_inside(nbytes: int) -> list[Any]:
    """A ref made in a worker, returned inside a list."""
    import numpy as np
    return [orchestra.put(np.full(nbytes, 7, dtype=np.uint8))]


# ------------------------------------------------------------------ objects

@orchestra.remote
def array_sum(a: Any) -> float:
    return float(a.sum())


@orchestra.remote
def array_info(a: Any) -> dict[str, Any]:
    return {"writeable": bool(a.flags.writeable), "sum": float(a.sum()), "nbytes": int(a.nbytes)}


@orchestra.remote
def make_array(n: int) -> Any:
    import numpy as np
    return np.arange(n, dtype=np.int64)


@orchestra.remote
def fan_out(k: int) -> int:
    """Submit k subtasks and wait for them all."""
    return sum(orchestra.get([identity.remote(1) for _ in range(k)], timeout=DEADLINE_S))


@orchestra.remote
def sleep_then(seconds: float, value: Any) -> Any:
    time.sleep(seconds)
    return value


# ------------------------------------------------------------------ clusters of nodes

@contextlib.contextmanager
def joined_cluster(head: dict[str, Any], *nodes: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """A head (``head``: its add_node arguments) and nodes joined to it on this machine
    (orchestra.cluster_utils.Cluster), this process a driver of it: yields the Cluster
    and the nodes' handles; everything stops afterwards."""
    from orchestra.cluster_utils import Cluster
    if orchestra.is_initialized():
        orchestra.shutdown()
    c = Cluster(initialize_head=True, head_node_args=head)
    try:
        handles = [c.add_node(**n) for n in nodes]
        orchestra.init(address=c.address, token=c.token)
        yield (c, *handles)
    finally:
        orchestra.shutdown()
        c.shutdown()


@orchestra.remote
def node_of() -> str:
    """The node this task ran on."""
    return orchestra.get_runtime_context().get_node_id()


def _in_segment(address: int) -> bool:
    """``address`` lies in a map of a segment file (/dev/shm/orchestra-...) here."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return len(fields) == 6 and fields[5].startswith("/dev/shm/orchestra-")
    return False


@orchestra.remote
def column_sum_in_place(value: Any, name: str) -> tuple[float, bool]:
    """A table's or DataFrame's column sum, and whether the column's data was read where
    it lies in shared memory (no copy into this worker)."""
    import pyarrow as pa
    if isinstance(value, pa.Table):
        chunk = value.column(name).chunk(0)
        return float(sum(c.to_numpy().sum() for c in value.column(name).chunks)), \
            _in_segment(chunk.buffers()[1].address)
    column = value[name].to_numpy()
    return float(column.sum()), _in_segment(column.__array_interface__["data"][0])


@orchestra.remote
def make_table(rows: int) -> Any:
    import numpy as np
    import pyarrow as pa
    return pa.table({"i": np.arange(rows), "f": np.linspace(0, 1, rows),
                     "s": pa.array([f"r{k % 100}" for k in range(rows)])})
