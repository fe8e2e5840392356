"""Starting a local head: its configuration from init()'s (or ``orchestra start``'s)
arguments, the object store's size, the session's directory, and the head process.

    build_cfg(...) -> checked config (+ a warning when /dev/shm is small) ->
    new_session_dir(cfg) -> a directory of its own (0700) -> launch_head(cfg) -> the head
    process, its bootstrap first (_platform/bootstrap.py)

Used by init() (session.py) and by ``orchestra start --head`` (_cluster/launch.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from .._checks import is_int
from .._node.memory import settings as memory_settings
from .._objects.segments import SHM_DIR, sweep_stale_segments
from .._objects.store import huge_pages_dir, pool_settings
from .._platform.bootstrap import BOOTSTRAP as HEAD_BOOTSTRAP
from .._platform.gpus import detect_num_gpus
from .._platform.procutil import pid_alive
from .._resources import make_request

SESSION_PREFIX = "orchestra-session-"


# Imported by the fork server when the driver has the first (see _worker/zygote.py): a driver
# with numpy makes large objects, and reading one takes pyarrow (their Arrow streams).
_PRELOAD = {"numpy": ("numpy", "pyarrow.ipc"), "pyarrow": ("pyarrow.ipc",), "pandas": ("pandas",)}


_GiB = 1 << 30


def _shm_free() -> int | None:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


_MEMORY_SHARE = 0.7


def _ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * _GiB


def store_memory(asked: int | None, ram: int, shm_free: int | None) -> tuple[int, str]:
    """The object store's size, and a warning when /dev/shm cannot hold what it should.

    Default: 30% of RAM, bounded by 90% of what /dev/shm has free. A /dev/shm smaller
    than that and than 2 GiB (containers mount 64 MiB by default) is said once: the
    store shrinks to fit it and what does not fit spills to disk, which is slower.
    """
    if shm_free is None:
        return (asked if asked is not None else max(64 << 20, int(ram * 0.3))), ""
    fits = int(shm_free * 0.9)
    if asked is not None:
        if asked <= shm_free:
            return asked, ""
        return asked, (f"object_store_memory={_fmt(asked)} is more than the {_fmt(shm_free)} "
                       f"free in {SHM_DIR}: puts fail with ObjectStoreFullError once "
                       f"{SHM_DIR} is full. Pass a smaller object_store_memory or free "
                       f"{SHM_DIR}.")
    want = max(64 << 20, int(ram * 0.3))
    if fits >= want or fits >= 2 * _GiB:
        return min(want, fits), ""
    size = max(fits, 16 << 20)
    return size, (f"{SHM_DIR} has only {_fmt(shm_free)} free (containers mount 64 MiB by "
                  f"default), so the object store gets {_fmt(size)} instead of "
                  f"{_fmt(want)}; objects beyond that spill to disk, which is slower. Give "
                  f"the machine more shared memory (docker run --shm-size=8g) or pass "
                  f"object_store_memory=... to orchestra.init().")


def _fmt(n: float) -> str:
    return f"{n / _GiB:.1f} GiB" if n >= _GiB else f"{n / (1 << 20):.0f} MiB"


def sweep_stale_sessions() -> None:
    """Remove session directories and segments that crashed sessions left behind."""
    sweep_stale_segments()
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        if not name.startswith(SESSION_PREFIX):
            continue
        path = os.path.join(tmp, name)
        try:
            with open(os.path.join(path, "head.pid")) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def build_cfg(*, num_cpus: int | None = None, num_gpus: int | None = None,
              resources: dict[str, float] | None = None, object_store_memory: int | None = None,
              spill_dir: str | os.PathLike[str] | None = None, include_dashboard: bool = True,
              dashboard_port: int | None = None,
              system_config: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The head's configuration from init()'s (or ``orchestra start``'s) arguments, checked,
    and the warning to give when /dev/shm is too small ("" when it is not).

    The session's own keys (session_dir, session_id, spill_dir) are added by
    new_session_dir(); ``orchestra start --head`` adds listen, token, detached, joinable.
    """
    if num_cpus is not None and (not is_int(num_cpus)):
        raise TypeError(f"num_cpus must be an int, got {num_cpus!r}")
    if num_gpus is not None and (not is_int(num_gpus)):
        raise TypeError(f"num_gpus must be an int, got {num_gpus!r}")
    cpus = (os.cpu_count() or 1) if num_cpus is None else num_cpus
    # None: the GPUs this machine has (CUDA_VISIBLE_DEVICES, else nvidia-smi; 0 without).
    gpus = detect_num_gpus() if num_gpus is None else num_gpus
    req = make_request(cpus, gpus, resources, default_cpus=0)
    if object_store_memory is not None and (
            not is_int(object_store_memory)
            or object_store_memory <= 0):
        raise ValueError(f"object_store_memory must be a positive number of bytes, got "
                         f"{object_store_memory!r}")
    if spill_dir is not None:
        spill_dir = os.path.abspath(os.fspath(spill_dir))
        if not os.path.isdir(spill_dir):
            raise ValueError(f"spill_dir {spill_dir!r} is not a directory: create it first, "
                             "or leave spill_dir out to spill under the session's directory")
        if not os.access(spill_dir, os.W_OK | os.X_OK):
            raise ValueError(f"spill_dir {spill_dir!r} is not writable by this user")
    _check_dashboard(include_dashboard, dashboard_port)
    # The node reads these from the environment it inherits: refused here, with the
    # setting's name, rather than by a head that fails to start.
    pool_settings(os.environ)
    huge_pages_dir(os.environ)
    memory_settings(os.environ)
    store, warning = store_memory(object_store_memory, _ram(), _shm_free())
    # The node's "memory" (what tasks' and actors' memory= hold): 70% of RAM beside the
    # object store, as Ray counts it.
    req["memory"] = float(max(int(_ram() * _MEMORY_SHARE) - store, 0))
    cfg = {
        # None: under the session's directory (new_session_dir() decides).
        "_spill_root": spill_dir,
        "resources": req,
        "num_workers": max(int(cpus), 1),
        "include_dashboard": include_dashboard,
        "dashboard_port": dashboard_port,
        "object_store_memory": store,
        "cwd": os.getcwd(),
        "sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path],
        # Heavy modules the driver has imported: the fork server imports them too once
        # the cluster is idle, so that workers started later have them.
        "preload": sorted({m for k, ms in _PRELOAD.items() if k in sys.modules for m in ms}),
        # The node (store, workers, fork server) in a process of its own instead of the
        # head's (_node/process.py): _system_config={"node_process": True}, or this
        # variable for a whole run (tests of the default mode in that mode).
        **({"node_process": True} if os.environ.get("ORCHESTRA_NODE_PROCESS") == "1" else {}),
        # Under the Ray runner (orchestra.compat.ray sets the variable) a request no node
        # can hold stays pending with a warning, as in Ray, instead of failing at submit.
        **({"infeasible_waits": True} if os.environ.get("ORCHESTRA_RAY_COMPAT") == "1" else {}),
        **(system_config or {}),
    }
    return warning, cfg


def _check_dashboard(include: object, port: object) -> None:
    if not isinstance(include, bool):
        raise TypeError(f"include_dashboard must be True or False, got {include!r}")
    if port is not None and (not is_int(port)
                             or not 0 <= port < 65536):
        raise ValueError(f"dashboard_port must be a port number 0..65535 (0: any free port) "
                         f"or None (8265, else any free port), got {port!r}")


def new_session_dir(cfg: dict[str, Any]) -> str:
    """Make the session's directory (mode 0700: only this user) and fill in cfg's
    session_dir, session_id and spill_dir."""
    session_dir = tempfile.mkdtemp(prefix=SESSION_PREFIX)
    session_id = os.path.basename(session_dir)[len(SESSION_PREFIX):]
    spill_root = cfg.pop("_spill_root", None)
    cfg["session_dir"] = session_dir
    cfg["session_id"] = session_id
    # Spill files live in a directory of their own, removed at shutdown (and with the
    # session directory by the next init() when the session crashed).
    cfg["spill_dir"] = (os.path.join(session_dir, "spill") if spill_root is None
                        else os.path.join(spill_root, f"orchestra-spill-{session_id}"))
    return session_dir


def launch_head(cfg: dict[str, Any], *, stdout: Any = None, stderr: Any = None,
                new_session: bool = True, keeper_pid: int = 0) -> subprocess.Popen[bytes]:
    """Write cfg into its session directory and start the head on it (its pid in
    head.pid, for the sweep of crashed sessions; ``keeper_pid``'s instead, for a head
    whose supervisor keeps the session between two of its runs). A session of its own
    (``new_session``): Ctrl-C in the driver's terminal reaches the driver only; a
    supervised head stays in its supervisor's process group."""
    session_dir = cfg["session_dir"]
    cfg_path = os.path.join(session_dir, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    # cwd = the session directory: `-m` and `-c` put the cwd first on sys.path, and the
    # head must import the driver's orchestra, not an orchestra/ folder that happens to
    # be here. The head starts with its bootstrap, which starts the fork server first.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(cfg["sys_path"])
    if cfg.get("token"):
        # The head's workers take direct calls from other nodes over TCP with it (the
        # fork server, started first, hands its environment down; never a command line).
        env["ORCHESTRA_TOKEN"] = cfg["token"]
    sock = os.path.join(session_dir, "head.sock")
    # A node in a process of its own starts the fork server itself (_head/remote_node.py).
    cmd = ([sys.executable, "-c", HEAD_BOOTSTRAP, cfg_path, sock]
           if cfg.get("zygote", True) and not cfg.get("node_process")
           else [sys.executable, "-m", "orchestra._head", cfg_path])
    head = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                            start_new_session=new_session, close_fds=True, cwd=session_dir,
                            env=env)
    with open(os.path.join(session_dir, "head.pid"), "w") as f:
        f.write(str(keeper_pid or head.pid))
    return head
