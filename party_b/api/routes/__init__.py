"""Party B's routes, one module per resource; each route declares what it consumes and the
problems it answers (``party_b.api.contract``)."""

from fastapi import APIRouter

from party_b.api.routes import alignment, ops, parties, runs, serving, steps

ROUTERS: tuple[APIRouter, ...] = (
    ops.router,
    runs.router,
    alignment.router,
    steps.router,
    serving.router,
    parties.router,
)

__all__ = ["ROUTERS"]
