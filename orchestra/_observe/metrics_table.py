"""The head's user metrics: every process's reports added up, exported and charted. No I/O.

    METRICS frame -> MetricsTable.add(batch): a counter's increases and a histogram's
        counts and sums added to the totals of its (name, tags); a gauge's last value kept
    /metrics -> exposition(): ``# HELP``, ``# TYPE`` and one line per series (a
        histogram's ``_bucket{le=...}``, ``_sum`` and ``_count``), label values escaped
    the dashboard -> sample(now) every few seconds into History (a counter's total, a
        gauge's value, a histogram's mean), charted per series

A name declared as two kinds keeps the first; the other's reports are dropped and counted
(``conflicts``). Series are bounded (``max_series``): past it, new ones are dropped and
counted too, so a tag with unbounded values cannot grow the head without limit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .._protocol import pb
from .metrics import COUNTER, GAUGE, HISTOGRAM, KIND_NAMES

MAX_SERIES = 10_000


@dataclass
class Family:
    """One metric name: its kind, help text, tag names, and its series by tag values."""
    kind: int
    description: str
    tag_keys: tuple[str, ...]
    boundaries: tuple[float, ...] = ()
    series: dict[tuple[str, ...], Series] = field(default_factory=dict)


@dataclass
class Series:
    value: float = 0.0                 # counter: total; gauge: last; histogram: sum
    count: int = 0                     # histogram: observations
    buckets: list[int] = field(default_factory=list)


def label_value(value: str) -> str:
    """A label value as the exposition format writes it: backslash, double quote and
    newline escaped."""
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(x: float) -> str:
    """A sample's value as the exposition format writes it (NaN, +Inf, -Inf; an integral
    value without a fraction)."""
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("+Inf" if x > 0 else "-Inf")
    return repr(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


class MetricsTable:
    """The user metrics of the cluster (see the module docstring)."""

    def __init__(self, max_series: int = MAX_SERIES) -> None:
        self.families: dict[str, Family] = {}
        self.max_series = max_series
        self.series_count = 0
        self.conflicts = 0     # reports of a name under another kind or tag names
        self.dropped = 0       # reports of a new series past max_series

    def add(self, batch: pb.MetricsBatch) -> None:
        for p in batch.points:
            fam = self.families.get(p.name)
            keys = tuple(p.tag_keys)
            if fam is None:
                fam = self.families[p.name] = Family(p.kind, p.description, keys,
                                                     tuple(p.boundaries))
            elif fam.kind != p.kind or fam.tag_keys != keys or (
                    p.kind == HISTOGRAM and fam.boundaries != tuple(p.boundaries)):
                self.conflicts += 1
                continue
            tags = tuple(p.tag_values)
            s = fam.series.get(tags)
            if s is None:
                if self.series_count >= self.max_series:
                    self.dropped += 1
                    continue
                s = fam.series[tags] = Series(buckets=[0] * (len(fam.boundaries) + 1)
                                              if p.kind == HISTOGRAM else [])
                self.series_count += 1
            if p.kind == GAUGE:
                s.value = p.value
            else:
                s.value += p.value
            if p.kind == HISTOGRAM:
                for i, n in enumerate(p.buckets[:len(s.buckets)]):
                    s.buckets[i] += n
                s.count += sum(p.buckets)

    def exposition(self) -> str:
        """Every series in Prometheus's text exposition format (0.0.4)."""
        out: list[str] = []
        for name, fam in sorted(self.families.items()):
            out.append(f"# HELP {name} {_help(fam.description or name)}")
            out.append(f"# TYPE {name} {KIND_NAMES[fam.kind]}")
            for tags, s in fam.series.items():
                labels = [f'{k}="{label_value(v)}"' for k, v in zip(fam.tag_keys, tags, strict=True)]
                if fam.kind != HISTOGRAM:
                    out.append(f"{name}{_braces(labels)} {number(s.value)}")
                    continue
                acc = 0
                for bound, n in zip((*fam.boundaries, float("inf")), s.buckets, strict=True):
                    acc += n
                    le = 'le="' + number(bound) + '"'
                    out.append(f"{name}_bucket{_braces([*labels, le])} {acc}")
                out.append(f"{name}_sum{_braces(labels)} {number(s.value)}")
                out.append(f"{name}_count{_braces(labels)} {s.count}")
        return "\n".join(out) + ("\n" if out else "")

    def values(self) -> dict[str, float]:
        """One number per series, for charts: a counter's total, a gauge's value, a
        histogram's mean; keyed ``name{k=v,...}``."""
        out: dict[str, float] = {}
        for name, fam in self.families.items():
            for tags, s in fam.series.items():
                key = name + ("{" + ",".join(f"{k}={v}" for k, v in zip(fam.tag_keys, tags, strict=True))
                              + "}" if tags else "")
                if fam.kind == HISTOGRAM:
                    out[key] = s.value / s.count if s.count else 0.0
                else:
                    out[key] = s.value
        return out

    def rows(self) -> list[dict[str, Any]]:
        """The series as the dashboard lists them: name, kind, tags, value (and a
        histogram's count and sum)."""
        rows = []
        for name, fam in sorted(self.families.items()):
            for tags, s in fam.series.items():
                row: dict[str, Any] = {"name": name, "kind": KIND_NAMES[fam.kind],
                                       "description": fam.description,
                                       "tags": dict(zip(fam.tag_keys, tags, strict=True))}
                if fam.kind == HISTOGRAM:
                    row.update(count=s.count, sum=s.value,
                               mean=s.value / s.count if s.count else None)
                else:
                    row["value"] = s.value
                rows.append(row)
        return rows


def _braces(labels: list[str]) -> str:
    return "{" + ",".join(labels) + "}" if labels else ""


__all__ = ["MetricsTable", "label_value", "number", "COUNTER", "GAUGE", "HISTOGRAM"]
