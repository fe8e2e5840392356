"""Prometheus's text exposition format (0.0.4) for the head's /metrics, written by
prometheus_client. No I/O.

    the cluster summary (dashboard.metrics_text) --families()--> [Metric]
    the user metrics (MetricsTable.families) ----------------------> [Metric]
        --> text(families): prometheus_client's generate_latest, as one str

prometheus_client writes the lines: names and label values escaped, a counter's
samples named ``NAME_total``, values as floats (``NaN``, ``+Inf``). It is imported on
the first scrape of /metrics, never when the head starts (its import costs the head's
loop ~35 ms once).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

# A histogram's series: its count in each bucket by upper bound (+Inf last), its sum.
HistogramValue = tuple[Sequence[tuple[float, int]], float]


def family(kind: str, name: str, help_text: str, label_names: Sequence[str],
           series: Iterable[tuple[Sequence[str], float | HistogramValue]]) -> Metric:
    """One metric family: ``kind`` "counter", "gauge" or "histogram"; ``series``: each
    one's label values (in ``label_names``' order) and its value (a histogram's:
    HistogramValue, its bounds' counts not yet added up)."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.utils import floatToGoString  # an ``le`` as its histograms write it
    labels = list(label_names)
    if kind == "histogram":
        h = HistogramMetricFamily(name, help_text, labels=labels)
        for values, value in series:
            assert isinstance(value, tuple)
            counts, total = value
            acc, buckets = 0, []
            for bound, n in counts:
                acc += n
                buckets.append((floatToGoString(bound), acc))
            h.add_metric(list(values), buckets, total)
        return h
    fam = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
        name, help_text, labels=labels)
    for values, value in series:
        assert not isinstance(value, tuple)
        fam.add_metric(list(values), value)
    return fam


def text(families: Iterable[Metric]) -> str:
    """The exposition text of ``families``, in their order."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import Collector

    class _Once(Collector):
        def collect(self) -> Iterator[Metric]:
            return iter(families)

    return generate_latest(_Once()).decode()


__all__ = ["family", "text", "HistogramValue"]
