"""Serving: evaluate and predict (msgpack), and the evaluation history (JSON)."""

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from api_schemas import EvalResultOut, ProblemType
from party_b.access import Action
from party_b.api.contract import AUTHENTICATED, MSGPACK, WITH_BODY, ContractRoute, contract
from party_b.api.deps import ServiceDep, allowed, in_thread, msgpack
from party_b.service import Caller

A = Action
router = APIRouter(route_class=ContractRoute)
P = ProblemType
RUN = (*AUTHENTICATED, P.NOT_FOUND)
FORWARD = (
    *RUN,
    *WITH_BODY,
    P.MALFORMED_MESSAGE,
    P.RUN_STATE,
    P.INVALID_REQUEST,
    P.SHAPE_MISMATCH,
    P.ACTIVATIONS_OUT_OF_RANGE,
    P.INTERNAL,
)


@router.post(
    "/v1/runs/{run_id}/evaluate",
    tags=["training"],
    **contract(
        consumes=MSGPACK,
        message=("EvaluateRequest", "EvaluateResponse"),
        problems=(*FORWARD, P.BATCH_MISMATCH),
    ),
)
async def evaluate(
    request: Request,
    run_id: str,
    who: Annotated[Caller, allowed(A.EVALUATE)],
    service: ServiceDep,
    split: Annotated[str, Query(pattern="^(eval|train)$")] = "eval",
) -> Response:
    body = await request.body()
    return msgpack(await in_thread(request, service.serving.evaluate, who, run_id, body, split))


@router.get("/v1/runs/{run_id}/evaluations", tags=["runs"], **contract(problems=RUN))
async def evaluations(
    request: Request, run_id: str, who: Annotated[Caller, allowed(A.READ)], service: ServiceDep
) -> list[EvalResultOut]:
    return await in_thread(request, service.runs.eval_results, who, run_id)


@router.post(
    "/v1/runs/{run_id}/predict",
    tags=["serving"],
    **contract(
        consumes=MSGPACK,
        message=("PredictRequest", "PredictResponse"),
        problems=(*FORWARD, P.UNKNOWN_IDS, P.PRIVACY_REFUSED),
    ),
)
async def predict(
    request: Request, run_id: str, who: Annotated[Caller, allowed(A.PREDICT)], service: ServiceDep
) -> Response:
    body = await request.body()
    return msgpack(await in_thread(request, service.serving.predict, who, run_id, body))
