"""Party B's lifecycle as probes, load balancers and autoscalers see it.

    starting  -> serving -> draining
    (lifespan     (lifespan     (SIGTERM: party_b.drain; or the lifespan's shutdown)
     not run yet)  started)

* :class:`Lifecycle` holds the phase and counts the API requests in flight; the number of
  training steps among them is the gauge ``fedlite_b_steps_in_flight`` (a
  HorizontalPodAutoscaler scales on it: docs/DEPLOY.md).
* :class:`InFlightMiddleware` counts every ``/v1/`` request while it runs and, once party B
  drains, answers each new one at once with 503 ``unavailable`` and ``Retry-After``: nothing
  of it has run, so party A (which retries 5xx) sends it again, to this replica after its
  restart or to another one. Requests already in flight run to their end.

Everything here runs on the event loop thread only (the middleware, the probes, the drain),
so the counts need no lock: a request is counted or refused in one step, with no ``await``
between the phase check and the count.
"""

import re
from enum import StrEnum

from prometheus_client import CollectorRegistry, Gauge
from starlette.types import ASGIApp, Receive, Scope, Send

from api_schemas import ProblemType
from party_b.api.problems import problem_response

__all__ = ["RETRY_AFTER_SECONDS", "InFlightMiddleware", "Lifecycle", "Phase"]

# What a refused request is told to wait (seconds): about a replica's restart, and above
# party A's 5 s cap on its own backoff, which it applies anyway.
RETRY_AFTER_SECONDS = 5

_STEP = re.compile(r"^/v1/runs/[^/]+/steps$")


class Phase(StrEnum):
    STARTING = "starting"  # the app's lifespan has not started (recovery, label table)
    SERVING = "serving"
    DRAINING = "draining"  # stopping: no new API requests, the ones in flight finish


class Lifecycle:
    """The phase of one party B app and its API requests in flight."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.phase = Phase.STARTING
        self.requests_in_flight = 0  # /v1/ requests, steps included
        self.steps_in_flight = Gauge(
            "fedlite_b_steps_in_flight",
            "training step requests being handled now (held for their turn, waiting for a "
            "worker thread, or computing): the autoscaling signal",
            registry=registry,
        )

    def serving(self) -> None:
        if self.phase is Phase.STARTING:
            self.phase = Phase.SERVING

    def drain(self) -> bool:
        """Refuse new API requests from now on; True the first time only."""
        begun = self.phase is not Phase.DRAINING
        self.phase = Phase.DRAINING
        return begun

    @property
    def draining(self) -> bool:
        return self.phase is Phase.DRAINING


class InFlightMiddleware:
    """Count ``/v1/`` requests in flight (steps also on the gauge); refuse new ones while
    party B drains. Probes, metrics and the dashboard are never refused or counted."""

    def __init__(self, app: ASGIApp, *, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        lifecycle = self.lifecycle
        if lifecycle.draining:
            response = problem_response(
                ProblemType.UNAVAILABLE,
                "party B is shutting down; send the request again (to this address: a load "
                "balancer or the restarted server takes it)",
            )
            response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
            await response(scope, receive, send)
            return
        step = scope["method"] == "POST" and _STEP.match(path) is not None
        lifecycle.requests_in_flight += 1
        if step:
            lifecycle.steps_in_flight.inc()
        try:
            await self.app(scope, receive, send)
        finally:
            lifecycle.requests_in_flight -= 1
            if step:
                lifecycle.steps_in_flight.dec()
