"""The driver's part of log forwarding: its tasks' and actors' output on its terminal.

    init() -> LogPrinter: a second connection to the head (Hello kind "logs", naming the
        driver's first connection as its job), read by a daemon thread of its own, so
        lines appear while the driver sleeps or computes, not only inside get()
    head --LOG_LINES--> thread -> a task's progress bar lines to the driver's Bars
        (_observe/progress_bars.py), the others -> LineFolder (repeated lines folded) ->
        "(square pid=4242) hello" on sys.stdout, stderr lines on sys.stderr, above the bars
    shutdown() -> close(): LOG_FLUSH to the head and back (every line the head had is
        printed), the folded counts printed, the connection closed

LineFolder is Ray's log deduplication: a line printed by several workers within
FOLD_WINDOW_S (numbers and hex words ignored when comparing) is printed once at once,
and the copies are counted and printed as one line ending ``[repeated 7x across
cluster]`` when the window ends. ORCHESTRA_DEDUP_LOGS=0 prints every line.
"""
from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time

from .._protocol import pb
from .._protocol import wire as _wire
from .._protocol.connection import Connection
from .progress_bars import PREFIX, driver_bars, parse

FOLD_WINDOW_S = 5.0
_CLOSE_WAIT_S = 2.0
_NUMBERS = re.compile(r"(\d+|0x[0-9a-fA-F]+)")


def prefix(chunk: pb.LogChunk) -> str:
    """``(square pid=4242)``, with ``, ip=10.0.0.7`` on a cluster of several nodes."""
    ip = f", ip={chunk.ip}" if chunk.ip else ""
    return f"({chunk.name} pid={chunk.pid}{ip})"


def fold_key(line: str) -> str:
    """What identical lines share: the line without its words holding numbers (pids,
    ranks, addresses differ between workers)."""
    return " ".join(w for w in line.split() if not _NUMBERS.search(w))


class _Seen:
    __slots__ = ("since", "count", "text", "stream", "sources")

    def __init__(self, since: float, text: str, stream: int, source: tuple[str, int]) -> None:
        self.since = since
        self.count = 0          # copies not printed yet
        self.text = text        # the latest copy, with its prefix
        self.stream = stream
        self.sources = {source}


class LineFolder:
    """Lines in, lines to print out (no I/O): repeated lines folded, as Ray does.

    ``add(chunk, now)`` -> [(stream, text)] to print now; ``expire(now)`` and ``drain()``
    -> the folded counts whose window ended (or all of them)."""

    def __init__(self, window_s: float = FOLD_WINDOW_S, enabled: bool = True) -> None:
        self.window_s = window_s
        self.enabled = enabled
        self.recent: dict[str, _Seen] = {}

    def add(self, chunk: pb.LogChunk, now: float) -> list[tuple[int, str]]:
        pre = prefix(chunk)
        out = [(chunk.stream, f"{pre} {line}") for line in chunk.lines]
        if not self.enabled:
            return out
        kept = []
        source = (chunk.ip, chunk.pid)
        for line, (stream, text) in zip(chunk.lines, out, strict=True):
            key = fold_key(line)
            seen = self.recent.get(key) if key else None
            if seen is None:
                if key:
                    self.recent[key] = _Seen(now, text, stream, source)
                kept.append((stream, text))
                continue
            seen.sources.add(source)
            if len(seen.sources) > 1:   # another worker's copy: counted, not printed
                seen.count += 1
                seen.text = text
            else:                        # the same worker again: printed as it is
                kept.append((stream, text))
        return kept + self.expire(now)

    def expire(self, now: float) -> list[tuple[int, str]]:
        """The folded lines whose window ended: one line each, its copies counted."""
        out = []
        for key in [k for k, s in self.recent.items() if now - s.since >= self.window_s]:
            seen = self.recent[key]
            if seen.count > 1:
                out.append((seen.stream, f"{seen.text} [repeated {seen.count}x across cluster]"))
                seen.since, seen.count = now, 0   # folding goes on for the next window
            else:
                if seen.count == 1:
                    out.append((seen.stream, seen.text))
                del self.recent[key]
        return out

    def drain(self) -> list[tuple[int, str]]:
        """Every count not printed yet (at shutdown)."""
        out = []
        for seen in self.recent.values():
            if seen.count > 1:
                out.append((seen.stream, f"{seen.text} [repeated {seen.count}x across cluster]"))
            elif seen.count == 1:
                out.append((seen.stream, seen.text))
        self.recent.clear()
        return out


class LogPrinter:
    """The driver's log connection and the thread that prints what comes on it.

    ``address``/``token``: the head's (as the driver's own connection); ``job``: the
    driver's connection id at the head."""

    def __init__(self, address: str, job: int, token: str | None = None) -> None:
        # Its lines come once the head answered the hello (greet: a head going away
        # mid-handshake is tried again; frames sent right after the answer, none).
        self.conn, _, _ = Connection.greet(address, _wire.encode(_wire.HELLO, pb.Hello(
            kind="logs", pid=os.getpid(), log_job=job)), 10.0, token)
        self.folder = LineFolder(enabled=os.environ.get("ORCHESTRA_DEDUP_LOGS", "1") != "0")
        self._lock = threading.Lock()
        self._flushed = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._read, name="orchestra-logs", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        sock = self.conn.sock
        sock.settimeout(1.0)   # folded counts are printed when their window ends
        while True:
            try:
                data = sock.recv(1 << 16)
            except TimeoutError:
                self._print(self.folder.expire(time.monotonic()))
                continue
            except OSError:
                break
            if not data:
                break
            try:
                frames = self.conn.feed(data)
            except _wire.ProtocolError:
                break
            for kind, msg in frames:
                if kind == _wire.LOG_LINES:
                    now = time.monotonic()
                    for chunk in msg.chunks:
                        if any(line.startswith(PREFIX) for line in chunk.lines):
                            chunk = self._bar_lines(chunk)
                        self._print(self.folder.add(chunk, now))
                elif kind == _wire.LOG_FLUSH:
                    self._flushed.set()
        self._flushed.set()

    def _bar_lines(self, chunk: pb.LogChunk) -> pb.LogChunk:
        """Hand a chunk's progress bar lines to the driver's bars; the chunk without them."""
        bars = driver_bars()
        rest = []
        for line in chunk.lines:
            state = parse(line)
            if state is None:
                rest.append(line)
            else:
                bars.update(state, chunk.pid, chunk.ip)
        out = pb.LogChunk()
        out.CopyFrom(chunk)
        del out.lines[:]
        out.lines.extend(rest)
        return out

    def _print(self, lines: list[tuple[int, str]]) -> None:
        if not lines:
            return
        bars = driver_bars()
        with self._lock:
            for stream, text in lines:
                out = sys.stderr if stream == 2 else sys.stdout
                if out is None:   # pythonw, or a driver that closed its streams
                    continue
                bars.print_lines(out, [text])

    def close(self) -> None:
        """Print every line the head holds for this driver, then the folded counts, and
        close (bounded: _CLOSE_WAIT_S)."""
        if self._closed:
            return
        self._closed = True
        self._flushed.clear()
        # A connection the head closed already (its reader ended; a head that died)
        # answers no flush: nothing to wait for (it waited _CLOSE_WAIT_S). A reader that
        # ends from here on sets _flushed as it goes.
        if self._thread.is_alive() and self.conn.send(
                _wire.encode(_wire.LOG_FLUSH, pb.LogFlush(seq=1))):
            self._flushed.wait(_CLOSE_WAIT_S)
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(_CLOSE_WAIT_S)
        self.conn.sock.close()
        self._print(self.folder.drain())
        driver_bars().close_all()
