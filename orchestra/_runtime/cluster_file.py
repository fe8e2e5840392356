"""What ``orchestra start`` started on this machine: one record per head or node, in a
per-user state directory, read by ``orchestra stop`` and by ``init(address="auto")``.

    orchestra start --head     -> <state>/head-<tag>/ {record.json, stderr.log}
    orchestra start --address  -> <state>/node-<tag>/ {record.json, config.json, stderr.log}
    orchestra stop             -> every record: SIGTERM, bounded wait, SIGKILL; its session
                                  directory and its run directory removed
    init(address="auto")       -> local_cluster(): the head's address and token (or, on a
                                  machine that only runs a node, its head's)

The state directory is ``<tempdir>/orchestra-<uid>`` (mode 0700: the records hold the
cluster token), or ``$ORCHESTRA_STATE_DIR``; Cluster (cluster_utils.py) uses one of its
own, so that its processes never mix with those of ``orchestra start``. A record is
written (atomically: a rename) once its process is ready; a run directory without one
is a start that failed or is in progress. Records of processes that no longer run are
skipped by readers and removed by the next ``orchestra stop``.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from .._platform.procutil import pid_alive

RECORD = "record.json"
LOG = "stderr.log"
STATE_DIR_ENV = "ORCHESTRA_STATE_DIR"


def state_dir(path: str | None = None) -> str:
    """The state directory (``path``, $ORCHESTRA_STATE_DIR, or <tempdir>/orchestra-<uid>),
    created mode 0700 when missing. A directory of another owner, or one others can
    enter, is refused: its records would hand out the token (or be planted)."""
    path = path or os.environ.get(STATE_DIR_ENV) or os.path.join(
        tempfile.gettempdir(), f"orchestra-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.stat(path)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"the orchestra state directory {path} belongs to uid {st.st_uid} or is open "
            f"to others (mode {st.st_mode & 0o777:o}); it holds cluster tokens. Remove it, "
            f"or set {STATE_DIR_ENV} to a directory of your own with mode 0700")
    return path


def new_run_dir(state: str, kind: str) -> str:
    """A fresh directory for one started process (``head-...`` or ``node-...``)."""
    return tempfile.mkdtemp(prefix=f"{kind}-", dir=state)


def write_record(run_dir: str, record: dict[str, Any]) -> None:
    """Record a started process (kind, pid, session_dir, address, token, ...)."""
    tmp = os.path.join(run_dir, RECORD + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(run_dir, RECORD))


def read_records(state: str) -> list[dict[str, Any]]:
    """Every record in ``state``, each with its "run_dir"; heads first, then nodes, each
    oldest first. Unreadable ones are skipped."""
    out = []
    try:
        names = os.listdir(state)
    except FileNotFoundError:
        return []
    for name in names:
        run_dir = os.path.join(state, name)
        try:
            with open(os.path.join(run_dir, RECORD)) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("pid"), int):
            rec["run_dir"] = run_dir
            out.append(rec)
    out.sort(key=lambda r: (r.get("kind") != "head", r.get("started", 0.0)))
    return out


def _take_tls_files(rec: dict[str, Any]) -> None:
    """A head or node started on certificates of its own: they become this process's
    too (_protocol/pki.py), unless it was given some."""
    files = rec.get("tls_files")
    if files and not os.environ.get("ORCHESTRA_TLS_CERT"):
        from .._protocol import pki
        pki.use(*files)


# cluster_utils.Cluster's state directories: <tempdir>/<this prefix>XXXX, mode 0700.
CLUSTER_PREFIX = "orchestra-cluster-"


def token_for(address: str) -> str | None:
    """The token of the head this user started at ``address`` on this machine, with
    ``orchestra start`` or ``cluster_utils.Cluster`` (whose state directory is its own):
    what init(address=...) uses when given no token, as Ray's scripts connect to a
    Cluster by its address alone. Only directories of this user that no one else can
    enter are read (they hold tokens). None when no running head has that address."""
    dirs = []
    try:
        dirs.append(state_dir())
    except (OSError, PermissionError):
        pass
    for state in dirs + [path for path, _ in own_dirs(CLUSTER_PREFIX)]:
        for rec in read_records(state):
            if rec.get("kind") == "head" and rec.get("address") == address and \
                    rec.get("token") is not None and pid_alive(rec["pid"]):
                _take_tls_files(rec)
                return str(rec["token"])
    return None


def private_sessions() -> list[str]:
    """The session directories of this user's running init() clusters on this machine
    (<tempdir>/orchestra-session-*, mode 0700, their head alive), newest first: what
    ``orchestra status`` and ``orchestra list`` read when no ``orchestra start`` cluster
    runs here."""
    found = []
    for path, mtime in own_dirs("orchestra-session-"):
        try:
            with open(os.path.join(path, "head.pid")) as f:
                head = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if pid_alive(head) and os.path.exists(os.path.join(path, "head.sock")):
            found.append((mtime, path))
    return [p for _, p in sorted(found, reverse=True)]


def own_dirs(prefix: str) -> list[tuple[str, float]]:
    """(path, mtime) of each directory <tempdir>/<prefix>* of this user that no one
    else can enter (what it holds, tokens and sockets, is this user's alone)."""
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return []
    out = []
    for name in names:
        if name.startswith(prefix):
            path = os.path.join(tmp, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if st.st_uid == os.geteuid() and not st.st_mode & 0o077:
                out.append((path, st.st_mtime))
    return out


def run_dirs(state: str) -> list[str]:
    """Every run directory in ``state``, with a record or not."""
    try:
        names = os.listdir(state)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(state, n) for n in names
                  if n.startswith(("head-", "node-")) and os.path.isdir(os.path.join(state, n)))


def remove_run_dir(run_dir: str) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)


def local_cluster(state: str | None = None) -> tuple[str, str] | None:
    """(address, token) of the cluster ``orchestra start`` started here: the head's when
    it runs on this machine, else the head of a node running here; None when neither.
    One started on certificates of its own gives them to this process too (its
    environment: _protocol/pki.py) unless it has some already."""
    try:
        records = read_records(state_dir(state))
    except OSError:
        return None
    for rec in records:   # heads first
        if pid_alive(rec["pid"]) and rec.get("address") and rec.get("token") is not None:
            _take_tls_files(rec)
            return str(rec["address"]), str(rec["token"])
    return None
