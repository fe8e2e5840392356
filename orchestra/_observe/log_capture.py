"""A worker's output: kept in log files, and forwarded to the driver whose task printed it.

    fds 1 and 2 --dup2--> <node dir>/logs/worker-<id>-<pid>.out / .err  (C-level output too)
    sys.stdout / sys.stderr = LineWriter(stream): complete lines of each write()
        -> os.write(fd)                        the file
        -> pending (job, stream, name, line)   for the driver of the job (Call.job)
    flusher thread: the first pending line wakes it; _FLUSH_S later every pending line
        goes to the head in one LOG_LINES frame; the head sends each job's lines to that
        driver's log connection (orchestra/_observe/log_printer.py prints them)
    main thread, before it answers a task (dirty set): the same, at once, so what a task
        printed reaches the head before its result does

A task that prints nothing costs nothing here (no write, no frame, no syscall): the
worker looks at one attribute (``dirty``) before it answers. The first line a task
writes into a file follows a marker line ``:orchestra:task <task id hex> <name>``; an
actor's process starts its files' actor part with ``:orchestra:actor <actor id hex>
<class> <constructor's task id hex>``. ``orchestra logs TASK|ACTOR|PID`` (_cli/logs.py)
finds a task's or actor's output by them.

Files are capped: one past max_bytes() (ORCHESTRA_LOG_MAX_BYTES, default 32 MiB) is
renamed to ``.1`` (the older ``.1`` dropped) and written anew, so a worker keeps about
twice that per stream. The check (an fstat) runs after every 1/8 of the cap written
through sys.stdout/sys.stderr; output written straight to the fds by C code counts in
the file's size, but only Python's writes trigger the check. The files go with the
session's directory.
"""
from __future__ import annotations

import contextvars
import io
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from .._protocol import pb
from .._protocol import wire as _wire

STDOUT, STDERR = 1, 2
MARKER = ":orchestra:"
LOGS_DIR = "logs"
# Lines wait this long for more before they go to the head in one frame: a task printing
# in a loop sends ~20 frames a second, not one per line.
_FLUSH_S = 0.05
DEFAULT_MAX_BYTES = 32 << 20


def max_bytes() -> int:
    """The size past which a log file is rotated (ORCHESTRA_LOG_MAX_BYTES, or 32 MiB)."""
    try:
        return max(int(os.environ.get("ORCHESTRA_LOG_MAX_BYTES", "")), 4096)
    except ValueError:
        return DEFAULT_MAX_BYTES


def log_paths(logs_dir: str, worker_id: int, pid: int) -> tuple[str, str]:
    """The stdout and stderr files of one worker process."""
    base = os.path.join(logs_dir, f"worker-{worker_id}-{pid}")
    return base + ".out", base + ".err"


# A dead worker's last words: at most this many lines of its stderr, each cut to
# _WORD_CHARS, read from the file's last _TAIL_BYTES.
_LAST_LINES, _WORD_CHARS, _TAIL_BYTES = 6, 200, 8192


def last_words(logs_dir: str, worker_id: int, pid: int) -> str:
    """The last lines a worker that died wrote to stderr since its last task began
    (after the last marker line), as one line: ``"a" / "b"``; "" when none. What it
    printed just before an os._exit or a signal may not have reached its driver (lines
    go there in batches); the error that reports the death carries them."""
    try:
        with open(log_paths(logs_dir, worker_id, pid)[1], "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            tail = f.read().decode("utf-8", "backslashreplace")
    except OSError:
        return ""
    lines = tail.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith(MARKER)]
    if marks:
        lines = lines[marks[-1] + 1:]
    words = [line[:_WORD_CHARS] for line in lines if line.strip()][-_LAST_LINES:]
    return " / ".join(repr(w) for w in words)


def short_name(call_name: str) -> str:
    """What prefixes a task's lines: ``__main__.square`` -> ``square``; an actor's
    constructor ``Counter.__init__`` -> ``Counter``."""
    parts = call_name.rsplit(".", 2)
    if len(parts) > 1 and parts[-1] == "__init__":
        return parts[-2]
    return parts[-1] or "worker"


_active: LogCapture | None = None


def active() -> LogCapture | None:
    """This worker's LogCapture once installed; None in a driver."""
    return _active


class LogCapture:
    """This worker's two streams: files, markers, pending lines and their flusher.

    ``send(frame)`` writes an encoded frame to the head (the worker's connection);
    ``current_call`` is the ContextVar of the call running in this thread or coroutine."""

    def __init__(self, logs_dir: str, worker_id: int, send: Callable[[bytes], object],
                 current_call: contextvars.ContextVar[pb.Call | None]) -> None:
        os.makedirs(logs_dir, exist_ok=True)
        self.pid = os.getpid()
        self.paths = log_paths(logs_dir, worker_id, self.pid)
        self.max_bytes = max_bytes()
        self._send = send
        self._current_call = current_call
        self.lock = threading.Lock()
        self.pending: list[tuple[int, int, str, str]] = []
        self.dirty = False      # lines pending, or part of a line (the worker flushes at a task's end)
        self.actor: tuple[int, str] | None = None   # (job, class name) of the actor served here
        self._last = (0, "worker")   # job and name of the last call that wrote
        self._marked: dict[int, bytes] = {STDOUT: b"", STDERR: b""}   # task id marked last per stream
        self._wake = threading.Event()
        self._written = 0
        for fd, path in zip((STDOUT, STDERR), self.paths, strict=True):
            self._open(fd, path)
        self.writers = {STDOUT: LineWriter(self, STDOUT), STDERR: LineWriter(self, STDERR)}
        threading.Thread(target=self._flusher, name="orchestra-logs", daemon=True).start()

    def rebind(self, send: Callable[[bytes], object]) -> None:
        """Send lines on another connection (a worker connected to a restarted head)."""
        with self.lock:
            self._send = send

    def install(self) -> None:
        """Make sys.stdout and sys.stderr this worker's line writers, and have
        ``os._exit`` in this process send the lines still pending first: a task that
        prints and then calls it lost them (they wait up to _FLUSH_S for company), and
        its driver saw neither them nor why it died (a signal still loses them: the
        death's error carries the last lines of stderr, _node/node.py)."""
        global _active
        _active = self
        sys.stdout = self.writers[STDOUT]
        sys.stderr = self.writers[STDERR]
        real_exit = os._exit

        def _exit(status: int) -> NoReturn:
            if os.getpid() == self.pid:   # not a fork of this worker: its copy of the
                try:                      # lines and connection are not its own
                    self.flush()
                except BaseException:  # noqa: BLE001 - the exit goes on, whatever happens
                    pass
            real_exit(status)
        os._exit = _exit

    @staticmethod
    def _open(fd: int, path: str) -> None:
        new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(new, fd)
        os.close(new)

    def mark_actor(self, actor_id: bytes, class_name: str, job: int) -> None:
        """This process serves an actor from now on: its lines name the class and go to
        the driver that created it (Ray's rule), and its files say which actor."""
        self.actor = (job, class_name)
        call = self._current_call.get()   # the constructor's: its lines come before
        ctor = call.task_id.hex() if call is not None else ""
        line = f"{MARKER}actor {actor_id.hex()} {class_name} {ctor}\n".encode()
        with self.lock:
            for fd in (STDOUT, STDERR):
                os.write(fd, line)

    # ------------------------------------------------------------ the writers' side
    def lines(self, stream: int, text: str) -> None:
        """Complete lines one writer got (each without its newline): to the file (after
        the task's marker, the first time it writes there) and to pending."""
        call = self._current_call.get()
        if call is not None:
            job = call.job
            name = short_name(call.name)
            if self.actor is not None:
                job, name = self.actor
            self._last = (job, name)
            marker = b""
            if call.task_id != self._marked[stream]:
                self._marked[stream] = call.task_id
                marker = f"{MARKER}task {call.task_id.hex()} {name}\n".encode()
        else:
            job, name = self.actor if self.actor is not None else self._last
            marker = b""
        data = text.encode("utf-8", "backslashreplace")
        with self.lock:
            os.write(stream, marker + data + b"\n" if marker else data + b"\n")
            self._written += len(data) + 1
            if self._written >= self.max_bytes // 8:   # one fstat per 1/8 of the cap
                self._written = 0
                self._rotate_if_full()
            first = not self.pending
            self.pending.extend((job, stream, name, line) for line in text.split("\n"))
            self.dirty = True
        if first:
            self._wake.set()

    def flush(self) -> None:
        """Send every pending line (and any part of a line) to the head now."""
        for w in self.writers.values():
            w.emit_partial()
        with self.lock:
            pending, self.pending = self.pending, []
            self.dirty = False
        if pending:
            self._send(_wire.encode(_wire.LOG_LINES, self.frame(pending)))

    def frame(self, pending: list[tuple[int, int, str, str]]) -> pb.LogLines:
        """Lines in order, one chunk per run of the same job, stream and name."""
        msg = pb.LogLines()
        chunk = pb.LogChunk()   # replaced at the first line (its key is None)
        key: tuple[int, int, str] | None = None
        for job, stream, name, line in pending:
            if (job, stream, name) != key:
                key = (job, stream, name)
                chunk = msg.chunks.add(job=job, stream=stream, name=name, pid=self.pid)
            chunk.lines.append(line)
        return msg

    def _flusher(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            time.sleep(_FLUSH_S)   # more lines come with these, in one frame
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - a lost head ends the worker elsewhere
                pass

    def _rotate_if_full(self) -> None:
        """(Holding the lock.) A file past max_bytes becomes ``.1`` (replacing the older
        one); writing goes on in a fresh file."""
        for fd, path in zip((STDOUT, STDERR), self.paths, strict=True):
            try:
                if os.fstat(fd).st_size >= self.max_bytes:
                    os.replace(path, path + ".1")
                    self._open(fd, path)
            except OSError:
                continue


class LineWriter(io.TextIOBase):
    """sys.stdout or sys.stderr of a worker: hands complete lines to its LogCapture; a
    part of a line waits for its end, a flush() or the task's end."""

    def __init__(self, capture: LogCapture, stream: int) -> None:
        super().__init__()
        self._capture = capture
        self._stream = stream
        self._part = ""
        self._lock = threading.Lock()
        self.buffer = _BinaryWriter(self)

    @property
    def encoding(self) -> str:   # type: ignore[override]
        return "utf-8"

    @property
    def errors(self) -> str:   # type: ignore[override]
        return "backslashreplace"

    def fileno(self) -> int:
        return self._stream

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            if "\n" not in text:
                self._part += text
                if len(self._part) < 1 << 16:
                    if self._part:
                        self._capture.dirty = True
                    return len(text)
                done, self._part = self._part, ""
            else:
                done, _, self._part = (self._part + text).rpartition("\n")
            if self._part:
                self._capture.dirty = True
        self._capture.lines(self._stream, done)
        return len(text)

    def flush(self) -> None:
        self.emit_partial()

    def emit_partial(self) -> None:
        """A part of a line written without its end: out as a line of its own."""
        with self._lock:
            part, self._part = self._part, ""
        if part:
            self._capture.lines(self._stream, part)


class _BinaryWriter:
    """``sys.stdout.buffer``: bytes written to it are decoded and written as text."""

    def __init__(self, text: LineWriter) -> None:
        self._text = text

    def write(self, data: bytes) -> int:
        self._text.write(bytes(data).decode("utf-8", "backslashreplace"))
        return len(data)

    def flush(self) -> None:
        self._text.flush()

    def fileno(self) -> int:
        return self._text.fileno()
