"""The worker processes of one node: started, watched and killed on the node's behalf.

    Node.start_worker -> WorkerPool.start -> spawning thread -> Zygote.spawn (a fork of
    the pre-imported fork server, orchestra/_worker/zygote.py) or, without one, Popen of
    ``python -m orchestra._worker`` -> procs[worker id] (ForkedWorker or Popen)
    zygote reply pipe -> Zygote._read thread -> ForkedWorker.pid / .returncode

Owns every worker process it started, and the fork server it adopted: kill_all() kills
them and waits (bounded) for them to exit. on_failed runs on the spawning thread; the
node hands it to its loop.
"""
from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from .._platform.procutil import kill_group

# A fork server started (_platform/bootstrap.py, _node/process.py): its process, the
# pipe requests go in and the pipe answers come out of.
ZygoteStart = tuple[subprocess.Popen[bytes], int, int]


class ForkedWorker:
    """A worker forked by the zygote, with the part of Popen's interface the pool uses."""

    def __init__(self) -> None:
        self.pid = 0                        # known once the zygote answers
        self.returncode: int | None = None
        self.exited = threading.Event()
        self.kill_on_pid = False            # killed before its pid was known

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        if not self.pid:
            self.kill_on_pid = True
            return
        if self.returncode is None:   # the worker and its group (what its tasks started)
            try:
                os.killpg(self.pid, signal.SIGKILL)
                return
            except (ProcessLookupError, PermissionError):   # no group of its own (yet)
                pass
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> int | None:
        if not self.exited.wait(timeout):
            raise subprocess.TimeoutExpired("worker", timeout or 0)
        return self.returncode



# A worker's process: started by exec, or forked by the zygote.
WorkerProc = subprocess.Popen[bytes] | ForkedWorker

def _kill(p: WorkerProc) -> None:
    """Kill a live worker with its process group (a Popen worker leads a session of its
    own, a forked one a group: ForkedWorker.kill)."""
    if p.poll() is not None:
        return
    if isinstance(p, ForkedWorker):
        p.kill()
    else:
        kill_group(p.pid)


class Zygote:
    """The fork server (orchestra/_worker/zygote.py) and the thread reading its replies."""

    def __init__(self, proc: subprocess.Popen[bytes], req_w: int, rep_r: int) -> None:
        # Started by the head's bootstrap (orchestra/_platform/bootstrap.py) before the head's
        # imports; req_w / rep_r: the head's ends of its request and reply pipes.
        self.proc, self.req_w, self.rep_r = proc, req_w, rep_r
        self.children: dict[int, ForkedWorker] = {}   # worker id -> child
        self.by_pid: dict[int, ForkedWorker] = {}
        self.lock = threading.Lock()
        self.alive = True
        threading.Thread(target=self._read, name="orchestra-zygote", daemon=True).start()

    def spawn(self, worker_id: int) -> ForkedWorker:
        child = ForkedWorker()
        with self.lock:
            self.children[worker_id] = child
        os.write(self.req_w, f"spawn {worker_id}\n".encode())
        return child

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = os.read(self.rep_r, 4096)
            except OSError:
                data = b""
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                parts = line.split()
                with self.lock:
                    if parts[0] == b"pid":
                        child = self.children.pop(int(parts[1]), None)
                        if child is not None:
                            child.pid = int(parts[2])
                            self.by_pid[child.pid] = child
                            if child.kill_on_pid:
                                child.kill()
                    elif parts[0] == b"exit":
                        child = self.by_pid.pop(int(parts[1]), None)
                        if child is not None:
                            child.returncode = int(parts[2])
                            child.exited.set()
        # The zygote is gone, and its workers with it (parent-death signal).
        self.alive = False
        with self.lock:
            for child in list(self.children.values()) + list(self.by_pid.values()):
                if child.returncode is None:
                    child.returncode = -signal.SIGKILL
                child.exited.set()

    def preload(self, modules: list[str], now: bool = True) -> None:
        """Have the zygote import ``modules``: workers forked later start with them.
        ``now=False``: only note them, for the workers forked from now on to import in
        their first idle moment (before the zygote itself has them)."""
        try:
            os.write(self.req_w, f"{'preload' if now else 'later'} {' '.join(modules)}\n".encode())
        except OSError:
            pass

    def close(self) -> None:
        try:
            os.close(self.req_w)
        except OSError:
            pass
        self.proc.kill()
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            pass


class WorkerPool:
    """Starts, watches and kills the worker processes of one node.

    Processes start on a thread of their own: a fork+exec costs the caller ~10-50 ms
    (more with many starting at once), which would stall every connection of the head
    (200 actors created in a row held the loop for seconds).
    """

    def __init__(self, sock_path: str, cwd: str, env: dict[str, str],
                 on_failed: Callable[[int, str], None]) -> None:
        self.sock_path = sock_path
        self.cwd = cwd
        self.env = env
        self.on_failed = on_failed        # called on the spawning thread
        self.procs: dict[int, WorkerProc] = {}
        self.lock = threading.Lock()
        self.kill_requested: set[int] = set()
        self.closed = False
        self.spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="orchestra-spawn")
        self.zygote: Zygote | None = None

    def start(self, worker_id: int) -> None:
        self.spawner.submit(self._spawn, worker_id)

    def adopt_zygote(self, zygote: Zygote) -> None:
        """Fork workers from this pre-imported process from now on (see _worker/zygote.py)."""
        self.zygote = zygote

    def _spawn(self, worker_id: int) -> None:
        proc: WorkerProc
        try:
            z = self.zygote
            if z is not None and z.alive and not self.closed:
                proc = z.spawn(worker_id)
            else:
                # A session (and group) of its own, as a forked worker has: killed, it
                # takes what its tasks started along (kill, kill_all).
                proc = subprocess.Popen(
                    [sys.executable, "-m", "orchestra._worker", self.sock_path, str(worker_id)],
                    stdin=subprocess.DEVNULL, cwd=self.cwd if os.path.isdir(self.cwd) else None,
                    env=self.env, close_fds=True, start_new_session=True)
        except OSError as exc:
            self.on_failed(worker_id, str(exc))
            return
        with self.lock:
            self.procs[worker_id] = proc
            doomed = self.closed or worker_id in self.kill_requested
        if doomed:
            proc.kill()

    def snapshot(self) -> list[tuple[int, WorkerProc]]:
        with self.lock:
            return list(self.procs.items())

    def kill(self, worker_id: int) -> None:
        with self.lock:
            p = self.procs.get(worker_id)
            if p is None:   # still starting: killed as soon as it exists
                self.kill_requested.add(worker_id)
                return
        _kill(p)

    def kill_all(self, timeout_s: float = 2.0) -> None:
        with self.lock:
            self.closed = True
        self.spawner.shutdown(wait=True, cancel_futures=True)
        for p in self.procs.values():
            _kill(p)
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            if not p.pid:
                continue   # not forked yet: dies with the zygote below
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if self.zygote is not None:
            self.zygote.close()   # its remaining children die with it
