"""Party B's routes, one module per resource; each route declares what it consumes and the
problems it answers (``party_b.api.contract``), and a route that acts on a run has two doors:
the run's own token's path and its feature parties' (``party_b.api.doors``)."""

from fastapi import APIRouter

from party_b.api.routes import alignment, ops, runs, serving, steps

# Steps first: a request is matched against the routers in this order, each costing about
# 7 us of matching when it misses (FastAPI's included routers), and steps are almost every
# request a training run makes (33 -> 4 us a step; no two routers share a path).
ROUTERS: tuple[APIRouter, ...] = (
    steps.router,
    ops.router,
    runs.router,
    alignment.router,
    serving.router,
)

__all__ = ["ROUTERS"]
