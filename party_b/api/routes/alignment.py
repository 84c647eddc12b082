"""Alignment: private set intersection (msgpack) and aligning a run on it (JSON)."""

from typing import Annotated

from fastapi import APIRouter, Request, Response

from api_schemas import AlignmentIn, AlignmentOut, ProblemType, PsiInfo
from party_b.access import Action
from party_b.api.contract import AUTHENTICATED, MSGPACK, WITH_BODY, ContractRoute, contract
from party_b.api.deps import ServiceDep, allowed, in_thread, msgpack
from party_b.service import Caller

A = Action
router = APIRouter(route_class=ContractRoute, tags=["alignment"])
P = ProblemType


@router.get("/v1/psi", **contract(problems=AUTHENTICATED))
async def psi_info(
    request: Request, who: Annotated[Caller, allowed(A.READ)], service: ServiceDep
) -> PsiInfo:
    return await in_thread(request, service.alignment.psi_info, who)


@router.post(
    "/v1/psi",
    **contract(
        consumes=MSGPACK,
        message=("PsiRequest", "PsiReply"),
        problems=(*AUTHENTICATED, *WITH_BODY, P.MALFORMED_MESSAGE, P.LIMIT_EXCEEDED),
    ),
)
async def psi(
    request: Request, who: Annotated[Caller, allowed(A.PSI)], service: ServiceDep
) -> Response:
    return msgpack(await in_thread(request, service.alignment.psi, who, await request.body()))


@router.post(
    "/v1/runs/{run_id}/alignment",
    tags=["runs"],
    **contract(
        problems=(
            *AUTHENTICATED,
            P.NOT_FOUND,
            *WITH_BODY,
            P.INVALID_REQUEST,
            P.LIMIT_EXCEEDED,
            P.RUN_STATE,
        )
    ),
)
async def align(
    request: Request,
    run_id: str,
    body: AlignmentIn,
    who: Annotated[Caller, allowed(A.ALIGN)],
    service: ServiceDep,
) -> AlignmentOut:
    return await in_thread(request, service.alignment.align, who, run_id, body.hashed_ids)


@router.post(
    "/v1/runs/{run_id}/alignment/keys",
    tags=["runs"],
    **contract(
        consumes=MSGPACK,
        message=("AlignRequest", "AlignReply"),
        problems=(
            *AUTHENTICATED,
            P.NOT_FOUND,
            *WITH_BODY,
            P.MALFORMED_MESSAGE,
            P.INVALID_REQUEST,
            P.LIMIT_EXCEEDED,
            P.RUN_STATE,
        ),
    ),
)
async def align_keys(
    request: Request, run_id: str, who: Annotated[Caller, allowed(A.ALIGN)], service: ServiceDep
) -> Response:
    """The alignment in binary: key prefixes in, a bitmap of the kept ones out (16 bytes and
    one bit per id instead of about 135 bytes of JSON)."""
    body = await request.body()
    return msgpack(await in_thread(request, service.alignment.align_keys, who, run_id, body))
