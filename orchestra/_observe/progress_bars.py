"""Progress bars that tasks and actors draw on their driver's terminal (Ray's tqdm_ray).

    task: tqdm(...).update(n) -> at most every flush interval (and at its first update,
        a change of description or total, and close) one line ``:orchestra-bar: {json}``
        on the worker's captured stdout (_observe/log_capture.py) -> head -> the driver
        whose task it is
    driver: LogPrinter takes those lines out before the others (they are never printed
        or folded) -> Bars.update(state, pid, ip) -> drawn on stderr: in a terminal, one
        line per open bar, redrawn in place below the log lines (a log line clears the
        bars, prints, and redraws them); not in a terminal, nothing until a bar closes,
        then its last state as one line
    tqdm(...) in the driver itself draws through the same Bars.

The state a line carries (``BarState``) and what a bar looks like (``render``) are plain
data and functions, with no I/O; ``Bars`` owns the terminal (one lock).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

PREFIX = ":orchestra-bar: "
_REDRAW_S = 0.1          # a terminal is redrawn at most this often
FLUSH_INTERVAL_S = 0.1   # a task's bar sends its state at most this often
_WIDTH = 20              # the bar's cells

T = TypeVar("T")


def render(state: dict[str, Any], now: float, where: str = "") -> str:
    """One bar as a line of text: ``desc: 40%|########            | 40/100 [00:02<00:03,
    19.87it/s] (pid=4242)``; without a total, the count and the rate only."""
    n = state.get("x", 0)
    total = state.get("total")
    unit = state.get("unit") or "it"
    elapsed = max(now - state.get("start", now), 0.0)
    rate = n / elapsed if elapsed > 0 else 0.0
    desc = state.get("desc") or ""
    head = f"{desc}: " if desc else ""
    tail = f" ({where})" if where else ""
    if state.get("postfix"):
        tail = f", {state['postfix']}{tail}"
    if total:
        frac = min(max(n / total, 0.0), 1.0)
        filled = int(frac * _WIDTH)
        left = (total - n) / rate if rate > 0 else 0.0
        return (f"{head}{frac * 100:3.0f}%|{'#' * filled}{' ' * (_WIDTH - filled)}| {n}/{total} "
                f"[{_clock(elapsed)}<{_clock(left)}, {rate:.2f}{unit}/s]{tail}")
    return f"{head}{n}{unit} [{_clock(elapsed)}, {rate:.2f}{unit}/s]{tail}"


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


def parse(line: str) -> dict[str, Any] | None:
    """The state a ``:orchestra-bar:`` line carries; None for any other line (or a
    damaged one, which then prints as it is)."""
    if not line.startswith(PREFIX):
        return None
    try:
        state = json.loads(line[len(PREFIX):])
    except ValueError:
        return None
    return state if isinstance(state, dict) and "uuid" in state else None


class Bars:
    """The driver's open bars and the terminal they are drawn on (``stream``, else
    sys.stderr at each draw); every method takes the one lock."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._lock = threading.RLock()
        self._open: dict[tuple[str, int, str], tuple[dict[str, Any], str]] = {}
        self._drawn = 0          # lines of bars on the terminal now (a terminal only)
        self._last_draw = 0.0

    def _out(self) -> IO[str] | None:
        return self._stream if self._stream is not None else sys.stderr

    def _tty(self, out: IO[str]) -> bool:
        try:
            return out.isatty()
        except (AttributeError, ValueError):
            return False

    def update(self, state: dict[str, Any], pid: int, ip: str = "") -> None:
        """A bar's new state (from a task's line, or a tqdm in this process)."""
        key = (ip, pid, str(state["uuid"]))
        where = f"pid={pid}" + (f", ip={ip}" if ip else "")
        with self._lock:
            out = self._out()
            if out is None:
                return
            tty = self._tty(out)
            if state.get("closed"):
                self._open.pop(key, None)
                # Its final line stays above the bars, as tqdm leaves a finished bar.
                self._write(out, tty, [render(state, time.time(), where)])
                return
            self._open[key] = (state, where)
            if tty:
                now = time.monotonic()
                if now - self._last_draw >= _REDRAW_S or self._drawn < len(self._open):
                    self._write(out, tty, [])

    def print_lines(self, out: IO[str], lines: Iterable[str]) -> None:
        """Log lines for ``out`` (stdout or stderr): printed above the bars, which are
        cleared first and drawn again below."""
        with self._lock:
            bars_out = self._out()
            if self._drawn and bars_out is not None and self._tty(bars_out):
                self._clear(bars_out)
                self._safe(out, "".join(line + "\n" for line in lines))
                self._draw(bars_out)
            else:
                self._safe(out, "".join(line + "\n" for line in lines))

    def close_all(self) -> None:
        """The driver shuts down: every bar still open printed once in its last state."""
        with self._lock:
            out = self._out()
            if out is None:
                self._open.clear()
                return
            tty = self._tty(out)
            lines = [render(s, time.time(), w) for s, w in self._open.values()]
            self._open.clear()
            self._write(out, tty, lines)

    def _write(self, out: IO[str], tty: bool, above: list[str]) -> None:
        """``above`` as lines of their own, then (a terminal) the open bars redrawn."""
        if not tty:
            self._safe(out, "".join(line + "\n" for line in above))
            return
        self._clear(out)
        if above:
            self._safe(out, "".join(line + "\n" for line in above))
        self._draw(out)

    def _clear(self, out: IO[str]) -> None:
        if self._drawn:   # up to the first bar's line, and clear from there down
            self._safe(out, f"\x1b[{self._drawn}A\r\x1b[J")
            self._drawn = 0

    def _draw(self, out: IO[str]) -> None:
        now = time.time()
        lines = [render(s, now, w) for s, w in self._open.values()]
        if lines:
            self._safe(out, "".join(line + "\x1b[K\n" for line in lines))
        self._drawn = len(lines)
        self._last_draw = time.monotonic()

    @staticmethod
    def _safe(out: IO[str], text: str) -> None:
        if not text:
            return
        try:
            out.write(text)
            out.flush()
        except (OSError, ValueError):   # the driver closed its own stream
            pass


_bars: Bars | None = None
_bars_lock = threading.Lock()


def driver_bars() -> Bars:
    """This process's Bars (made at first use)."""
    global _bars
    with _bars_lock:
        if _bars is None:
            _bars = Bars()
        return _bars


_TQDM_IGNORED = frozenset({"leave", "ncols", "file", "dynamic_ncols", "ascii", "miniters",
                           "maxinterval", "smoothing", "bar_format", "colour", "nrows",
                           "lock_args", "delay", "write_bytes", "unit_scale", "unit_divisor",
                           "postfix"})


class tqdm(Iterable[T]):  # noqa: N801 - tqdm's name
    """A progress bar, as ``tqdm.tqdm``, that a task or actor creates and updates and its
    driver draws (one line per bar, redrawn in place); in the driver itself it draws
    there directly.

    ``iterable``: what to iterate over, counting each item (else call ``update``).
    ``desc``: the label. ``total``: the expected count (``len(iterable)`` when it has
    one). ``unit``: what is counted (``"it"``). ``position``: accepted for tqdm's
    sake (bars are drawn in the order they open). ``flush_interval_s`` (or tqdm's
    ``mininterval``): how often a task's bar sends its state at most (0.1 s).
    ``initial``: the count to start from. ``disable``: draw nothing. ``kwargs``: tqdm's
    options that only change its look (leave, ncols, file, ...), accepted and ignored;
    any other raises TypeError naming it."""

    def __init__(self, iterable: Iterable[T] | None = None, desc: str | None = None,
                 total: float | None = None, unit: str = "it", position: int | None = None,
                 flush_interval_s: float | None = None, *, mininterval: float | None = None,
                 initial: float = 0, disable: bool = False, **kwargs: Any) -> None:
        unknown = set(kwargs) - _TQDM_IGNORED
        if unknown:
            raise TypeError(f"tqdm() got options it does not take: {', '.join(sorted(unknown))}")
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except (TypeError, AttributeError):
                total = None
        self.iterable = iterable
        self.desc = desc or ""
        self.total = total
        self.unit = unit
        self.pos = position
        self.n = initial
        self.disable = disable
        self._postfix = ""
        self._interval = next((v for v in (flush_interval_s, mininterval) if v is not None),
                              FLUSH_INTERVAL_S)
        self._uuid = uuid.uuid4().hex
        self._start = time.time()
        self._sent = 0.0
        self._closed = False
        self._emit(force=True)

    # ------------------------------------------------------------ tqdm's API
    def __iter__(self) -> Iterator[T]:
        if self.iterable is None:
            raise TypeError("this tqdm has no iterable: call update(n) instead")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> tqdm[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        """Count ``n`` more (sent to the driver at most every flush interval)."""
        self.n += n
        self._emit()

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        """A new label. ``desc``: the text. ``refresh``: send it now."""
        self.desc = desc or ""
        self._emit(force=refresh)

    def set_description_str(self, desc: str | None = None, refresh: bool = True) -> None:
        """As set_description. ``desc``: the text. ``refresh``: send it now."""
        self.set_description(desc, refresh)

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        """Text after the bar, ``k=v, ...``. ``ordered_dict``, ``kwargs``: the pairs.
        ``refresh``: send it now."""
        pairs = {**(ordered_dict or {}), **kwargs}
        self._postfix = ", ".join(f"{k}={v}" for k, v in pairs.items())
        self._emit(force=refresh)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """Text after the bar. ``s``: the text. ``refresh``: send it now."""
        self._postfix = s
        self._emit(force=refresh)

    def reset(self, total: float | None = None) -> None:
        """Start counting again from 0. ``total``: a new total (else the same)."""
        self.n = 0
        if total is not None:
            self.total = total
        self._start = time.time()
        self._emit(force=True)

    def refresh(self) -> None:
        """Send the bar's state now."""
        self._emit(force=True)

    def close(self) -> None:
        """The bar is done: its last state is drawn once, above the open bars."""
        if not self._closed:
            self._closed = True
            self._emit(force=True)

    def write(self, s: str) -> None:  # tqdm.write, as a method too
        """Print ``s`` as a line without breaking the bars. ``s``: the text."""
        safe_print(s)

    # ------------------------------------------------------------ sending
    def state(self) -> dict[str, Any]:
        """What the driver draws from: count, total, label, unit, start, closed."""
        return {"uuid": self._uuid, "x": self.n, "total": self.total, "desc": self.desc,
                "unit": self.unit, "start": self._start, "postfix": self._postfix,
                "pos": self.pos, "closed": self._closed}

    def _emit(self, force: bool = False) -> None:
        if self.disable:
            return
        now = time.monotonic()
        if not force and now - self._sent < self._interval:
            return
        self._sent = now
        from .log_capture import active
        capture = active()
        if capture is None:   # the driver: draw here
            driver_bars().update(self.state(), os.getpid())
        else:
            capture.writers[1].write(PREFIX + json.dumps(self.state()) + "\n")


def safe_print(*args: Any, sep: str = " ", end: str = "\n", file: IO[str] | None = None,
               flush: bool = False) -> None:
    """print() that keeps the driver's bars intact (in a task it is print()).

    ``args``, ``sep``, ``end``, ``file``, ``flush``: as print's."""
    from .log_capture import active
    if active() is not None or _bars is None:
        print(*args, sep=sep, end=end, file=file, flush=flush)
        return
    text = sep.join(str(a) for a in args) + end
    _bars.print_lines(file or sys.stdout, text.rstrip("\n").split("\n"))
