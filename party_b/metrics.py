"""Prometheus metrics of one party B app (its own registry, so tests can build many apps)."""

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "fedlite_b_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "fedlite_b_request_seconds",
            "HTTP request latency by route",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.steps = Counter(
            "fedlite_b_steps",
            "training steps by outcome (applied, replayed, rejected; held: waited for the step "
            "before it or for the other feature parties, and counted again by how it ended)",
            ["outcome"],
            registry=self.registry,
        )
        self.bytes_received = Counter(
            "fedlite_b_received_bytes", "request body bytes", ["endpoint"], registry=self.registry
        )
        self.bytes_sent = Counter(
            "fedlite_b_sent_bytes", "response body bytes", ["endpoint"], registry=self.registry
        )
        self.step_compute = Histogram(
            "fedlite_b_step_compute_seconds",
            "top-model forward+backward+update per step",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.grad_fallbacks = Counter(
            "fedlite_b_grad_fallbacks",
            "step gradients sent as float32 because they overflow the run's grad_dtype",
            registry=self.registry,
        )
        self.live_runs = Gauge(
            "fedlite_b_live_runs", "runs with models in memory", registry=self.registry
        )
        # process_resident_memory_bytes, process_cpu_seconds_total, process_open_fds, ...
        # (Linux; elsewhere it reports nothing) and python_info, python_gc_*
        self.process = ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(GC_COLLECTOR)
