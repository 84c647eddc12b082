"""What routes depend on: the caller (bearer token and/or client certificate) allowed to do
the route's action, the service, worker threads, msgpack."""

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Annotated, Any, ParamSpec, TypeVar

import anyio
from fastapi import Depends, Request, Response, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import ProblemType
from party_b import audit
from party_b.access import (
    FORWARDED_SUBJECT,
    Action,
    Identity,
    authorize,
    identify,
    presented_subject,
)
from party_b.api.contract import MSGPACK
from party_b.errors import ProblemError
from party_b.service import Caller, Service

__all__ = [
    "AdmittedDep",
    "CallerDep",
    "CallerLookup",
    "ServiceDep",
    "allowed",
    "audited",
    "client_subject",
    "in_thread",
    "msgpack",
]

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
    """The caller of ``Authorization: Bearer <token>`` and, with mutual TLS, the client
    certificate; looked up on every request (so a revoked or expired token stops working at
    once); 401 otherwise (``party_b.access.identify``, through the app's ``CallerLookup``)."""
    token = credentials.credentials.strip() if credentials is not None else ""
    lookup: CallerLookup = request.app.state.callers
    return await lookup(Identity(token or None, client_subject(request)))


class CallerLookup:
    """How the app looks a request's caller up in the database: every request, one or two
    indexed Core reads (``access.identify``).

    On SQLite (reads by an index; in WAL mode a reader waits for no writer) on the event
    loop, on one connection kept for it: as a sync dependency it went to a worker thread
    and back, two thread wake-ups per request that cost more than the read (docs/
    PERFORMANCE.md, "The floor"), and a session and a pool checkout per lookup cost three
    times the read itself ("Steps at the limit"). Each lookup ends its read transaction, so
    the next one sees every commit since (a revocation by ``fedlite-b token revoke``, another
    process). On a database across the network, in a worker thread with a session of its
    own, where its round trip blocks nothing else."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self._engine: Engine = sessions.kw["bind"]
        self._here = self._engine.dialect.name == "sqlite"
        self._kept: Connection | None = None  # the event loop's connection, between lookups

    async def __call__(self, identity: Identity) -> Caller:
        if self._here:
            return self._on_kept(identity)
        return await anyio.to_thread.run_sync(partial(self._in_session, identity))

    def _on_kept(self, identity: Identity) -> Caller:
        # taken out while in use: a lookup from another thread (another event loop in a test)
        # opens a connection of its own instead of sharing this one
        connection, self._kept = self._kept, None
        if connection is None:
            connection = self._engine.connect()
        try:
            caller = identify(connection, identity)
        except ProblemError:
            self._put_back(connection)  # a refusal: the connection is fine
            raise
        except BaseException:
            connection.invalidate()  # its state unknown: the next lookup opens another
            raise
        self._put_back(connection)
        return caller

    def _put_back(self, connection: Connection) -> None:
        try:
            connection.rollback()  # ends the read: the next lookup sees newer commits
        except Exception:
            connection.invalidate()
            return
        if self._kept is None:
            self._kept = connection
        else:
            connection.close()

    def _in_session(self, identity: Identity) -> Caller:
        with self._sessions() as session:
            return identify(session, identity)

    def close(self) -> None:
        """Close the kept connection (before the engine is disposed)."""
        connection, self._kept = self._kept, None
        if connection is not None:
            connection.close()


def client_subject(request: Request) -> str | None:
    """The caller's verified client certificate subject (RFC 4514): its connection's, from
    the ASGI TLS extension (``party_b.ops.mtls`` fills it in for uvicorn), or the one the
    trusted load balancer forwards on its own connection (``access.presented_subject``);
    None without mutual TLS."""
    tls = request.scope.get("extensions", {}).get("tls") or {}
    name = tls.get("client_cert_name")
    connection = name if isinstance(name, str) and name else None
    trusted_proxy: str | None = getattr(request.app.state, "trusted_proxy_subject", None)
    forwarded = request.headers.get(FORWARDED_SUBJECT)
    return presented_subject(connection, forwarded, trusted_proxy)


class _Allowed:
    """The dependency of a route doing ``action``: the caller, if it may: any token but a
    party token, which is unknown outside its party's routes (401)."""

    def __init__(self, action: Action) -> None:
        self.action = action

    async def __call__(
        self, request: Request, caller: Annotated[Caller, Depends(_caller)]
    ) -> Caller:
        if caller.party is not None:
            raise ProblemError(
                ProblemType.UNAUTHORIZED,
                "unknown or revoked token (a party token acts on its party's routes only, "
                "/v1/runs/{id}/parties/{party}/...)",
                reason="token",
            )
        return await self.admit(request, caller)

    async def admit(self, request: Request, caller: Caller) -> Caller:
        """The caller, within its scope (403, audited), for the route's endpoint."""
        # async: the scope check is arithmetic on the caller, no reason for a thread hop
        try:
            authorize(caller, self.action)
        except ProblemError:
            # a known caller trying what its scope does not cover: the operator should know
            run_id = request.path_params.get("run_id")
            record = partial(audit.record, request.app.state.sessions, caller, self.action, run_id)
            await anyio.to_thread.run_sync(partial(record, outcome="refused"))
            raise
        request.state.caller = caller
        return caller


class _PartyAllowed(_Allowed):
    """On the routes of a run's feature party (``/v1/runs/{run_id}/parties/{party}/...``):
    that party's token only (401 for any other token; 404 for another run's or party's
    path, as for a run that does not exist)."""

    async def __call__(  # type: ignore[override]
        self, request: Request, run_id: str, party: str, caller: Annotated[Caller, Depends(_caller)]
    ) -> Caller:
        if caller.party is None:
            raise ProblemError(
                ProblemType.UNAUTHORIZED,
                "unknown or revoked token (these routes take a party token)",
                reason="token",
            )
        if (caller.party.run_id, caller.party.party) != (run_id, party):
            raise ProblemError.not_found(f"no party {party!r} of run {run_id!r} for this token")
        return await self.admit(request, caller)


async def audited(
    request: Request, caller: Caller, action: Action, run_id: str, call: Awaitable[T]
) -> T:
    """``await call``, with a refusal of it in the audit trail (``audit.refused``): for the
    calls the trail is about (evaluate, predict), a caller refused after its scope check is
    recorded as one refused for its scope is (``_Allowed.admit``)."""
    try:
        return await call
    except ProblemError as error:
        record = partial(audit.refused, request.app.state.sessions, caller, action, run_id, error)
        await anyio.to_thread.run_sync(record)
        raise


def allowed(action: Action, *, party: bool = False) -> Any:
    """``who: Annotated[Caller, allowed(Action.PREDICT)]``: authenticated (401) and within
    its scope (403), before the body or the run is looked at; ``party``: on a feature
    party's routes."""
    return Depends(_PartyAllowed(action) if party else _Allowed(action))


# async, as every dependency here: FastAPI runs a plain ``def`` dependency in a worker
# thread, two thread wake-ups per request for an attribute read (docs/PERFORMANCE.md)
async def _current(request: Request) -> Caller:
    caller: Caller = request.state.caller
    return caller


async def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


CallerDep = Annotated[Caller, Depends(_caller)]
ServiceDep = Annotated[Service, Depends(_service)]
# the caller a route's ``allowed`` dependency admitted (routes with two doors: ``doors``)
AdmittedDep = Annotated[Caller, Depends(_current)]


async def in_thread(request: Request, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in one of the app's worker threads: torch work must not block
    the event loop, which keeps serving other runs, health checks and metrics."""
    limiter: anyio.CapacityLimiter = request.app.state.limiter
    return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=limiter)


def msgpack(data: bytes) -> Response:
    return Response(content=data, media_type=MSGPACK)
