"""The routes of a run's feature parties (docs/PROTOCOL.md section 12.3), each under the
party's own token: ``/v1/runs/{run_id}/parties/{party}/...`` and ``GET /v1/party``.

A request is checked in a worker thread (``service.parties.check_*``); one that passes
attends its meeting on the event loop (``service.meetings``) until every party's part is in.
"""

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import AlignmentIn, AlignmentOut, PartyOut, ProblemType, PsiInfo, ResumeIn, RunOut
from party_b.api.contract import AUTHENTICATED, MSGPACK, WITH_BODY, ContractRoute, contract
from party_b.api.deps import ServiceDep, in_thread, msgpack
from party_b.errors import ProblemError
from party_b.party_tokens import PartyScope, authenticate_party
from party_b.service import Service
from party_b.service.parties import Ticket

router = APIRouter(route_class=ContractRoute)
P = ProblemType
T = TypeVar("T")
PARTY = (*AUTHENTICATED, P.NOT_FOUND)
MEETING = (P.PARTIES_INCOMPLETE, P.LIMIT_EXCEEDED, P.INTERNAL)
PATH = "/v1/runs/{run_id}/parties/{party}"

# The bearer scheme of the OpenAPI document (the same one every route declares).
_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="An API token from party B's operator (`fedlite-b token issue`; for a "
    "feature party of a run, `fedlite-b parties tokens`).",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]


def _scope(request: Request, credentials: Credentials) -> PartyScope:
    """The party token of ``Authorization: Bearer``, looked up on every request; 401 for
    none, or one that is not an active party token."""
    token = credentials.credentials.strip() if credentials is not None else ""
    if not token:
        raise ProblemError(ProblemType.UNAUTHORIZED, "send 'Authorization: Bearer <token>'")
    sessions: sessionmaker[Session] = request.app.state.sessions
    with sessions() as session:
        scope = authenticate_party(session, token)
    if scope is None:
        raise ProblemError(
            ProblemType.UNAUTHORIZED, "unknown or revoked token (these routes take a party token)"
        )
    return scope


def _party(run_id: str, party: str, scope: Annotated[PartyScope, Depends(_scope)]) -> PartyScope:
    """The scope of a party token on its own path; another run or party is 404, as a run
    that does not exist."""
    if (scope.run_id, scope.party) != (run_id, party):
        raise ProblemError.not_found(f"no party {party!r} of run {run_id!r} for this token")
    return scope


PartyDep = Annotated[PartyScope, Depends(_party)]


async def _meet(
    request: Request, service: Service, scope: PartyScope, check: Callable[[], Any]
) -> Any:
    """Check the request in a worker thread; if it passes, wait for the other parties."""

    async def offload(fn: Callable[[], T]) -> T:
        return await in_thread(request, fn)

    epoch = service.meetings.epoch(scope.run_id)  # a rollback during the check is seen
    checked = await offload(check)
    if not isinstance(checked, Ticket):
        return checked  # answered at once (a replayed step, a finished run, ...)
    return await service.meetings.attend(
        scope.run_id,
        checked.key,
        scope.party,
        checked.part,
        checked.sha,
        checked.agenda,
        offload,
        epoch=epoch,
    )


@router.get("/v1/party", tags=["parties"], **contract(problems=AUTHENTICATED))
async def whoami(scope: Annotated[PartyScope, Depends(_scope)]) -> PartyOut:
    """The run and the party this party token acts for."""
    return PartyOut(run_id=scope.run_id, party=scope.party)


@router.get(PATH, tags=["parties"], **contract(problems=(*PARTY, P.INTERNAL)))
async def party_run(request: Request, scope: PartyDep, service: ServiceDep) -> RunOut:
    return await in_thread(request, service.parties.view, scope)


@router.get(f"{PATH}/psi", tags=["parties"], **contract(problems=PARTY))
async def party_psi_info(request: Request, scope: PartyDep, service: ServiceDep) -> PsiInfo:
    info: PsiInfo = await in_thread(request, service.parties.psi_info, scope)
    # a party aligns through its own route, which takes the JSON alignment only
    return info.model_copy(update={"alignment_formats": ["json"]})


@router.post(
    f"{PATH}/psi",
    tags=["parties"],
    **contract(
        consumes=MSGPACK,
        message=("PsiRequest", "PsiReply"),
        problems=(*PARTY, *WITH_BODY, P.MALFORMED_MESSAGE, P.LIMIT_EXCEEDED),
    ),
)
async def party_psi(request: Request, scope: PartyDep, service: ServiceDep) -> Response:
    body = await request.body()
    return msgpack(await in_thread(request, service.parties.psi, scope, body))


@router.post(
    f"{PATH}/alignment",
    tags=["parties"],
    **contract(problems=(*PARTY, *WITH_BODY, P.INVALID_REQUEST, P.RUN_STATE, *MEETING)),
)
async def party_alignment(
    request: Request, body: AlignmentIn, scope: PartyDep, service: ServiceDep
) -> AlignmentOut:
    check = partial(service.parties.check_alignment, scope, body.hashed_ids)
    out: AlignmentOut = await _meet(request, service, scope, check)
    return out


@router.post(
    f"{PATH}/steps",
    tags=["parties"],
    **contract(
        consumes=MSGPACK,
        message=("StepRequest", "StepResponse"),
        problems=(
            *PARTY,
            *WITH_BODY,
            P.MALFORMED_MESSAGE,
            P.STEP_OUT_OF_ORDER,
            P.STEP_REPLAY_MISMATCH,
            P.BATCH_MISMATCH,
            P.RUN_STATE,
            P.SHAPE_MISMATCH,
            P.TRAINING_DIVERGED,
            *MEETING,
        ),
    ),
)
async def party_step(request: Request, scope: PartyDep, service: ServiceDep) -> Response:
    body = await request.body()
    check = partial(service.parties.check_step, scope, body)
    answer: bytes = await _meet(request, service, scope, check)
    return msgpack(answer)


@router.post(
    f"{PATH}/resume",
    tags=["parties"],
    **contract(
        problems=(
            *PARTY,
            *WITH_BODY,
            P.INVALID_REQUEST,
            P.RUN_STATE,
            P.CHECKPOINT_NOT_FOUND,
            P.INTERNAL,
        )
    ),
)
async def party_resume(
    request: Request, body: ResumeIn, scope: PartyDep, service: ServiceDep
) -> RunOut:
    run = await in_thread(request, service.parties.resume, scope, body.from_step)
    # every party's waiting steps (and finish) were for the old future: tell them where it is
    rolled_back = ProblemError(
        ProblemType.STEP_OUT_OF_ORDER,
        f"party {scope.party!r} rolled the run back to step {run.step}",
        expected_step=run.step + 1,
        applied_step=run.step,
    )
    service.meetings.reset(scope.run_id, rolled_back, kinds=("step", "finish"))
    return run


@router.post(
    f"{PATH}/evaluate",
    tags=["parties"],
    **contract(
        consumes=MSGPACK,
        message=("EvaluateRequest", "EvaluateResponse"),
        problems=(
            *PARTY,
            *WITH_BODY,
            P.MALFORMED_MESSAGE,
            P.RUN_STATE,
            P.INVALID_REQUEST,
            P.BATCH_MISMATCH,
            P.SHAPE_MISMATCH,
            P.ACTIVATIONS_OUT_OF_RANGE,
            *MEETING,
        ),
    ),
)
async def party_evaluate(
    request: Request,
    scope: PartyDep,
    service: ServiceDep,
    split: Annotated[str, Query(pattern="^(eval|train)$")] = "eval",
) -> Response:
    body = await request.body()
    check = partial(service.parties.check_evaluate, scope, body, split)
    answer: bytes = await _meet(request, service, scope, check)
    return msgpack(answer)


@router.post(
    f"{PATH}/predict",
    tags=["parties"],
    **contract(
        consumes=MSGPACK,
        message=("PredictRequest", "PredictResponse"),
        problems=(
            *PARTY,
            *WITH_BODY,
            P.MALFORMED_MESSAGE,
            P.RUN_STATE,
            P.INVALID_REQUEST,
            P.UNKNOWN_IDS,
            P.SHAPE_MISMATCH,
            P.ACTIVATIONS_OUT_OF_RANGE,
            *MEETING,
        ),
    ),
)
async def party_predict(request: Request, scope: PartyDep, service: ServiceDep) -> Response:
    body = await request.body()
    check = partial(service.parties.check_predict, scope, body)
    answer: bytes = await _meet(request, service, scope, check)
    return msgpack(answer)


@router.post(
    f"{PATH}/finish",
    tags=["parties"],
    **contract(problems=(*PARTY, P.RUN_STATE, P.STEP_OUT_OF_ORDER, *MEETING)),
)
async def party_finish(request: Request, scope: PartyDep, service: ServiceDep) -> RunOut:
    out: RunOut = await _meet(request, service, scope, partial(service.parties.check_finish, scope))
    return out
