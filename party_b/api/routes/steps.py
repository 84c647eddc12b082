"""Training steps (msgpack, exactly once), the step log, and rolling back to a checkpoint."""

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import APIRouter, Query, Request, Response

from api_schemas import ProblemType, ResumeIn, RunOut, StepLogPage
from party_b.access import Action
from party_b.api.contract import AUTHENTICATED, MSGPACK, WITH_BODY, ContractRoute, contract
from party_b.api.deps import ServiceDep, allowed, in_thread, msgpack
from party_b.service import Caller
from shared.types import MAX_STEP

A = Action
T = TypeVar("T")
router = APIRouter(route_class=ContractRoute)
P = ProblemType
RUN = (*AUTHENTICATED, P.NOT_FOUND)


@router.post(
    "/v1/runs/{run_id}/steps",
    tags=["training"],
    **contract(
        consumes=MSGPACK,
        message=("StepRequest", "StepResponse"),
        problems=(
            *RUN,
            *WITH_BODY,
            P.MALFORMED_MESSAGE,
            P.STEP_OUT_OF_ORDER,
            P.STEP_REPLAY_MISMATCH,
            P.BATCH_MISMATCH,
            P.RUN_STATE,
            P.SHAPE_MISMATCH,
            P.TRAINING_DIVERGED,
            P.INTERNAL,
            P.RUN_MOVED,
        ),
    ),
)
async def step(
    request: Request, run_id: str, who: Annotated[Caller, allowed(A.STEP)], service: ServiceDep
) -> Response:
    body = await request.body()

    async def offload(fn: Callable[[], T]) -> T:
        return await in_thread(request, fn)

    # a step that overtook its predecessor waits here, not in one of the few worker threads
    async with service.turns.turn(who, run_id, body, offload):
        return msgpack(await in_thread(request, service.steps.step, who, run_id, body))


@router.get(
    "/v1/runs/{run_id}/steps", tags=["runs"], **contract(problems=(*RUN, P.INVALID_REQUEST))
)
async def step_log(
    request: Request,
    run_id: str,
    who: Annotated[Caller, allowed(A.READ)],
    service: ServiceDep,
    start: Annotated[int, Query(ge=0, le=MAX_STEP)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> StepLogPage:
    return StepLogPage(
        steps=await in_thread(request, service.runs.step_log, who, run_id, start, limit)
    )


@router.post(
    "/v1/runs/{run_id}/resume",
    tags=["runs"],
    **contract(
        problems=(
            *RUN,
            *WITH_BODY,
            P.INVALID_REQUEST,
            P.RUN_STATE,
            P.CHECKPOINT_NOT_FOUND,
            P.INTERNAL,
            P.RUN_MOVED,
        )
    ),
)
async def resume(
    request: Request,
    run_id: str,
    body: ResumeIn,
    who: Annotated[Caller, allowed(A.STEP)],
    service: ServiceDep,
) -> RunOut:
    run = await in_thread(request, service.steps.resume, who, run_id, body.from_step)
    service.turns.moved(who, run_id)  # steps held for the old step go their way
    return run
