"""User metrics, named as Ray's ``ray.util.metrics``: ``Counter``, ``Gauge`` and
``Histogram``, usable in tasks, actors and drivers::

    from orchestra.util.metrics import Counter, Histogram

    requests = Counter("app_requests", "Requests served.", tag_keys=("route",))
    latency = Histogram("app_latency_s", "Request latency.", boundaries=[0.01, 0.1, 1],
                        tag_keys=("route",))

    @orchestra.remote
    def serve(route):
        requests.inc(tags={"route": route})
        latency.observe(0.02, tags={"route": route})

Each process sends what it recorded to the head about once a second; the head adds the
counters' increases and the histograms' counts from every process (a gauge keeps the
last value set, per tags) and exports them at the dashboard's ``/metrics`` with their
Prometheus types, and the dashboard charts them.
"""
from __future__ import annotations

from .._observe.metrics import Counter, Gauge, Histogram, Metric

__all__ = ["Counter", "Gauge", "Histogram", "Metric"]
