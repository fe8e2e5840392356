"""Process titles, so `ps` and `top` say what each process of a cluster runs.

    orchestra::head, orchestra::node, orchestra::forkserver, orchestra::supervisor (the
    head's, under `orchestra start --head`)
    orchestra::worker (idle), orchestra::worker square (running square)
    orchestra::actor Counter (idle), orchestra::actor Counter.incr (running a method)

setproctitle rewrites the command line (`ps`, /proc/PID/cmdline) and the kernel's short
name (/proc/PID/comm, what `top` shows, first 15 bytes); without it only the short name
is set (prctl PR_SET_NAME). One title costs ~1 us (measured here); a worker sets one
only when it changes (another function, or idle for 0.1 s), so a stream of the same
task, or a get() loop of one task at a time, pays nothing per task.
"""
from __future__ import annotations

from collections.abc import Callable

_set: Callable[[str], None] | None = None


def _prctl_name(title: str) -> None:
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, title.encode()[:15], 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def set_title(title: str) -> None:
    """Make ``title`` this process's title (command line and short name)."""
    global _set
    if _set is None:
        try:
            from setproctitle import setproctitle
            _set = setproctitle
        except ImportError:
            _set = _prctl_name
    _set(title)
