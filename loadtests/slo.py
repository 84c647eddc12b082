"""The SLO gate of the load tests: which thresholds a finished run broke.

Kept apart from the locustfile (which imports locust, and with it gevent's monkey-patching)
so that it can be unit-tested like any function.
"""

from dataclasses import dataclass

__all__ = ["Totals", "violations"]


@dataclass(frozen=True)
class Totals:
    """What the gate reads from locust's aggregated stats."""

    requests: int  # all requests, failed ones included
    failures: int
    steps: int  # step requests among them
    p99_ms: float  # 99th percentile response time of the step requests


def violations(totals: Totals, *, max_fail_ratio: float, max_p99_ms: float) -> list[str]:
    """Human-readable reasons the run fails its SLO; empty when it passes.

    A run without a single step request fails too: a load test that measured nothing must
    not pass a CI gate.
    """
    problems = []
    if totals.steps == 0:
        problems.append("no step requests were made")
    if totals.requests == 0:
        return problems
    ratio = totals.failures / totals.requests
    if ratio > max_fail_ratio:
        problems.append(
            f"failure ratio {ratio:.4f} ({totals.failures}/{totals.requests}) "
            f"> {max_fail_ratio:.4f}"
        )
    if totals.p99_ms > max_p99_ms:
        problems.append(f"p99 {totals.p99_ms:.0f} ms > {max_p99_ms:.0f} ms")
    return problems
