"""The server's health as the dashboard shows it: memory, and request latency per route.

Both come from party B's own Prometheus registry (``party_b.metrics``), so the page and a
Prometheus scrape of ``/metrics`` agree: memory from the process collector, latency from the
``fedlite_b_request_seconds`` histogram (quantiles estimated within its buckets, the way
PromQL's ``histogram_quantile`` does).
"""

import math
import resource
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import Metric

from party_b.metrics import Metrics

__all__ = ["RouteLatency", "latency_by_route", "memory_bytes", "quantile"]


def memory_bytes(metrics: Metrics) -> tuple[int, str]:
    """(bytes, what they are): the resident set size where the process collector reads it
    (Linux), else the peak resident size from getrusage."""
    for family in metrics.process.collect():
        if family.name == "process_resident_memory_bytes" and family.samples:
            return int(family.samples[0].value), "resident"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024), "peak resident"


@dataclass(frozen=True)
class RouteLatency:
    """Requests of one route since party B started, and their latency in milliseconds."""

    route: str
    requests: int
    mean_ms: float
    p50_ms: float | None
    p95_ms: float | None


def latency_by_route(metrics: Metrics) -> list[RouteLatency]:
    """Every route that answered a request, busiest first."""
    return _summaries(metrics.latency.collect())


def _summaries(families: Iterable[Metric]) -> list[RouteLatency]:
    buckets: dict[str, list[tuple[float, float]]] = {}
    counts: dict[str, float] = {}
    sums: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            route = sample.labels.get("route", "")
            if sample.name.endswith("_bucket"):
                buckets.setdefault(route, []).append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_count"):
                counts[route] = sample.value
            elif sample.name.endswith("_sum"):
                sums[route] = sample.value
    found = [
        RouteLatency(
            route=route,
            requests=int(n),
            mean_ms=1000 * sums.get(route, 0.0) / n,
            p50_ms=_ms(quantile(0.5, buckets.get(route, []))),
            p95_ms=_ms(quantile(0.95, buckets.get(route, []))),
        )
        for route, n in counts.items()
        if n > 0
    ]
    return sorted(found, key=lambda r: (-r.requests, r.route))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (seconds) of a histogram given as cumulative (upper bound, count)
    pairs: linear within the bucket it falls in; in the +Inf bucket, the largest finite bound.
    None without observations."""
    ordered = sorted(buckets)
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            inside = count - lower_count
            share = (rank - lower_count) / inside if inside else 1.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound
