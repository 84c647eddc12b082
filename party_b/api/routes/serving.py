"""Serving: evaluate and predict (msgpack), each with two doors (``party_b.api.doors``), and
the evaluation history (JSON)."""

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from api_schemas import EvalResultOut, ProblemType
from party_b.access import Action
from party_b.api.contract import (
    MSGPACK,
    OF_A_RUN,
    WITH_BODY,
    ContractRoute,
    contract,
)
from party_b.api.deps import AdmittedDep, ServiceDep, allowed, audited, in_thread, msgpack
from party_b.api.doors import RUN, answered, both
from party_b.service import Caller

A = Action
router = APIRouter(route_class=ContractRoute)
P = ProblemType
FORWARD = (
    *OF_A_RUN,
    *WITH_BODY,
    P.MALFORMED_MESSAGE,
    P.LIMIT_EXCEEDED,
    P.RUN_STATE,
    P.INVALID_REQUEST,
    P.SHAPE_MISMATCH,
    P.ACTIVATIONS_OUT_OF_RANGE,
    P.INTERNAL,
)


@both(
    router,
    "POST",
    "/evaluate",
    A.EVALUATE,
    tags=["training"],
    consumes=MSGPACK,
    message=("EvaluateRequest", "EvaluateResponse"),
    problems=(*FORWARD, P.BATCH_MISMATCH),
)
async def evaluate(
    request: Request,
    run_id: str,
    who: AdmittedDep,
    service: ServiceDep,
    split: Annotated[str, Query(pattern="^(eval|train)$")] = "eval",
) -> Response:
    body = await request.body()
    check = partial(service.serving.evaluate, who, run_id, body, split)
    return msgpack(
        await audited(request, who, A.EVALUATE, run_id, answered(request, run_id, check))
    )


@both(
    router,
    "POST",
    "/predict",
    A.PREDICT,
    tags=["serving"],
    consumes=MSGPACK,
    message=("PredictRequest", "PredictResponse"),
    problems=(*FORWARD, P.UNKNOWN_IDS, P.PRIVACY_REFUSED),
)
async def predict(request: Request, run_id: str, who: AdmittedDep, service: ServiceDep) -> Response:
    body = await request.body()
    check = partial(service.serving.predict, who, run_id, body)
    return msgpack(await audited(request, who, A.PREDICT, run_id, answered(request, run_id, check)))


@router.get(f"{RUN}/evaluations", tags=["runs"], **contract(problems=OF_A_RUN))
async def evaluations(
    request: Request, run_id: str, who: Annotated[Caller, allowed(A.READ_LOGS)], service: ServiceDep
) -> list[EvalResultOut]:
    return await in_thread(request, service.runs.eval_results, who, run_id)
