"""Values over the last minutes, for the dashboard's charts. No I/O.

    the head's sampler, every SAMPLE_S -> History.add(now, {series: value}) (a node's CPU
        use, its workers' memory, its store's bytes and spilled bytes; each user metric)
    the page -> since(t): the points after t only (it keeps what it had)

Each series keeps the newest ``keep`` points (5 minutes at one every 2 s); a series no
sample named for that long is dropped.
"""
from __future__ import annotations

import collections
from typing import Any

SAMPLE_S = 2.0
KEEP = 150


class History:
    """Series of (time, value) points by name, each bounded."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.series: dict[str, collections.deque[tuple[float, float]]] = {}

    def add(self, now: float, values: dict[str, float]) -> None:
        """One sample: a point at ``now`` for each named series."""
        for name, value in values.items():
            s = self.series.get(name)
            if s is None:
                s = self.series[name] = collections.deque(maxlen=self.keep)
            s.append((now, value))
        for name in [n for n, s in self.series.items()
                     if n not in values and s and now - s[-1][0] > self.keep * SAMPLE_S]:
            del self.series[name]

    def since(self, t: float, prefix: str = "") -> dict[str, list[Any]]:
        """The points after time ``t`` of the series whose names start with ``prefix``:
        name -> [[time, value], ...] (times rounded to ms, values to 4 significant
        digits: the charts need no more, and the page's bytes per poll stay small)."""
        out: dict[str, list[Any]] = {}
        for name, s in self.series.items():
            if not name.startswith(prefix):
                continue
            pts = [[round(ts, 3), float(f"{v:.4g}")] for ts, v in s if ts > t]
            if pts:
                out[name] = pts
        return out
