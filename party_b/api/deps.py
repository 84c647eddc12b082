"""What routes depend on: the caller (bearer token), the service, worker threads, msgpack."""

from collections.abc import Callable
from functools import partial
from typing import Annotated, ParamSpec, TypeVar

import anyio
from fastapi import Depends, Request, Response, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import ProblemType
from party_b import auth
from party_b.api.contract import MSGPACK
from party_b.errors import ProblemError
from party_b.service import Caller, Service

__all__ = ["CallerDep", "ServiceDep", "in_thread", "msgpack"]

P = ParamSpec("P")
T = TypeVar("T")


# FastAPI's bearer scheme only reads the header (our 401 is problem+json, not its own): through
# it the OpenAPI document declares the scheme and which operations need it.
_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="An API token from party B's operator (`fedlite-b token issue`).",
)


async def _caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
) -> Caller:
    """The token of ``Authorization: Bearer <token>``, looked up on every request (so a
    revoked token stops working at once); 401 otherwise.

    On SQLite the lookup (one read by an index; in WAL mode a reader waits for no writer)
    runs on the event loop: as a sync dependency it went to a worker thread and back, two
    thread wake-ups per request that cost more than the read, milliseconds each on a loaded
    machine (docs/PERFORMANCE.md, "The floor"). On a database across the network it still
    runs in a worker thread, where its round trip blocks nothing else."""
    token = credentials.credentials if credentials is not None else ""
    if not token.strip():
        raise ProblemError(ProblemType.UNAUTHORIZED, "send 'Authorization: Bearer <token>'")
    sessions: sessionmaker[Session] = request.app.state.sessions
    lookup = partial(_lookup, sessions, token.strip())
    row = lookup() if _local(sessions) else await anyio.to_thread.run_sync(lookup)
    if row is None:
        raise ProblemError(ProblemType.UNAUTHORIZED, "unknown or revoked token")
    return row


def _lookup(sessions: sessionmaker[Session], token: str) -> Caller | None:
    with sessions() as session:
        row = auth.authenticate(session, token)
        return None if row is None else Caller(token_id=row.id, name=row.name)


def _local(sessions: sessionmaker[Session]) -> bool:
    """Whether the sessions' database is an SQLite file (read in microseconds, no network)."""
    bind = sessions.kw.get("bind")
    return bind is not None and bind.dialect.name == "sqlite"


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


CallerDep = Annotated[Caller, Depends(_caller)]
ServiceDep = Annotated[Service, Depends(_service)]


async def in_thread(request: Request, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in one of the app's worker threads: torch work must not block
    the event loop, which keeps serving other runs, health checks and metrics."""
    limiter: anyio.CapacityLimiter = request.app.state.limiter
    return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=limiter)


def msgpack(data: bytes) -> Response:
    return Response(content=data, media_type=MSGPACK)
