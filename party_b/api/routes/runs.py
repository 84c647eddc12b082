"""Runs: create, list, show, finish, delete (JSON); a party token's run (``GET /v1/party``).

Showing and finishing a run have two doors (``party_b.api.doors``): the run's own path and
each of its feature parties' paths.
"""

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response

from api_schemas import PartyOut, ProblemType, RunCreate, RunList, RunOut
from party_b.access import Action
from party_b.api.contract import AUTHENTICATED, OF_A_RUN, WITH_BODY, ContractRoute, contract
from party_b.api.deps import AdmittedDep, CallerDep, ServiceDep, allowed, in_thread
from party_b.api.doors import answered, both
from party_b.errors import ProblemError
from party_b.service import Caller

A = Action
router = APIRouter(route_class=ContractRoute, tags=["runs"])
P = ProblemType


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


@both(router, "GET", "", A.READ, tags=["runs"], problems=(*OF_A_RUN, P.INTERNAL))
async def get_run(request: Request, run_id: str, who: AdmittedDep, service: ServiceDep) -> RunOut:
    return await in_thread(request, service.runs.get, who, run_id)


@both(
    router,
    "POST",
    "/finish",
    A.FINISH,
    tags=["runs"],
    problems=(*OF_A_RUN, P.RUN_STATE, P.STEP_OUT_OF_ORDER, P.RUN_MOVED),
)
async def finish(request: Request, run_id: str, who: AdmittedDep, service: ServiceDep) -> RunOut:
    out: RunOut = await answered(request, run_id, partial(service.runs.finish, who, run_id))
    return out


@router.delete("/v1/runs/{run_id}", status_code=204, **contract(problems=OF_A_RUN))
async def delete_run(
    request: Request, run_id: str, who: Annotated[Caller, allowed(A.DELETE)], service: ServiceDep
) -> Response:
    """Delete the run and all party B stores for it; frees its place in the token's quota."""
    await in_thread(request, service.runs.delete, who, run_id)
    return Response(status_code=204)


@router.get("/v1/party", tags=["parties"], **contract(problems=AUTHENTICATED))
async def whoami(who: CallerDep) -> PartyOut:
    """The run and the feature party this party token acts for."""
    if who.party is None:
        raise ProblemError(
            ProblemType.UNAUTHORIZED,
            "unknown or revoked token (these routes take a party token)",
            reason="token",
        )
    return PartyOut(run_id=who.party.run_id, party=who.party.party)
