"""Party B's routes, one module per resource; each route declares what it consumes and the
problems it answers (``party_b.api.contract``), and a route that acts on a run has two doors:
the run's own token's path and its feature parties' (``party_b.api.doors``)."""

from fastapi import APIRouter

from party_b.api.routes import alignment, ops, runs, serving, steps

ROUTERS: tuple[APIRouter, ...] = (
    ops.router,
    runs.router,
    alignment.router,
    steps.router,
    serving.router,
)

__all__ = ["ROUTERS"]
