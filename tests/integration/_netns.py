"""Machines on one machine: network namespaces joined by a bridge, for cluster tests.

    <p>b   a namespace holding the bridge br0 (no address), one veth end per host
    <p>h0  the head's host: eth0 10.77.0.1/24; it shares this machine's mounts, so a
           driver run there (run_driver) uses the head's store as a driver on the
           head's machine would
    <p>h1, <p>h2, ...  the nodes' hosts: eth0 10.77.0.2, .3, ...; each process runs in
           a mount namespace of its own with a private tmpfs on /dev/shm and on /tmp,
           so that nothing but the network is shared with the others

<p> is "oc<pid of this test process>": other test runs on the machine get names of
their own, every address lives inside these namespaces (none in the machine's own),
and teardown (or the next run, for namespaces whose process is gone) deletes them
all: deleting a namespace deletes its veth ends and bridge. Needs root, ``ip`` and
``unshare``; ``skip_reason()`` says what is missing.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])
SUBNET = "10.77.0"
# A host's own /dev/shm and /tmp. What this run needs under /tmp (a checkout there, and
# the tox venv in it: CI may clone anywhere) is bound back in from the machine's /tmp,
# seen through /mnt for the moment (a mount in this namespace only).
_PRIVATE_MOUNTS = """set -e
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
keep="$KEEP_UNDER_TMP"
if [ -n "$keep" ]; then mount --bind /tmp /mnt; fi
mount -t tmpfs -o mode=1777 tmpfs /tmp
for p in $keep; do mkdir -p "$p"; mount --bind "/mnt${p#/tmp}" "$p"; done
if [ -n "$keep" ]; then umount -l /mnt; fi
exec "$@"
"""


def kept_under_tmp() -> str:
    """The paths under /tmp that a host's processes need: this checkout, the
    interpreter's environment (space-separated; "" when none is under /tmp)."""
    keep: list[str] = []
    for path in (REPO, sys.prefix, os.path.realpath(sys.executable)):
        real = os.path.realpath(path)
        if real.startswith("/tmp/") and not any(real == k or real.startswith(k + "/") for k in keep):
            keep.append(real if os.path.isdir(real) else os.path.dirname(real))
    return " ".join(keep)


def skip_reason() -> str:
    """Why these tests cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs these tests as root)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    probe = f"ocprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _netns_names() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def sweep_stale() -> None:
    """Delete namespaces of earlier runs whose test process is gone (a run killed
    before its teardown)."""
    for name in _netns_names():
        m = re.fullmatch(r"oc(\d+)p?(b|h\d+)", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


class Hosts:
    """``count`` hosts (h0 .. h<count-1>) on one bridge; ``ip(i)`` is host i's address."""

    def __init__(self, count: int, tag: str = "") -> None:
        assert tag in ("", "p"), "one letter that the sweep knows"
        self.prefix = f"oc{os.getpid()}{tag}"
        self.count = count
        self.bridge = f"{self.prefix}b"
        self.made: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tmp = tempfile.mkdtemp(prefix="orchestra-netns-")

    def ns(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def ip(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def setup(self) -> None:
        sweep_stale()
        _ip("netns", "add", self.bridge)
        self.made.append(self.bridge)
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        _ip("-n", self.bridge, "link", "set", "lo", "up")
        for i in range(self.count):
            ns = self.ns(i)
            _ip("netns", "add", ns)
            self.made.append(ns)
            # Both ends made in their namespaces: no name in the machine's own is used.
            _ip("link", "add", f"v{i}", "netns", self.bridge, "type", "veth",
                "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.bridge, "link", "set", f"v{i}", "master", "br0")
            _ip("-n", self.bridge, "link", "set", f"v{i}", "up")
            _ip("-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def command(self, i: int, argv: list[str], *, private_mounts: bool) -> list[str]:
        """``argv`` run in host i's network namespace (and, with ``private_mounts``, in
        a mount namespace of its own with fresh /dev/shm and /tmp)."""
        cmd = ["ip", "netns", "exec", self.ns(i)]
        if private_mounts:
            cmd += ["env", f"KEEP_UNDER_TMP={kept_under_tmp()}", "unshare", "-m",
                    "--propagation", "private", "sh", "-c", _PRIVATE_MOUNTS, "sh"]
        return cmd + argv

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO
        env.update(extra)
        return env

    def spawn(self, i: int, argv: list[str], *, private_mounts: bool, log: str,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` on host i, its output in ``<tmp>/<log>``; stopped at teardown."""
        out = open(os.path.join(self.tmp, log), "wb")
        try:
            proc = subprocess.Popen(self.command(i, argv, private_mounts=private_mounts),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True, env=env or self.env())
        finally:
            out.close()
        self.procs.append(proc)
        return proc

    def output(self, log: str) -> str:
        try:
            return Path(self.tmp, log).read_text(errors="replace")
        except OSError:
            return ""

    def wait_output(self, proc: subprocess.Popen[bytes], log: str, pattern: str,
                    timeout: float) -> re.Match[str]:
        """The first match of ``pattern`` in the process's output; RuntimeError with that
        output when it exits or the time is up first."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.output(log))
            if m:
                return m
            if proc.poll() is not None:
                raise RuntimeError(f"{log}: exited with code {proc.returncode} before "
                                   f"{pattern!r}:\n{self.output(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{log}: no {pattern!r} within {timeout:g} s:\n"
                                   f"{self.output(log)}")
            time.sleep(0.05)

    def run(self, i: int, argv: list[str], *, timeout: float, private_mounts: bool = False,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on host i to its end."""
        return subprocess.run(self.command(i, argv, private_mounts=private_mounts),
                              capture_output=True, text=True, timeout=timeout,
                              env=env or self.env())

    def teardown(self) -> None:
        """Stop every process (SIGTERM: an `orchestra start --block` stops what it
        started; then SIGKILL of its process group), then delete the namespaces."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"netns teardown: pid {proc.pid} ignored SIGTERM; killed", file=sys.stderr)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if proc.poll() is None:
                proc.wait(10)
        for ns in self.made:   # anything still in a namespace (a detached child)
            for pid in self.pids_in(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.made = []
        shutil.rmtree(self.tmp, ignore_errors=True)

    def pids_in(self, ns: str) -> list[int]:
        """The processes running in network namespace ``ns``."""
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                           timeout=30)
        return [int(p) for p in r.stdout.split() if p.isdigit()]

    def namespaces_left(self) -> list[str]:
        return [n for n in _netns_names() if n.startswith(self.prefix)]
