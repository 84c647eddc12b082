"""Runs: create, list, show, finish, delete (JSON)."""

from typing import Annotated

from fastapi import APIRouter, Header, Request, Response

from api_schemas import ProblemType, RunCreate, RunList, RunOut
from party_b.access import Action
from party_b.api.contract import AUTHENTICATED, WITH_BODY, ContractRoute, contract
from party_b.api.deps import ServiceDep, allowed, in_thread
from party_b.service import Caller

A = Action
router = APIRouter(route_class=ContractRoute, tags=["runs"])
P = ProblemType
RUN = (*AUTHENTICATED, P.NOT_FOUND)


@router.post(
    "/v1/runs",
    status_code=201,
    **contract(
        problems=(
            *AUTHENTICATED,
            *WITH_BODY,
            P.INVALID_REQUEST,
            P.LIMIT_EXCEEDED,
            P.IDEMPOTENCY_KEY_REUSED,
            P.TOO_MANY_RUNS,
            P.PRIVACY_BUDGET_EXCEEDED,
        )
    ),
)
async def create_run(
    request: Request,
    spec: RunCreate,
    who: Annotated[Caller, allowed(A.CREATE_RUN)],
    service: ServiceDep,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=128)] = None,
) -> RunOut:
    return await in_thread(request, service.runs.create, who, spec, idempotency_key)


@router.get("/v1/runs", **contract(problems=AUTHENTICATED))
async def list_runs(
    request: Request, who: Annotated[Caller, allowed(A.READ)], service: ServiceDep
) -> RunList:
    return RunList(runs=await in_thread(request, service.runs.list_runs, who))


@router.get("/v1/runs/{run_id}", **contract(problems=(*RUN, P.INTERNAL)))
async def get_run(
    request: Request, run_id: str, who: Annotated[Caller, allowed(A.READ)], service: ServiceDep
) -> RunOut:
    return await in_thread(request, service.runs.get, who, run_id)


@router.post("/v1/runs/{run_id}/finish", **contract(problems=(*RUN, P.RUN_STATE, P.RUN_MOVED)))
async def finish(
    request: Request, run_id: str, who: Annotated[Caller, allowed(A.FINISH)], service: ServiceDep
) -> RunOut:
    return await in_thread(request, service.runs.finish, who, run_id)


@router.delete("/v1/runs/{run_id}", status_code=204, **contract(problems=RUN))
async def delete_run(
    request: Request, run_id: str, who: Annotated[Caller, allowed(A.DELETE)], service: ServiceDep
) -> Response:
    """Delete the run and all party B stores for it; frees its place in the token's quota."""
    await in_thread(request, service.runs.delete, who, run_id)
    return Response(status_code=204)
