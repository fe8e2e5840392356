"""Running the ``orchestra`` command in tests: the CLI in a subprocess, the records of a
state directory, a head started on any free port (tests/integration/conftest.py's
``state`` fixture gives each test a state directory of its own)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestra._runtime import cluster_file as cf

REPO = str(Path(__file__).resolve().parents[2])
T = 30
SMALL = ["--num-cpus", "1", "--object-store-memory", str(64 << 20)]


def cli(*args: str, env: dict[str, str] | None = None,
        timeout: float = T) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
    return subprocess.run([sys.executable, "-m", "orchestra._cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=full)


def records(state: str) -> list[dict[str, Any]]:
    return cf.read_records(state)


def cluster_logs(state: str, lines: int = 40) -> str:
    """The last ``lines`` of each log of the processes recorded in ``state`` (the
    supervisors', the heads' and the nodes' stderr, their workers' .err files), for an
    assertion's message: what a failure on a busy machine leaves to read."""
    out: list[str] = []
    for rec in records(state):
        dirs = [rec.get("run_dir", ""), rec.get("session_dir", "")]
        for d in filter(None, dirs):
            for f in sorted(Path(d).rglob("*")):
                if f.is_file() and (f.name == "stderr.log" or f.suffix == ".err"):
                    text = f.read_text(errors="replace").splitlines()[-lines:]
                    if text:
                        out.append(f"--- {f}:\n" + "\n".join(text))
    return "\n".join(out)


def start_head(state: str, *args: str, beside: bool = False) -> dict[str, Any]:
    """`orchestra start --head` on a free port, small. Tests of a head and the nodes
    they join give it its own node (--head-runs-work: no node beside it, which the
    tests of that default start with ``beside=True``)."""
    r = cli("start", "--head", "--port", "0", *SMALL, *args,
            *([] if beside else ["--head-runs-work"]))
    assert r.returncode == 0, r.stderr
    [head] = [rec for rec in records(state) if rec["kind"] == "head"]
    assert f"orchestra start --address {head['address']} --token {head['token']}" in r.stdout
    return head


def store_pid(rec: dict[str, Any]) -> int:
    """The process whose store a record's segments belong to: a node's, or the head
    its supervisor runs now (the record names the supervisor)."""
    from orchestra._cluster.supervisor import head_pid
    return head_pid(rec["run_dir"]) if rec["kind"] == "head" else int(rec["pid"])


def shm_of(pid: int) -> list[str]:
    prefix = f"orchestra-{os.geteuid()}-{pid}-"
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
