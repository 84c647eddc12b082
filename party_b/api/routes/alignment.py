"""Alignment: private set intersection (msgpack) and aligning a run on it (JSON, or binary
for a run with one feature party). PSI and the JSON alignment have two doors
(``party_b.api.doors``): the run's own token's, and each feature party's."""

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Request, Response

from api_schemas import AlignmentIn, AlignmentOut, ProblemType, PsiInfo
from party_b.access import Action
from party_b.api.contract import AUTHENTICATED, MSGPACK, WITH_BODY, ContractRoute, contract
from party_b.api.deps import AdmittedDep, ServiceDep, allowed, in_thread, msgpack
from party_b.api.doors import RUN, answered, both
from party_b.service import Caller

A = Action
router = APIRouter(route_class=ContractRoute, tags=["alignment"])
P = ProblemType
ALIGN = (*AUTHENTICATED, P.NOT_FOUND, *WITH_BODY, P.INVALID_REQUEST, P.LIMIT_EXCEEDED, P.RUN_STATE)


@both(router, "GET", "/psi", A.READ, own="/v1/psi", tags=["alignment"], problems=AUTHENTICATED)
async def psi_info(request: Request, who: AdmittedDep, service: ServiceDep) -> PsiInfo:
    return await in_thread(request, service.alignment.psi_info, who)


@both(
    router,
    "POST",
    "/psi",
    A.PSI,
    own="/v1/psi",
    tags=["alignment"],
    consumes=MSGPACK,
    message=("PsiRequest", "PsiReply"),
    problems=(*AUTHENTICATED, *WITH_BODY, P.MALFORMED_MESSAGE, P.LIMIT_EXCEEDED),
)
async def psi(request: Request, who: AdmittedDep, service: ServiceDep) -> Response:
    return msgpack(await in_thread(request, service.alignment.psi, who, await request.body()))


@both(router, "POST", "/alignment", A.ALIGN, tags=["runs"], problems=ALIGN)
async def align(
    request: Request, run_id: str, body: AlignmentIn, who: AdmittedDep, service: ServiceDep
) -> AlignmentOut:
    check = partial(service.alignment.align, who, run_id, body.hashed_ids)
    out: AlignmentOut = await answered(request, run_id, check)
    return out


@router.post(
    f"{RUN}/alignment/keys",
    tags=["runs"],
    **contract(
        consumes=MSGPACK,
        message=("AlignRequest", "AlignReply"),
        problems=(*ALIGN, P.MALFORMED_MESSAGE),
    ),
)
async def align_keys(
    request: Request, run_id: str, who: Annotated[Caller, allowed(A.ALIGN)], service: ServiceDep
) -> Response:
    """The alignment in binary: key prefixes in, a bitmap of the kept ones out (16 bytes and
    one bit per id instead of about 135 bytes of JSON), for a run with one feature party."""
    body = await request.body()
    return msgpack(await in_thread(request, service.alignment.align_keys, who, run_id, body))
