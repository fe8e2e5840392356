"""Worker fork server: one process with the worker's modules imported, forking workers.

    head --"spawn <worker id>\\n"--> zygote --fork--> worker (runs _worker.main)
    head --"preload <module> ...\\n"--> zygote   (imports them: later workers have them)
    head --"later <module> ...\\n"--> zygote     (notes them: workers forked before the
        preload import them themselves, in their first idle moment: import_later())
    head <--"pid <worker id> <pid>\\n" / "exit <pid> <returncode>\\n"-- zygote

Starting a worker with fork+exec costs ~0.2 s of CPU (the interpreter and orchestra's
imports) and a private copy of every module; a fork of this process costs ~2 ms and
shares the imported code copy-on-write. The zygote never creates a gRPC channel or a
thread of its own before forking (fork and gRPC do not mix); a preloaded numpy's BLAS
pool stops its threads across a fork and starts them again in the child that uses it.
The requests and replies travel on two pipes passed as fds; stdin/stdout/stderr stay
the driver's, for the workers' prints. The zygote dies with the head (parent-death
signal, or EOF on the request pipe), and its workers die with it.
"""
from __future__ import annotations

import os
import select
import signal
import sys

from .preload import LATER, preload


def _returncode(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sock_path, req_fd, rep_fd = argv[0], int(argv[1]), int(argv[2])
    from .._platform.procutil import die_with_parent
    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .._platform.proctitle import set_title
    from . import worker as _worker
    set_title("orchestra::forkserver")
    # SIGCHLD wakes the select through this pipe: exits are reported at once.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    buf = b""
    while True:
        ready, _, _ = select.select([req_fd, wake_r], [], [], 1.0)
        _reap(rep_fd)
        if wake_r in ready:
            os.read(wake_r, 4096)
        if req_fd not in ready:
            continue
        data = os.read(req_fd, 4096)
        if not data:       # the head is gone
            os._exit(0)
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"preload"):
                preload(line.decode().split()[1:])
                continue
            if line.startswith(b"later"):
                LATER[:] = line.decode().split()[1:]
                continue
            worker_id = int(line.split()[1])
            pid = os.fork()
            if pid == 0:
                # A group of its own: the processes its tasks start go with it (_reap).
                os.setpgid(0, 0)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (req_fd, rep_fd, wake_r, wake_w):
                    os.close(fd)
                try:
                    _worker.main([sock_path, str(worker_id)])
                finally:
                    os._exit(1)
            try:   # the child does it too: whichever runs first, the group exists
                os.setpgid(pid, pid)
            except OSError:   # it did (and may have run already) or died
                pass
            _tell(rep_fd, f"pid {worker_id} {pid}\n")


def _tell(rep_fd: int, line: str) -> None:
    """Write a reply; the head gone (its end of the pipe closed: killed, this process's
    parent-death signal not come yet), end quietly, as at EOF on the requests (a
    BrokenPipeError's traceback went to the cluster's log)."""
    try:
        os.write(rep_fd, line.encode())
    except BrokenPipeError:
        os._exit(0)


def _reap(rep_fd: int) -> None:
    """Report each worker that exited, after killing what is left of its process group
    (the processes its tasks started: loky's workers and resource tracker outlived the
    cluster under pid 1, with their /dev/shm entries). Killed before the worker is
    reaped: its zombie keeps its pid, the group's id, from being reused meanwhile."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or not info.si_pid:
            return
        try:   # (as _procutil.kill_group: not imported, this process imports little)
            os.killpg(info.si_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        pid, status = os.waitpid(info.si_pid, 0)
        _tell(rep_fd, f"exit {pid} {_returncode(status)}\n")


if __name__ == "__main__":
    main()
