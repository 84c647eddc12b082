"""Two doors to one room: a route that acts on a run answers on the run's own path, for the
token that created it (docs/PROTOCOL.md section 10), and on the path of each of its feature
parties, for that party's token (section 12.3). Both doors lead to the same endpoint, the same
service call and the same meeting; only who may knock differs (``deps.allowed``).

    both(router, "POST", "/steps", Action.STEP, ...)
        POST /v1/runs/{run_id}/steps                   the run's own token
        POST /v1/runs/{run_id}/parties/{party}/steps   a party token of that run and party

``answered`` is how such an endpoint serves a request: the room checks it in a worker thread
and answers at once, or hands back a ticket that waits in its meeting on the event loop
(``party_b.service.meetings``).
"""

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Request

from api_schemas import ProblemType
from party_b.access import Action
from party_b.api.contract import contract
from party_b.api.deps import allowed, in_thread
from party_b.errors import ProblemError
from party_b.service import Service, Ticket

__all__ = ["MEETING", "PARTY", "RUN", "Step", "answered", "both"]

T = TypeVar("T")
P = ProblemType


@dataclass(frozen=True)
class Step:
    """Which step a request is (None: not a step request), and whose: a party token's party
    (None: the run's own token, for its only party)."""

    number: int | None
    party: str | None


RUN = "/v1/runs/{run_id}"
PARTY = "/v1/runs/{run_id}/parties/{party}"

# What a feature party's request may also get while it waits for the others (section 12.4)
MEETING = (P.PARTIES_INCOMPLETE, P.CALL_OUT_OF_ORDER, P.LIMIT_EXCEEDED, P.INTERNAL)


def both(
    router: APIRouter,
    method: str,
    tail: str,
    action: Action,
    *,
    tags: list[str],
    problems: Iterable[ProblemType],
    own: str | None = None,
    **declared: Any,
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Register the decorated endpoint at ``RUN + tail`` (or ``own``) for a run's own token
    and at ``PARTY + tail`` for its feature parties' tokens, each with the ``allowed``
    dependency of its door (the endpoint reads the caller through ``AdmittedDep``).
    ``declared``: the rest of the route's ``contract``."""
    problems = tuple(problems)

    def register(endpoint: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        doors = (
            (own or RUN + tail, allowed(action), tags, problems),
            (PARTY + tail, allowed(action, party=True), ["parties"], (*problems, *MEETING)),
        )
        for path, knock, door_tags, door_problems in doors:
            router.add_api_route(
                path,
                endpoint,
                methods=[method],
                tags=list(door_tags),
                dependencies=[knock],
                **contract(problems=door_problems, **declared),
            )
        return endpoint

    return register


async def answered(
    request: Request, run_id: str, check: Callable[[], T | Ticket], *, step: Step | None = None
) -> T:
    """``check()`` in a worker thread: its answer, or its ticket's once the meeting ran.
    ``step``: the request is this step of this party (the later steps it sent that wait
    are refused with it)."""
    service: Service = request.app.state.service

    async def offload(fn: Callable[[], Any]) -> Any:
        return await in_thread(request, fn)

    meetings = service.meetings
    epoch = meetings.epoch(run_id)  # a rollback during the check is seen
    try:
        checked = await offload(check)
    except ProblemError:
        if step is not None and step.number is not None:
            meetings.refused(run_id, step.party, step.number)
        raise
    if isinstance(checked, Ticket):
        result: T = await meetings.attend(run_id, checked, offload, epoch=epoch)
        return result
    meetings.poke(run_id)  # a step applied at once may let a waiting successor run
    answer: T = checked
    return answer
