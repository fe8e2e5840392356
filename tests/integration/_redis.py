"""A Redis server of the test's own: Debian's redis-server on a free loopback port, its
files in a directory of the test (append-only, so that a restart keeps what it held),
stopped at the end. Tests that need one skip with the reason where it is not installed
(.ci/run installs it)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

START_TIMEOUT_S = 10.0


def skip_reason() -> str:
    """Why no Redis can be started here ("" when one can)."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server; .ci/run does)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis package is not installed (pip install 'orchestra[redis]')"
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """``start()`` / ``stop()`` (SIGKILL: it goes away as a crashed server does) /
    ``start()`` again on the same port and files."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--appendonly", "yes", "--save", "",
             "--protected-mode", "yes", "--daemonize", "no"],
            stdout=open(self.dir / "redis.log", "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}: {log}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None
