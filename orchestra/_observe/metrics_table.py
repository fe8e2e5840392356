"""The head's user metrics: every process's reports added up, exported and charted. No I/O.

    METRICS frame -> MetricsTable.add(batch): a counter's increases and a histogram's
        counts and sums added to the totals of its (name, tags); a gauge's last value kept
    /metrics -> exposition(): each family as prometheus_client's, written by it
        (_observe/exposition.py): ``# HELP``, ``# TYPE`` and one line per series (a
        counter's ``NAME_total``, a histogram's ``_bucket{le=...}``, ``_count``, ``_sum``)
    the dashboard -> sample(now) every few seconds into History (a counter's total, a
        gauge's value, a histogram's mean), charted per series

A name declared as two kinds keeps the first; the other's reports are dropped and counted
(``conflicts``). Series are bounded (``max_series``): past it, new ones are dropped and
counted too, so a tag with unbounded values cannot grow the head without limit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._protocol import pb
from . import exposition
from .metrics import COUNTER, GAUGE, HISTOGRAM, KIND_NAMES

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

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
        """Every series in Prometheus's text exposition format (0.0.4; a counter's
        samples are named ``NAME_total``)."""
        return exposition.text(self.families_for_export())

    def families_for_export(self) -> list[Metric]:
        """Each family as prometheus_client's Metric, by name."""
        out = []
        for name, fam in sorted(self.families.items()):
            kind = KIND_NAMES[fam.kind]
            bounds = (*fam.boundaries, float("inf"))
            series: list[tuple[tuple[str, ...], float | exposition.HistogramValue]] = [
                (tags, (list(zip(bounds, s.buckets, strict=True)), s.value)
                 if fam.kind == HISTOGRAM else s.value)
                for tags, s in fam.series.items()]
            out.append(exposition.family(kind, name, fam.description or name, fam.tag_keys,
                                         series))
        return out

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


__all__ = ["MetricsTable", "COUNTER", "GAUGE", "HISTOGRAM"]
