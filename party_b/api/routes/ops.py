"""Operations: liveness (no token needed) and Prometheus metrics.

``/metrics`` carries the process's metrics (requests, latency, steps and bytes of all runs
together, memory, CPU) to anyone who reaches it, and nothing of any one run. The per-run
series (``party_b.dashboard.prometheus``: run ids, names, owners, progress, traffic; loss,
accuracy and evaluations only if the operator opted in) are added for a request that carries
the operator's credential (``FEDLITE_B_DASHBOARD_TOKEN``); where one is set, a request
without it, or with a wrong one, is refused 401. Party A reaches this port: its own runs'
series would be a side channel past the run's privacy policy (docs/PRIVACY.md).
"""

from typing import Any

import anyio
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api_schemas import ProblemType
from party_b.api.contract import ContractRoute, contract

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


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        **_PROMETHEUS_TEXT,
        **contract(problems=(ProblemType.UNAUTHORIZED,))["responses"],
    },
)
async def prometheus(request: Request) -> Response:
    body = generate_latest(request.app.state.metrics.registry)
    operator = request.app.state.operator
    if operator is not None:
        operator(request)  # 401 problem+json without the operator's credential
        # in a thread: the per-run metrics query the store (party_b.dashboard.prometheus)
        body += await anyio.to_thread.run_sync(generate_latest, request.app.state.run_registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
