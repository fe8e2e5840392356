"""Processes (Linux): fate-sharing with a parent, and what /proc says of a process (its
state, parent and group), read in one place for the product and its tests."""
from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import NamedTuple

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies.

    Set from the child itself (no preexec_fn: unsafe once the parent has threads).
    If the parent already died before this call, exit now.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent or parent == 1:
        os._exit(1)


_PARENT_POLL_S = 0.5


def watch_parent(loop: asyncio.AbstractEventLoop, on_exit: Callable[[], None]) -> None:
    """Call ``on_exit`` on ``loop`` once the parent *process* exits.

    Not PR_SET_PDEATHSIG: that signal follows the parent's thread, so a driver that
    called init() from a thread that then ended lost its head ~1.5 s later, with the
    whole cluster. A pidfd becomes readable when the process (every thread) is gone;
    where there is none (Linux < 5.3), the parent pid is polled.
    """
    parent = os.getppid()
    _watch(loop, parent, lambda: os.getppid() == parent and parent != 1, on_exit)


def watch_pid(loop: asyncio.AbstractEventLoop, pid: int, on_exit: Callable[[], None]) -> None:
    """Call ``on_exit`` on ``loop`` once process ``pid`` (not a parent: the script that
    started a cluster_utils.Cluster, say) exits, as watch_parent does."""
    def alive() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    _watch(loop, pid, alive, on_exit)


def _watch(loop: asyncio.AbstractEventLoop, pid: int, alive: Callable[[], bool],
           on_exit: Callable[[], None]) -> None:
    """Its pidfd, read on ``loop``; without one, ``alive`` polled."""
    try:
        fd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if not alive():   # it died before the watch began
        if fd is not None:
            os.close(fd)
        loop.call_soon(on_exit)
        return
    if fd is not None:
        def readable() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            on_exit()
        loop.add_reader(fd, readable)
        return

    def poll() -> None:
        if not alive():
            on_exit()
        else:
            loop.call_later(_PARENT_POLL_S, poll)
    loop.call_later(_PARENT_POLL_S, poll)


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group ``pgid`` (a worker leads its own: what its tasks
    started, loky's or multiprocessing's workers among them, goes with it). Call it
    while the leader's pid cannot be reused: before it is reaped (_zygote._reap), or
    while it lives."""
    if pgid <= 1:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ProcStat(NamedTuple):
    """A process's state letter (R, S, Z, ...), parent pid and process group, from
    /proc/PID/stat."""

    state: str
    ppid: int
    pgid: int


def proc_stat(pid: int | str) -> ProcStat | None:
    """What /proc says of process ``pid`` now; None when it is gone (or unreadable).
    The command name may hold spaces and parentheses: the fields follow its last ")"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return ProcStat(fields[0], int(fields[1]), int(fields[2]))
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    st = proc_stat(pid)
    return st is None or st.state not in ("Z", "X")


def all_stats() -> dict[int, ProcStat]:
    """Every process this one can see, by pid."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(name)
            if st is not None:
                out[int(name)] = st
    return out


def process_tree(root: int) -> set[int]:
    """``root`` and every process below it now (each process's parent, from /proc)."""
    children: dict[int, list[int]] = {}
    for pid, st in all_stats().items():
        children.setdefault(st.ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    return sorted(pid for pid, st in all_stats().items()
                  if st.pgid == pgid and st.state not in ("Z", "X"))
