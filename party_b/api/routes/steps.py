"""Training steps (msgpack, exactly once), rolling back to a checkpoint, and the step log.

A step and a resume have two doors (``party_b.api.doors``): the run's own path and each of
its feature parties' paths; a step that waits (for its predecessor, or for the other
parties' parts of it) waits on the event loop, never in a worker thread.
"""

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from api_schemas import ProblemType, ResumeIn, RunOut, StepLogPage
from party_b.access import Action
from party_b.api.contract import (
    MSGPACK,
    OF_A_RUN,
    WITH_BODY,
    ContractRoute,
    contract,
)
from party_b.api.deps import AdmittedDep, ServiceDep, allowed, in_thread, msgpack
from party_b.api.doors import RUN, Step, answered, both
from party_b.errors import ProblemError
from party_b.service import Caller
from shared.codec import peek_step
from shared.types import MAX_STEP

A = Action
router = APIRouter(route_class=ContractRoute)
P = ProblemType


@both(
    router,
    "POST",
    "/steps",
    A.STEP,
    tags=["training"],
    consumes=MSGPACK,
    message=("StepRequest", "StepResponse"),
    problems=(
        *OF_A_RUN,
        *WITH_BODY,
        P.MALFORMED_MESSAGE,
        P.LIMIT_EXCEEDED,
        P.STEP_OUT_OF_ORDER,
        P.STEP_REPLAY_MISMATCH,
        P.BATCH_MISMATCH,
        P.RUN_STATE,
        P.SHAPE_MISMATCH,
        P.TRAINING_DIVERGED,
        P.INTERNAL,
        P.RUN_MOVED,
    ),
)
async def step(request: Request, run_id: str, who: AdmittedDep, service: ServiceDep) -> Response:
    body = await request.body()
    check = partial(service.steps.check, who, run_id, body)
    this = Step(peek_step(body), who.party.party if who.party is not None else None)
    return msgpack(await answered(request, run_id, check, step=this))


@both(
    router,
    "POST",
    "/resume",
    A.STEP,
    tags=["runs"],
    problems=(
        *OF_A_RUN,
        *WITH_BODY,
        P.INVALID_REQUEST,
        P.RUN_STATE,
        P.CHECKPOINT_NOT_FOUND,
        P.INTERNAL,
        P.RUN_MOVED,
    ),
)
async def resume(
    request: Request, run_id: str, body: ResumeIn, who: AdmittedDep, service: ServiceDep
) -> RunOut:
    run: RunOut = await in_thread(request, service.steps.resume, who, run_id, body.from_step)
    # the requests waiting for steps (and the end) of the old future: tell them where it is
    rolled_back = ProblemError(
        ProblemType.STEP_OUT_OF_ORDER,
        f"{who.name} rolled the run back to step {run.step}",
        expected_step=run.step + 1,
        applied_step=run.step,
    )
    service.meetings.reset(run_id, rolled_back, kinds=("step", "finish"))
    return run


@router.get(f"{RUN}/steps", tags=["runs"], **contract(problems=(*OF_A_RUN, P.INVALID_REQUEST)))
async def step_log(
    request: Request,
    run_id: str,
    who: Annotated[Caller, allowed(A.READ_LOGS)],
    service: ServiceDep,
    start: Annotated[int, Query(ge=0, le=MAX_STEP)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> StepLogPage:
    return StepLogPage(
        steps=await in_thread(request, service.runs.step_log, who, run_id, start, limit)
    )
