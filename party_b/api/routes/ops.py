"""Operations: liveness and Prometheus metrics (no token needed)."""

import anyio
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from party_b.api.contract import ContractRoute

router = APIRouter(route_class=ContractRoute, tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics", response_class=Response)
async def prometheus(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    # in a thread: the per-run metrics query the store (party_b.dashboard.prometheus)
    body = await anyio.to_thread.run_sync(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
