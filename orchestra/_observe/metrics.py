"""User metrics, recorded in any process and exported by the head (Ray's ray.util.metrics).

    Counter.inc / Gauge.set / Histogram.observe (any thread of a task, actor or driver)
        -> this process's Recorder: the changes since its last report, by (name, tags)
    the Recorder's thread, once a second while something changed -> MetricsBatch
        --METRICS frame--> head -> MetricsTable (_observe/metrics_table.py): totals,
        /metrics in Prometheus's text format, the dashboard's charts

A metric is declared in code that may run in many processes (each task's worker makes
its own ``Counter("requests")``); the head adds the counters' increases and the
histograms' counts of every process, and keeps the last value set of a gauge per tags.
Recording costs a dict update under a lock (~1 us); nothing is sent while nothing changes.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .._protocol import pb

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
KIND_NAMES = ("counter", "gauge", "histogram")
REPORT_S = 1.0
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_TAG = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

TagKey = tuple[str, ...]


class _Pending:
    __slots__ = ("kind", "description", "tag_keys", "value", "boundaries", "buckets")

    def __init__(self, metric: Metric) -> None:
        self.kind = metric.kind
        self.description = metric.description
        self.tag_keys = metric.tag_keys
        self.value = 0.0
        self.boundaries = getattr(metric, "boundaries", ())
        self.buckets = [0] * (len(self.boundaries) + 1) if self.kind == HISTOGRAM else []


class Recorder:
    """This process's recorded changes, and the thread that sends them to the head."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[tuple[str, TagKey], _Pending] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def record(self, metric: Metric, tags: TagKey, value: float) -> None:
        key = (metric.name, tags)
        with self.lock:
            p = self.pending.get(key)
            if p is None:
                p = self.pending[key] = _Pending(metric)
            if p.kind == COUNTER:
                p.value += value
            elif p.kind == GAUGE:
                p.value = value
            else:
                p.value += value
                p.buckets[_bucket(p.boundaries, value)] += 1
        if self._thread is None:
            self._start()

    def take(self) -> pb.MetricsBatch | None:
        """The changes since the last take, as one batch (None: none)."""
        with self.lock:
            pending, self.pending = self.pending, {}
        if not pending:
            return None
        batch = pb.MetricsBatch()
        for (name, tags), p in pending.items():
            batch.points.add(name=name, kind=p.kind, description=p.description,
                             tag_keys=p.tag_keys, tag_values=tags, value=p.value,
                             boundaries=p.boundaries, buckets=p.buckets)
        return batch

    def _start(self) -> None:
        with self.lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="orchestra-metrics",
                                            daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from .._protocol import wire as _wire
        while not self._wake.wait(REPORT_S):
            client = client_source()
            if client is None or getattr(client, "lost", None) is not None:
                continue   # kept until this process is connected
            batch = self.take()
            if batch is not None:
                try:
                    client.send(_wire.METRICS, batch)
                except Exception:  # noqa: BLE001 - the cluster is gone: nothing to report to
                    return

    def flush(self) -> None:
        """Send what is recorded now (a driver about to shut down)."""
        from .._protocol import wire as _wire
        client = client_source()
        batch = self.take() if client is not None else None
        if batch is not None:
            client.send(_wire.METRICS, batch)


_recorder = Recorder()
# This process's connection to the head, or None: set by _runtime/context.py (the layer
# above, which owns the connection).
_client_source: Callable[[], Any] = lambda: None


def client_source() -> Any:
    """This process's client (None while it is not connected)."""
    return _client_source()


def set_client_source(source: Callable[[], Any]) -> None:
    """Where the recorder finds this process's client. ``source``: returns it or None."""
    global _client_source
    _client_source = source


def recorder() -> Recorder:
    """This process's Recorder."""
    return _recorder


def _bucket(boundaries: Sequence[float], value: float) -> int:
    for i, b in enumerate(boundaries):
        if value <= b:
            return i
    return len(boundaries)


class Metric:
    """What Counter, Gauge and Histogram share: a name, a description, the names of
    its tags, and default tag values.

    ``name``: the metric's name (letters, digits, ``_`` and ``:``, not starting with a
    digit). ``description``: what it measures (its ``# HELP``). ``tag_keys``: the names
    of the tags each value carries."""

    kind = COUNTER

    def __init__(self, name: str, description: str = "",
                 tag_keys: Sequence[str] | None = None) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"metric name {name!r}: use letters, digits, '_' and ':', not "
                             "starting with a digit (Prometheus's rule)")
        if not isinstance(description, str):
            raise TypeError(f"description must be a string, got {description!r}")
        keys = tuple(tag_keys or ())
        if isinstance(tag_keys, str) or not all(isinstance(k, str) and _TAG.match(k)
                                                for k in keys):
            raise TypeError(f"tag_keys must be a tuple of names (letters, digits, '_'), "
                            f"got {tag_keys!r}")
        if len(set(keys)) != len(keys):
            raise ValueError(f"tag_keys {keys!r} names a tag twice")
        self.name = name
        self.description = description
        self.tag_keys = keys
        self._defaults: dict[str, str] = {}

    @property
    def info(self) -> dict[str, Any]:
        """name, description, tag_keys and default_tags, as Ray's metrics give."""
        return {"name": self.name, "description": self.description,
                "tag_keys": self.tag_keys, "default_tags": dict(self._defaults)}

    def set_default_tags(self, default_tags: dict[str, str]) -> Metric:
        """Tag values used when a record does not give them.

        ``default_tags``: tag name -> value, each name one of ``tag_keys``."""
        self._check_names(default_tags)
        self._defaults = {k: str(v) for k, v in default_tags.items()}
        return self

    def _check_names(self, tags: dict[str, Any]) -> None:
        if not isinstance(tags, dict):
            raise TypeError(f"tags must be a dict of tag name -> value, got {tags!r}")
        unknown = set(tags) - set(self.tag_keys)
        if unknown:
            raise ValueError(f"metric {self.name}: tags {sorted(unknown)} are not among its "
                             f"tag_keys {list(self.tag_keys)}")

    def _tags(self, tags: dict[str, Any] | None) -> TagKey:
        if tags:
            self._check_names(tags)
            merged = {**self._defaults, **{k: str(v) for k, v in tags.items()}}
        else:
            merged = self._defaults
        missing = [k for k in self.tag_keys if k not in merged]
        if missing:
            raise ValueError(f"metric {self.name}: no value for tag(s) {missing}; give them "
                             "in tags= or set_default_tags()")
        return tuple(merged[k] for k in self.tag_keys)

    def _record(self, value: float, tags: dict[str, Any] | None) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"metric {self.name}: the value must be a number, got {value!r}")
        _recorder.record(self, self._tags(tags), float(value))


class Counter(Metric):
    """A count that only goes up (exported as a Prometheus counter); ``inc`` adds.

    ``name``, ``description``, ``tag_keys``: as Metric's."""

    kind = COUNTER

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        """Add ``value`` (> 0) to the count for these ``tags`` (over the defaults)."""
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            raise ValueError(f"counter {self.name}: inc() takes a value > 0, got {value!r}")
        self._record(value, tags)


class Gauge(Metric):
    """A value that goes up and down (a Prometheus gauge); ``set`` records it.

    ``name``, ``description``, ``tag_keys``: as Metric's."""

    kind = GAUGE

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        """Set the value for these ``tags`` (over the defaults) to ``value``."""
        self._record(value, tags)


class Histogram(Metric):
    """A distribution of observed values in buckets (a Prometheus histogram).

    ``name``, ``description``, ``tag_keys``: as Metric's. ``boundaries``: the buckets'
    upper bounds, increasing and positive (a last bucket, +Inf, holds the rest)."""

    kind = HISTOGRAM

    def __init__(self, name: str, description: str = "",
                 boundaries: Sequence[float] | None = None,
                 tag_keys: Sequence[str] | None = None) -> None:
        super().__init__(name, description, tag_keys)
        bounds = tuple(float(b) for b in (boundaries or ()))
        if not bounds or any(b <= 0 for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram {name}: boundaries must be increasing positive "
                             f"numbers, e.g. [0.01, 0.1, 1, 10]; got {boundaries!r}")
        self.boundaries = bounds

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        """Record one observation ``value`` for these ``tags`` (over the defaults)."""
        self._record(value, tags)

    @property
    def info(self) -> dict[str, Any]:
        """As Metric's, with the boundaries."""
        return {**super().info, "boundaries": list(self.boundaries)}
