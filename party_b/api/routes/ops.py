"""Operations: liveness and Prometheus metrics (no token needed)."""

from typing import Any

import anyio
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from party_b.api.contract import ContractRoute

router = APIRouter(route_class=ContractRoute, tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


_PROMETHEUS_TEXT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text exposition format",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


@router.get("/metrics", response_class=Response, responses=_PROMETHEUS_TEXT)
async def prometheus(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    # in a thread: the per-run metrics query the store (party_b.dashboard.prometheus)
    body = await anyio.to_thread.run_sync(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
