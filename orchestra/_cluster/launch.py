"""Starting and stopping a cluster's processes on this machine: the launch functions of
``orchestra start``/``stop`` (_cli/cluster.py) and of Cluster (cluster_utils.py).

    start_head(state, ...) -> cfg (local_head.build_cfg + listen, token, detached,
        joinable) -> head process (a session of its own: no fate-sharing with the
        caller) -> ready once HOST:PORT accepts and authenticates -> record
    start_node(state, head_address, token, ...) -> cfg -> ``_node_process --join``
        -> ready once <session_dir>/node.json appears -> record
    stop(record) -> SIGTERM, bounded wait, SIGKILL -> session and run directories
        removed, segments of dead processes swept

Each started process writes its stdout and stderr to its run directory's stderr.log
(or to the caller's when ``log=False``, for ``--block`` in a container whose logs are
its output); a start that fails raises LaunchError with the tail of that log and, for a
node, what it means (a wrong token, an unreachable head).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

from .._api import local_head
from .._head import state_store as _store
from .._objects.segments import sweep_stale_segments
from .._platform.bootstrap import JOIN_BOOTSTRAP
from .._platform.procutil import pid_alive
from .._protocol import tls as _tls
from .._protocol.auth import connect_secure, new_token
from .._runtime import cluster_file as cf
from ..exceptions import AuthenticationError, OrchestraError

DEFAULT_PORT = 6380
DEFAULT_HOST = "127.0.0.1"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
NODE_SESSION_PREFIX = "orchestra-joined-"
_POLL_S = 0.02
# A node or driver that loses the head tries to reach it again this long (as Ray's
# raylets wait for their GCS); its supervisor starts a dead head again in ~0.5 s.
RECONNECT_TIMEOUT_S = 60.0
_TAIL = 2000


class LaunchError(OrchestraError):
    """A head or node did not start; the message says why and what to do."""


@dataclass
class Started:
    """A process started here: what its record holds."""
    kind: str               # "head" or "node"
    pid: int
    session_dir: str
    address: str            # the head's IP:PORT (for a node: the head it joined)
    token: str
    run_dir: str
    node_id: int = 0        # the head's own node is 0
    node_hex: str = ""
    proc: subprocess.Popen[bytes] | None = None   # None when read back from a record

    def record(self) -> dict[str, Any]:
        from .._protocol import pki
        own = pki.current()
        return {"kind": self.kind, "pid": self.pid, "session_dir": self.session_dir,
                "address": self.address, "token": self.token, "node_id": self.node_id,
                "node_hex": self.node_hex, "started": time.time(),
                # On certificates of its own: their paths, for init(address="auto").
                "tls_files": [own.cert, own.key, own.ca] if own is not None else None}


def split_address(address: str) -> tuple[str, int]:
    """("IP", PORT) of "IP:PORT" ("[v6]:PORT" too); ValueError naming the bad address."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address {address!r} is not IP:PORT (e.g. 10.0.0.5:{DEFAULT_PORT}); "
                         "`orchestra start --head` prints the address to use")
    return host, int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def routable_ip(towards: str = "10.255.255.255") -> str:
    """This machine's address on the route to ``towards`` (no packet is sent): what a
    head listening on 0.0.0.0 tells nodes to use, and what a node binds by default."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((towards, 9))
            return str(s.getsockname()[0])
    except OSError:
        return DEFAULT_HOST


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _log_file(run_dir: str, log: bool) -> BinaryIO | None:
    if not log:
        return None
    return open(os.path.join(run_dir, cf.LOG), "wb")


def _child_env(sys_path: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys_path)
    return env


# ---------------------------------------------------------------------------- the head

def head_cfg(*, host: str, port: int, token: str, num_cpus: int | None = None,
             num_gpus: int | None = None, resources: dict[str, float] | None = None,
             object_store_memory: int | None = None, include_dashboard: bool = True,
             dashboard_port: int | None = None,
             system_config: dict[str, Any] | None = None,
             owner_pid: int = 0, owner_dir: str = "") -> tuple[str, dict[str, Any]]:
    """The cluster head's cfg: init()'s, listening on HOST:PORT with the token, owned by
    no driver (runs until SIGTERM) and open to nodes. Also the /dev/shm warning.
    ``owner_pid``: stop when that process exits, and then remove ``owner_dir``."""
    warning, cfg = local_head.build_cfg(num_cpus=num_cpus, num_gpus=num_gpus,
                                      resources=resources,
                                      object_store_memory=object_store_memory,
                                      include_dashboard=include_dashboard,
                                      dashboard_port=dashboard_port,
                                      system_config=system_config)
    cfg.update(listen=join_address(host, port), token=token, detached=True, joinable=True)
    if owner_pid:   # stops when that process exits (cluster_utils.Cluster)
        cfg["owner_pid"] = owner_pid
        if owner_dir:
            cfg["owner_dir"] = owner_dir
    return warning, cfg


def start_head(state: str, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
               token: str | None = None, num_cpus: int | None = None,
               num_gpus: int | None = None, resources: dict[str, float] | None = None,
               object_store_memory: int | None = None, include_dashboard: bool = True,
               dashboard_port: int | None = None,
               system_config: dict[str, Any] | None = None, log: bool = True,
               timeout_s: float = READY_TIMEOUT_S, owner_pid: int = 0,
               state_store: str | None = None, supervise: bool = False,
               reconnect_timeout_s: float = RECONNECT_TIMEOUT_S,
               tls: bool | None = None) -> Started:
    """Start a cluster head listening on HOST:PORT; return once it authenticates a
    connection (LaunchError with its log's tail if it exits or stays silent). Its
    dashboard (include_dashboard, dashboard_port: as init()'s) binds HOST too, and asks
    for the token beyond loopback. ``state_store``: the head's durable state
    (_head/state_store.py; default: <state>/head-PORT.db, none for port 0): a head
    started again on it serves the same cluster, with the same token unless ``token``
    says another. ``supervise``: the process started (and recorded) is the head's
    supervisor (_cluster/supervisor.py), which starts the head again when it dies, and
    whose drivers wait ``reconnect_timeout_s`` for it to come back (_runtime/reconnect.py).
    ``tls``: whether the cluster speaks TLS (_protocol/tls.py; default: when HOST is not
    loopback); its token then starts with "tls-", which tells every process so."""
    probe = DEFAULT_HOST if host in ("0.0.0.0", "::", "") else host
    if port and _answers(probe, port):
        raise LaunchError(_taken(port, probe))
    url = state_store or (_store.default_url(state, port) if port else "")
    if url:
        try:
            store = _store.open_store(url)
            try:
                stored = store.get(_store.CLUSTER, "token")
            finally:
                store.close()
        except _store.StateStoreError as exc:
            raise LaunchError(str(exc)) from exc
        token = token or (stored.decode() if stored else None)
    token = token or new_token()
    if tls is None:
        tls = not _tls.is_loopback(host)
    token = _tls.tls_token(token) if tls else token.removeprefix(_tls.PREFIX)
    warning, cfg = head_cfg(host=host, port=port, token=token, num_cpus=num_cpus,
                            num_gpus=num_gpus, resources=resources,
                            object_store_memory=object_store_memory,
                            include_dashboard=include_dashboard,
                            dashboard_port=dashboard_port, system_config=system_config,
                            owner_pid=owner_pid, owner_dir=state if owner_pid else "")
    if url:
        cfg["state_store"] = url
        # Who holds the store's lease: this head, and a restart of it with this cfg.
        cfg["state_holder"] = f"head {socket.gethostname()}:{port} ({new_token()[:8]})"
    if warning:
        print(f"orchestra: {warning}", file=sys.stderr)
    local_head.sweep_stale_sessions()
    session_dir = local_head.new_session_dir(cfg)
    run_dir = cf.new_run_dir(state, "head")
    out = _log_file(run_dir, log)
    try:
        if supervise:
            cfg["reconnect_timeout_s"] = float(reconnect_timeout_s)
            proc = _launch_supervisor(cfg, run_dir, out)
        else:
            proc = local_head.launch_head(cfg, stdout=out, stderr=out)
    finally:
        if out is not None:
            out.close()
    # A head on 0.0.0.0 is reached (and told to others) by this machine's address.
    shown = routable_ip() if host in ("0.0.0.0", "::", "") else host
    started = Started("head", proc.pid, session_dir, join_address(shown, port), token,
                      run_dir, proc=proc)
    try:
        if port == 0:   # the head picks one and writes its address
            port = _wait_bound_port(started, timeout_s)
            started.address = join_address(shown, port)
        _wait_head_ready(started, host if shown == host else DEFAULT_HOST, port, timeout_s)
    except BaseException:
        stop(started)
        raise
    cf.write_record(run_dir, started.record())
    return started


def _launch_supervisor(cfg: dict[str, Any], run_dir: str,
                       out: BinaryIO | None) -> subprocess.Popen[bytes]:
    """The head's supervisor, in a session of its own, on cfg (written where the head's
    launch writes it); it starts the head."""
    cfg_path = os.path.join(cfg["session_dir"], "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    env = _child_env(cfg["sys_path"])
    return subprocess.Popen(
        [sys.executable, "-m", "orchestra._cluster.supervisor", cfg_path, run_dir],
        stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
        close_fds=True, cwd=cfg["session_dir"], env=env)


def dashboard_url(started: Started) -> str:
    """The URL of a started head's dashboard ("" when it runs none): the head wrote it
    to its session's ``dashboard`` file before it accepted connections."""
    try:
        with open(os.path.join(started.session_dir, "dashboard")) as f:
            return f.read().strip()
    except OSError:
        return ""


def _wait_bound_port(started: Started, timeout_s: float) -> int:
    """The port a head started with port 0 listens on (its session's ``address`` file)."""
    proc = started.proc
    assert proc is not None
    path = os.path.join(started.session_dir, "address")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(path) as f:
                return split_address(f.read().strip())[1]
        except (OSError, ValueError):
            pass
        if proc.poll() is not None:
            raise LaunchError(f"the head exited with code {proc.returncode} while starting"
                              f"{_said(started)}")
        if time.monotonic() > deadline:
            raise LaunchError(f"the head did not listen within {timeout_s:g} s{_said(started)}")
        time.sleep(_POLL_S)


def _wait_head_ready(started: Started, host: str, port: int, timeout_s: float) -> None:
    proc = started.proc
    assert proc is not None
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        if proc.poll() is not None:
            raise LaunchError(
                f"the head exited with code {proc.returncode} while starting"
                f"{_said(started)}{_port_hint(port, _tail(_log_path(started)))}")
        try:
            with socket.create_connection((host, port), timeout=1.0) as s:
                connect_secure(s, started.token, timeout_s=2.0, peer=f"{host}:{port}").close()
            return
        except AuthenticationError:   # someone else's server took the port meanwhile
            raise LaunchError(_taken(port, host)) from None
        except OSError as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise LaunchError(f"the head did not accept connections at {host}:{port} within "
                              f"{timeout_s:g} s (last: {last}){_said(started)}")
        time.sleep(_POLL_S)


def _answers(host: str, port: int) -> bool:
    """True when something accepts connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _taken(port: int, host: str) -> str:
    return (f"port {port} at {host} is taken by another program (a cluster already running "
            f"here? `orchestra stop` stops it); pass --port to use another")


def _log_path(started: Started) -> str:
    return os.path.join(started.run_dir, cf.LOG)


def _said(started: Started) -> str:
    tail = _tail(_log_path(started))
    return f"; its output ended with:\n{tail}" if tail else ""


def _port_hint(port: int, tail: str) -> str:
    if "in use" in tail:
        return "\n" + _taken(port, "this machine")
    return ""


# ---------------------------------------------------------------------------- a node

def node_cfg(*, head_address: str, token: str, host: str | None, session_dir: str,
             num_cpus: int | None = None, num_gpus: int | None = None,
             resources: dict[str, float] | None = None,
             object_store_memory: int | None = None) -> dict[str, Any]:
    """A joining node's cfg: the head's cfg keys a node uses (resources, workers, store,
    sys_path) plus head_address, token, host (where its data server listens: by default
    this machine's address on the route to the head) and its session_dir."""
    head_host, _ = split_address(head_address)
    _, cfg = local_head.build_cfg(num_cpus=num_cpus, num_gpus=num_gpus, resources=resources,
                                object_store_memory=object_store_memory)
    cfg.pop("_spill_root", None)
    if host is None:
        host = DEFAULT_HOST if head_host in ("127.0.0.1", "localhost", "::1") \
            else routable_ip(head_host)
    cfg.update(head_address=head_address, token=token, host=host, session_dir=session_dir,
               spill_dir=os.path.join(session_dir, "spill"))
    return cfg


def start_node(state: str, *, head_address: str, token: str, host: str | None = None,
               num_cpus: int | None = None, num_gpus: int | None = None,
               resources: dict[str, float] | None = None,
               object_store_memory: int | None = None, log: bool = True,
               timeout_s: float = READY_TIMEOUT_S, owner_pid: int = 0,
               reconnect_timeout_s: float = 0.0) -> Started:
    """Start a node that joins the head at ``head_address``; return once the head
    welcomed it (its node.json), else LaunchError naming the cause.
    ``reconnect_timeout_s``: how long it tries to join again after losing the head."""
    started = spawn_node(state, head_address=head_address, token=token, host=host,
                         num_cpus=num_cpus, num_gpus=num_gpus, resources=resources,
                         object_store_memory=object_store_memory, log=log,
                         owner_pid=owner_pid, reconnect_timeout_s=reconnect_timeout_s)
    wait_joined(started, timeout_s)
    return started


def spawn_node(state: str, *, head_address: str, token: str, host: str | None = None,
               num_cpus: int | None = None, num_gpus: int | None = None,
               resources: dict[str, float] | None = None,
               object_store_memory: int | None = None, log: bool = True,
               owner_pid: int = 0, reconnect_timeout_s: float = 0.0) -> Started:
    """Start a node process joining the head at ``head_address``, without waiting:
    wait_joined() waits (several nodes started first join side by side)."""
    split_address(head_address)   # a bad address fails here, not in the node
    if not token:
        raise LaunchError("joining a cluster needs its token: pass --token TOKEN (or set "
                          "ORCHESTRA_TOKEN); `orchestra start --head` printed it")
    run_dir = cf.new_run_dir(state, "node")
    # The node creates (and at exit removes) its session directory.
    session_dir = os.path.join(tempfile.gettempdir(),
                               NODE_SESSION_PREFIX + os.path.basename(run_dir)[len("node-"):])
    cfg = node_cfg(head_address=head_address, token=token, host=host,
                   session_dir=session_dir, num_cpus=num_cpus, num_gpus=num_gpus,
                   resources=resources, object_store_memory=object_store_memory)
    if owner_pid:   # stops when that process exits (cluster_utils.Cluster)
        cfg["owner_pid"] = owner_pid
    cfg["reconnect_timeout_s"] = float(reconnect_timeout_s)
    cfg_path = os.path.join(run_dir, "config.json")
    fd = os.open(cfg_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(cfg, f)
    out = _log_file(run_dir, log)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", JOIN_BOOTSTRAP, "--join", cfg_path],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            close_fds=True, cwd=run_dir, env=_child_env(cfg["sys_path"]))
    finally:
        if out is not None:
            out.close()
    return Started("node", proc.pid, session_dir, head_address, token, run_dir, proc=proc)


def wait_joined(started: Started, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait until a spawned node joined, then record it; LaunchError (the node
    stopped, its directories removed) when it did not."""
    try:
        _wait_node_joined(started, timeout_s)
    except BaseException:
        stop(started)
        raise
    cf.write_record(started.run_dir, started.record())


def _wait_node_joined(started: Started, timeout_s: float) -> None:
    proc = started.proc
    assert proc is not None
    path = os.path.join(started.session_dir, "node.json")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(path) as f:
                info = json.load(f)
            started.node_id = int(info["node_id"])
            started.node_hex = str(info["node_hex"])
            return
        except (OSError, ValueError, KeyError):
            pass   # not written yet (or half written)
        if proc.poll() is not None:
            tail = _tail(_log_path(started))
            raise LaunchError(f"the node did not join the head at {started.address}: "
                              f"{join_failure(tail, started.address)} (it exited with code "
                              f"{proc.returncode}){_said(started)}")
        if time.monotonic() > deadline:
            raise LaunchError(f"the node did not join the head at {started.address} within "
                              f"{timeout_s:g} s{_said(started)}")
        time.sleep(_POLL_S)


def join_failure(output: str, head_address: str) -> str:
    """What a node's last words mean, for the user: the cause, then the fix."""
    low = output.lower()
    if "is not the cluster of this token" in low:
        return ("the server at that address is another cluster (its key is not the one this "
                "token names). Check the address and the token")
    if "starts with 'tls-'" in low:
        return ("this token says the cluster speaks TLS (it starts with 'tls-') and the head "
                "does not (it was started on loopback or with --insecure-no-tls). Pass the "
                "token that `orchestra start --head` printed")
    if "token" in low and ("wrong" in low or "refused" in low or "needs" in low):
        return ("the head refused the token. Pass the token that `orchestra start --head` "
                "printed (--token or ORCHESTRA_TOKEN)")
    if "version" in low and "mismatch" in low:
        return "the head runs another orchestra version; install the same one everywhere"
    if any(w in low for w in ("connection refused", "unreachable", "timed out",
                              "no route", "cannot reach", "name or service")):
        return (f"the head is unreachable at {head_address}. Check the address, that the "
                "head runs (`orchestra status` there), and that a firewall lets its port "
                "through")
    return "see its output below"


# ---------------------------------------------------------------------------- stopping

def stop(started: Started | dict[str, Any], timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop a started process (a Started or a record): SIGTERM, wait up to
    ``timeout_s``, then SIGKILL; remove its session and run directories and sweep the
    segments of dead sessions. False when it had to be killed."""
    if isinstance(started, dict):
        pid, session_dir, run_dir = started["pid"], started.get("session_dir", ""), \
            started.get("run_dir", "")
        proc = None
    else:
        pid, session_dir, run_dir, proc = (started.pid, started.session_dir,
                                           started.run_dir, started.proc)
    # A record outlives its process after a reboot or a kill -9: its pid may be another
    # program's by now, which must not be signalled.
    graceful = terminate(pid, proc, timeout_s) if proc is not None or is_orchestra(pid) \
        else True
    if session_dir:
        shutil.rmtree(session_dir, ignore_errors=True)
    if run_dir:
        cf.remove_run_dir(run_dir)
    sweep_stale_segments()
    return graceful


def terminate(pid: int, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> bool:
    """SIGTERM ``pid``, wait for it up to ``timeout_s``, then SIGKILL it (its whole
    process group: workers a killed node could not stop). Reaps it when it is our child."""
    graceful = True
    _signal(pid, signal.SIGTERM)
    if not _wait_gone(pid, proc, timeout_s):
        graceful = False
        _signal(pid, signal.SIGKILL)
        _wait_gone(pid, proc, timeout_s)
    try:   # what is left of its process group (a session of its own: pgid == pid)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return graceful


def is_orchestra(pid: int) -> bool:
    """True when ``pid`` runs orchestra's code (its command line names it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"orchestra" in f.read()
    except OSError:
        return False


def kill(started: Started) -> None:
    """SIGKILL the process (not its group: its workers are left to notice), reap it."""
    _signal(started.pid, signal.SIGKILL)
    _wait_gone(started.pid, started.proc, STOP_TIMEOUT_S)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pid: int, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None:
            if proc.poll() is not None:
                return True
        elif not pid_alive(pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)


def stop_all(state: str, timeout_s: float = STOP_TIMEOUT_S) -> list[dict[str, Any]]:
    """Stop every process recorded in ``state`` (nodes first, then heads), and remove run
    directories that hold no record (a start that failed half-way). Returns the records."""
    records = sorted(cf.read_records(state), key=lambda r: r.get("kind") == "head")
    for rec in records:
        stop(rec, timeout_s)
    for run_dir in cf.run_dirs(state):
        cf.remove_run_dir(run_dir)
    return records
