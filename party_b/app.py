"""Party B's FastAPI app: ``create_app(settings)`` builds everything, routes only orchestrate.

Training endpoints take and return msgpack (docs/PROTOCOL.md); the rest is JSON with an
OpenAPI schema. Every error is RFC 9457 problem+json with a stable ``type``. Torch work runs
in worker threads so the event loop keeps serving other runs, health checks and metrics.
"""

import importlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from time import perf_counter
from typing import Annotated, Any, ParamSpec, TypeVar

import anyio
from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api_schemas import (
    PROBLEM_CONTENT_TYPE,
    AlignmentIn,
    AlignmentOut,
    EvalResultOut,
    ProblemType,
    PsiInfo,
    ResumeIn,
    RunCreate,
    RunList,
    RunOut,
    StepLogPage,
)
from api_schemas.problems import MSGPACK_CONTENT_TYPE
from api_schemas.runs import MAX_STEP
from party_b import auth
from party_b.errors import ProblemError
from party_b.labels import LabelSource, load_label_table
from party_b.metrics import Metrics
from party_b.service import Caller, RunService
from party_b.settings import Settings, parse_token_list
from party_b.store import make_engine, make_session_factory

__all__ = ["create_app"]

log = logging.getLogger("fedlite.party_b")
P = ParamSpec("P")
T = TypeVar("T")

_MSGPACK_TYPES = {MSGPACK_CONTENT_TYPE, "application/x-msgpack"}
_MSGPACK_PATH = re.compile(r"^(/v1/runs/[^/]+/(steps|evaluate|predict)|/v1/psi)$")
_NO_BODY_PATH = re.compile(r"^/v1/runs/[^/]+/finish$")


def problem_response(
    status: int, type_: ProblemType | str, title: str, detail: str, **extensions: Any
) -> JSONResponse:
    body = {"type": str(type_), "title": title, "status": status, "detail": detail, **extensions}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=PROBLEM_CONTENT_TYPE, headers=headers)


class GuardMiddleware:
    """Body size limit (413) and Content-Type check (415) before the app sees a request.

    The body is read here, at most ``max_body_bytes`` of it, and replayed to the app: with
    chunked uploads there is no Content-Length to trust.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)

        problem = self._content_type_problem(scope["path"], headers.get("content-type"), body)
        if problem is not None:
            await problem(scope, receive, send)
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(
            413,
            ProblemType.PAYLOAD_TOO_LARGE,
            "Payload too large",
            f"request bodies are limited to {self.max_body_bytes} bytes on this server",
        )
        await response(scope, receive, send)

    @staticmethod
    def _content_type_problem(path: str, content_type: str | None, body: bytes) -> Any:
        media = (content_type or "").split(";")[0].strip().lower()
        if _MSGPACK_PATH.match(path):
            expected = MSGPACK_CONTENT_TYPE
            ok = media in _MSGPACK_TYPES
        elif _NO_BODY_PATH.match(path) and not body:
            return None
        else:
            expected = "application/json"
            ok = media == "application/json" or media.endswith("+json")
        if ok:
            return None
        return problem_response(
            415,
            ProblemType.UNSUPPORTED_MEDIA_TYPE,
            "Unsupported media type",
            f"{path} takes {expected}, got {media or 'no Content-Type'}",
        )


class MetricsMiddleware:
    """Request count and latency per route and status, as a pure ASGI middleware.

    Starlette's ``@app.middleware("http")`` (BaseHTTPMiddleware) runs the rest of the app in
    a separate task and streams the response through a memory channel; for a 737 KB gradient
    reply that is measurable per request. This one only watches the ``http.response.start``
    message go by.
    """

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = perf_counter()
        status = 500  # what the client sees if the app raises before answering

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            # the router stores the matched route in the (shared) scope
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(perf_counter() - start)


def _load_labels(settings: Settings) -> LabelSource:
    if settings.label_source is not None:
        # An operator-chosen factory (like uvicorn's 'module:app'): label sets that are not
        # one table, e.g. the experiments' images, tags and next tokens.
        module_name, _, attr = settings.label_source.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        source: LabelSource = factory()
        return source
    assert settings.labels is not None
    return load_label_table(
        settings.labels,
        id_column=settings.id_column,
        label_column=settings.label_column,
        feature_columns=settings.feature_columns,
        group_column=settings.group_column,
    )


def create_app(settings: Settings, *, labels: LabelSource | None = None) -> FastAPI:
    """Build party B: database, label table, tokens, service, routes. No import-time state."""
    if labels is None:
        if settings.labels is None and settings.label_source is None:
            raise ValueError("party B needs a label table: set FEDLITE_B_LABELS or --labels")
        labels = _load_labels(settings)
    if settings.database_url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.resolved_database_url())
    sessions = make_session_factory(engine)
    with sessions() as session:
        for name, token in parse_token_list(settings.tokens):
            if not auth.register_token(session, name, token):
                log.warning("token %r from the configuration was revoked; it stays revoked", name)
    metrics = Metrics()
    service = RunService(
        sessions=sessions,
        labels=labels,
        limits=settings.limits,
        metrics=metrics,
        checkpoints_kept=settings.checkpoints_kept,
    )
    service.recover()  # logs, per training run, the step it resumes from
    limiter = anyio.CapacityLimiter(settings.worker_threads)

    async def in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=limiter)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    app = FastAPI(
        title="FedLite-VFL party B",
        version="1.0",
        summary="The label holder's top-model service for two-party split learning.",
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.metrics = metrics
    app.add_middleware(GuardMiddleware, max_body_bytes=settings.limits.max_body_bytes)

    # ------------------------------------------------------------------ errors

    @app.exception_handler(ProblemError)
    async def _problem(_request: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(exc.status, exc.type, exc.title, exc.detail, **exc.extensions)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in exc.errors()
        ]
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
        return problem_response(
            422, ProblemType.INVALID_REQUEST, "Invalid request", detail, errors=errors
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            return problem_response(
                405, ProblemType.METHOD_NOT_ALLOWED, "Method not allowed", str(exc.detail)
            )
        if exc.status_code == 404:
            return problem_response(404, ProblemType.NOT_FOUND, "Not found", str(exc.detail))
        return problem_response(
            exc.status_code, ProblemType.INVALID_REQUEST, "Request refused", str(exc.detail)
        )

    @app.exception_handler(Exception)
    async def _bug(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return problem_response(
            500, ProblemType.INTERNAL, "Internal error", "party B hit a bug; see its log"
        )

    # Outermost, so that it also counts what GuardMiddleware refuses (route "unmatched").
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    # ------------------------------------------------------------------ auth

    def caller(request: Request) -> Caller:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ProblemError(
                401,
                ProblemType.UNAUTHORIZED,
                "Unauthorized",
                "send 'Authorization: Bearer <token>'",
            )
        with sessions() as session:
            row = auth.authenticate(session, token.strip())
        if row is None:
            raise ProblemError(
                401, ProblemType.UNAUTHORIZED, "Unauthorized", "unknown or revoked token"
            )
        return Caller(token_id=row.id, name=row.name)

    CallerDep = Annotated[Caller, Depends(caller)]
    msgpack_body: dict[str, Any] = {
        "requestBody": {
            "required": True,
            "content": {MSGPACK_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        },
        "responses": {"200": {"content": {MSGPACK_CONTENT_TYPE: {"schema": {"type": "string"}}}}},
    }

    def msgpack(data: bytes) -> Response:
        return Response(content=data, media_type=MSGPACK_CONTENT_TYPE)

    # ------------------------------------------------------------------ routes

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/runs", status_code=201, tags=["runs"])
    async def create_run(
        spec: RunCreate,
        who: CallerDep,
        idempotency_key: Annotated[str | None, Header(min_length=1, max_length=128)] = None,
    ) -> RunOut:
        return await in_thread(service.create_run, who, spec, idempotency_key)

    @app.get("/v1/runs", tags=["runs"])
    async def list_runs(who: CallerDep) -> RunList:
        return RunList(runs=await in_thread(service.list_runs, who))

    @app.get("/v1/runs/{run_id}", tags=["runs"])
    async def get_run(run_id: str, who: CallerDep) -> RunOut:
        return await in_thread(service.get_run, who, run_id)

    @app.get("/v1/psi", tags=["alignment"])
    async def psi_info(who: CallerDep) -> PsiInfo:
        return await in_thread(service.psi_info, who)

    @app.post("/v1/psi", tags=["alignment"], openapi_extra=msgpack_body)
    async def psi(request: Request, who: CallerDep) -> Response:
        return msgpack(await in_thread(service.psi, who, await request.body()))

    @app.post("/v1/runs/{run_id}/alignment", tags=["runs"])
    async def align(run_id: str, body: AlignmentIn, who: CallerDep) -> AlignmentOut:
        return await in_thread(service.align, who, run_id, body.hashed_ids)

    @app.post("/v1/runs/{run_id}/resume", tags=["runs"])
    async def resume(run_id: str, body: ResumeIn, who: CallerDep) -> RunOut:
        return await in_thread(service.resume, who, run_id, body.from_step)

    @app.post("/v1/runs/{run_id}/finish", tags=["runs"])
    async def finish(run_id: str, who: CallerDep) -> RunOut:
        return await in_thread(service.finish, who, run_id)

    @app.get("/v1/runs/{run_id}/steps", tags=["runs"])
    async def step_log(
        run_id: str,
        who: CallerDep,
        start: Annotated[int, Query(ge=0, le=MAX_STEP)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> StepLogPage:
        return StepLogPage(steps=await in_thread(service.step_log, who, run_id, start, limit))

    @app.get("/v1/runs/{run_id}/evaluations", tags=["runs"])
    async def evaluations(run_id: str, who: CallerDep) -> list[EvalResultOut]:
        return await in_thread(service.eval_results, who, run_id)

    @app.post("/v1/runs/{run_id}/steps", tags=["training"], openapi_extra=msgpack_body)
    async def step(run_id: str, request: Request, who: CallerDep) -> Response:
        return msgpack(await in_thread(service.step, who, run_id, await request.body()))

    @app.post("/v1/runs/{run_id}/evaluate", tags=["training"], openapi_extra=msgpack_body)
    async def evaluate(
        run_id: str,
        request: Request,
        who: CallerDep,
        split: Annotated[str, Query(pattern="^(eval|train)$")] = "eval",
    ) -> Response:
        body = await request.body()
        return msgpack(await in_thread(service.evaluate, who, run_id, body, split))

    @app.post("/v1/runs/{run_id}/predict", tags=["serving"], openapi_extra=msgpack_body)
    async def predict(run_id: str, request: Request, who: CallerDep) -> Response:
        return msgpack(await in_thread(service.predict, who, run_id, await request.body()))

    return app
