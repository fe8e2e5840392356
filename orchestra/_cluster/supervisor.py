"""The head's supervisor: ``orchestra start --head`` starts this process, which starts
the head as its child and starts it again at once when it dies unexpectedly, on the same
address, port, token and state store.

    python -m orchestra._cluster.supervisor CFG_PATH RUN_DIR
    start head (its process group is ours; it stops when we exit: cfg owner_pid)
        -> ready once it wrote its address -> wait for its exit
        -> RestartBook.exited(now, code, ready, stopping):
             Restart(reason, pause_s): stale sockets removed, the dead head's segments
                 swept, the restart counted in its cfg (head_restarts, last_restart),
                 started again (after pause_s when it had failed to start: doubled for
                 each failed start in a row)
             Stop: SIGTERM/SIGINT/SIGHUP came (forwarded to the head), or the head ended
                 on its own with code 0 (a SIGTERM sent to it, its lease taken by another
                 head): we exit 0
             GiveUp(reason): its first start failed, or it died MAX_RESTARTS times within
                 WINDOW_S: it stays down; the reason goes to the log and to RUN_DIR/down,
                 which `orchestra status` shows; the session directory is removed (a
                 supervised head that fails to start leaves it to us); we exit 1

The decision is ``RestartBook``'s, an I/O-free core (tests/unit/test_supervisor.py drives
it with Hypothesis); ``main`` carries it out. The record of ``orchestra start`` names this
process: stopping it (SIGTERM, then its process group) stops the head and all it started,
and a SIGKILL of it takes the head along (the head watches it).
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

# At most this many restarts within WINDOW_S: a head that cannot stay up (a broken
# environment, a store taken over by another head) stays down and says why.
MAX_RESTARTS = 5
WINDOW_S = 60.0
# A restart that failed to start (its port held a moment by another socket, a store
# that answers again soon) is tried again after this, doubled each time up to
# MAX_PAUSE_S: the restarts allowed span seconds, not the few ms of failed starts.
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 8.0
# How long a stopping head has to end before it is killed (orchestra stop waits longer).
STOP_WAIT_S = 8.0
_POLL_S = 0.05
# What a killed head leaves in its session directory, and that a new one must create.
_STALE = ("head.sock", "grpc.sock", "address", "address.tmp", "dashboard", "node.sock")
DOWN_FILE = "down"
HEAD_PID_FILE = "head.pid"   # in RUN_DIR: the head's pid now


@dataclass(frozen=True)
class Restart:
    reason: str
    pause_s: float = 0.0   # before the start: a restart that failed to start waits


@dataclass(frozen=True)
class Stop:
    reason: str


@dataclass(frozen=True)
class GiveUp:
    reason: str


Decision = Restart | Stop | GiveUp


def describe_exit(code: int) -> str:
    """A Popen returncode in words: "killed by SIGKILL", "exit code 1"."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class RestartBook:
    """Whether the head is started again after each of its exits (no I/O)."""

    def __init__(self, max_restarts: int = MAX_RESTARTS, window_s: float = WINDOW_S) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.restarts: collections.deque[float] = collections.deque()   # their times
        self.ever_ready = False
        self.failed_starts = 0   # exits in a row before serving

    def exited(self, now: float, code: int, *, ready: bool, stopping: bool) -> Decision:
        """The head ended with ``code`` (a Popen returncode); ``ready``: it had been
        serving since its last start; ``stopping``: a stop was asked of us."""
        self.ever_ready = self.ever_ready or ready
        self.failed_starts = 0 if ready else self.failed_starts + 1
        how = describe_exit(code)
        if stopping:
            return Stop(f"stopped ({how})")
        if code == 0:
            return Stop("the head stopped on its own (exit code 0): a SIGTERM sent to it, "
                        "or its state store taken over by another head; see its log")
        if not self.ever_ready:
            return GiveUp(f"the head failed to start ({how}); see its log above")
        while self.restarts and now - self.restarts[0] >= self.window_s:
            self.restarts.popleft()
        if len(self.restarts) >= self.max_restarts:
            return GiveUp(f"the head died {len(self.restarts) + 1} times within "
                          f"{self.window_s:.0f} s (last: {how}); it stays down. Find the "
                          "cause in its log, then `orchestra stop` and start it again")
        self.restarts.append(now)
        pause = 0.0 if ready else min(FIRST_PAUSE_S * 2 ** (self.failed_starts - 1), MAX_PAUSE_S)
        return Restart(f"the head died ({how})", pause)


class _Supervisor:
    def __init__(self, cfg_path: str, run_dir: str) -> None:
        with open(cfg_path) as f:
            self.cfg = json.load(f)
        self.cfg_path = cfg_path
        self.run_dir = run_dir
        self.session_dir = self.cfg["session_dir"]
        self.book = RestartBook()
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def _say(self, text: str) -> None:
        print(f"orchestra supervisor: {text}", file=sys.stderr, flush=True)

    def _start(self) -> subprocess.Popen[bytes]:
        from .._api import local_head
        # The head stops when this process is gone (a SIGKILL of the record's pid).
        self.cfg["owner_pid"] = os.getpid()
        self.cfg["supervised"] = True   # a failed start leaves the session to us
        return local_head.launch_head(self.cfg, new_session=False, keeper_pid=os.getpid())

    def _wait(self, proc: subprocess.Popen[bytes]) -> tuple[int, bool]:
        """Its exit code, and whether it had become ready (wrote its address). The
        address is looked at once more after the exit: a head that wrote it and died
        between two polls was ready (_clean removed the one of the head before)."""
        address = os.path.join(self.session_dir, "address")
        while proc.poll() is None:
            # Serving once it wrote its address, and once its port is known: block until
            # it ends (a signal's handler runs meanwhile). (A head writes the file whole;
            # one that did not would be read again here until it had.)
            if os.path.exists(address) and self._pin_port(address):
                return proc.wait(), True
            time.sleep(_POLL_S)
        ready = os.path.exists(address)
        if ready:
            self._pin_port(address)
        return proc.returncode, ready

    def _pin_port(self, address_file: str) -> bool:
        """A head started on port 0 picked one: its restarts listen there too (the
        record, the join command and the drivers name it). False while the file says
        no port yet."""
        listen = str(self.cfg.get("listen", ""))
        if not listen.endswith(":0"):
            return True
        try:
            with open(address_file) as f:
                port = f.read().strip().rpartition(":")[2]
        except OSError:
            return False
        if not port.isdigit():
            return False
        self.cfg["listen"] = f"{listen[:-2]}:{port}"
        return True

    def _clean(self) -> None:
        """What the dead head left: its sockets and files, and its segments."""
        from .._objects.segments import sweep_stale_segments
        for name in _STALE:
            try:
                os.unlink(os.path.join(self.session_dir, name))
            except FileNotFoundError:
                pass
        sweep_stale_segments()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.on_signal)
        try:
            os.unlink(os.path.join(self.run_dir, DOWN_FILE))
        except FileNotFoundError:
            pass
        while True:
            self.proc = self._start()
            with open(os.path.join(self.run_dir, HEAD_PID_FILE), "w") as f:
                f.write(str(self.proc.pid))
            if self.stopping:   # a signal came while it started
                self.proc.send_signal(signal.SIGTERM)
            code, ready = self._wait(self.proc)
            pid = self.proc.pid
            decision = self.book.exited(time.monotonic(), code, ready=ready,
                                        stopping=self.stopping)
            if isinstance(decision, Stop):
                return 0
            if isinstance(decision, GiveUp):
                self._say(f"the head (pid {pid}): {decision.reason}")
                with open(os.path.join(self.run_dir, DOWN_FILE), "w") as f:
                    f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {decision.reason}\n")
                shutil.rmtree(self.session_dir, ignore_errors=True)
                return 1
            restarts = self.cfg.get("head_restarts", 0) + 1
            later = f" in {decision.pause_s:g} s" if decision.pause_s else ""
            self._say(f"{decision.reason} (pid {pid}); starting it again{later} "
                      f"(restart {restarts}; at most {MAX_RESTARTS} within {WINDOW_S:.0f} s)")
            self.cfg["head_restarts"] = restarts
            self.cfg["last_restart"] = {"time": time.time(), "reason": decision.reason}
            self._clean()
            deadline = time.monotonic() + decision.pause_s
            while time.monotonic() < deadline and not self.stopping:
                time.sleep(_POLL_S)
            if self.stopping:
                shutil.rmtree(self.session_dir, ignore_errors=True)
                return 0


def head_pid(run_dir: str) -> int:
    """The pid of the head a supervisor runs now (0: none yet)."""
    try:
        with open(os.path.join(run_dir, HEAD_PID_FILE)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


def down_reasons(records: list[dict[str, object]]) -> list[str]:
    """Why each recorded head whose supervisor gave up stays down (its RUN_DIR/down)."""
    out = []
    for rec in records:
        try:
            with open(os.path.join(str(rec.get("run_dir", "")), DOWN_FILE)) as f:
                out.append(f"the head (pid {rec.get('pid')}) is down since {f.read().strip()}")
        except OSError:
            continue
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    from .._platform.proctitle import set_title
    set_title("orchestra::supervisor")
    os.umask(0o077)
    raise SystemExit(_Supervisor(argv[0], argv[1]).run())


if __name__ == "__main__":
    main()
