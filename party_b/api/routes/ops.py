"""Operations: liveness, readiness (no token needed) and Prometheus metrics.

``/healthz`` (liveness, and the start-up probe: the port opens only once party B has loaded
its label table and recovered its runs) depends on nothing but this process answering.
``/readyz`` also asks whether party B should get work now (``party_b.api.readiness``).

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
from party_b.api.lifecycle import RETRY_AFTER_SECONDS, Phase
from party_b.api.problems import problem_response

router = APIRouter(route_class=ContractRoute, tags=["ops"])

_NOT_READY = {
    Phase.STARTING: "party B is starting",
    Phase.DRAINING: "party B is shutting down",
}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz", response_model=dict[str, str], **contract(problems=(ProblemType.UNAVAILABLE,))
)
async def readyz(request: Request) -> Any:
    """200 when party B takes work: started, not draining, its database answering."""
    phase: Phase = request.app.state.lifecycle.phase
    reason = _NOT_READY.get(phase)
    if reason is None:
        reason = await request.app.state.database_probe()
    if reason is None:
        return {"status": "ready"}
    response = problem_response(ProblemType.UNAVAILABLE, reason)
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


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
        operator.check(request)  # 401 problem+json without the operator's credential
        # in a thread: the per-run metrics query the store (party_b.dashboard.prometheus)
        body += await anyio.to_thread.run_sync(generate_latest, request.app.state.run_registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
