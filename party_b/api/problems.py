"""Rendering errors as RFC 9457 problem+json, and the handlers that do it for the app.

Every error party B answers is one of these: a ``ProblemError`` from the service, FastAPI's
request validation (422 ``invalid-request`` with every error), Starlette's 404 and 405, and
anything unexpected (500 ``internal``, logged; the detail says nothing about the bug).
"""

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api_schemas.problems import PROBLEM_CONTENT_TYPE, PROBLEMS, ProblemType
from party_b.errors import ProblemError

__all__ = ["install_problem_handlers", "problem_response"]

log = logging.getLogger("fedlite.party_b")

# Starlette's own HTTP errors, by status (any other is refused as an invalid request)
_HTTP_ERRORS = {404: ProblemType.NOT_FOUND, 405: ProblemType.METHOD_NOT_ALLOWED}


def problem_response(type_: ProblemType, detail: str, **extensions: Any) -> JSONResponse:
    """The problem+json response of ``type_``, with its status and title from PROBLEMS."""
    return render(ProblemError(type_, detail, **extensions))


def render(error: ProblemError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(
        error.body(), status_code=error.status, media_type=PROBLEM_CONTENT_TYPE, headers=headers
    )


def install_problem_handlers(app: FastAPI) -> None:
    """Make every error the app can answer a problem+json response."""

    @app.exception_handler(ProblemError)
    async def _problem(_request: Request, exc: ProblemError) -> JSONResponse:
        return render(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in exc.errors()
        ]
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
        return problem_response(ProblemType.INVALID_REQUEST, detail, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = _HTTP_ERRORS.get(exc.status_code, ProblemType.INVALID_REQUEST)
        if type_ is ProblemType.INVALID_REQUEST and exc.status_code != PROBLEMS[type_].status:
            log.warning("HTTP %d from the framework answered as 422: %s", exc.status_code, exc)
        return problem_response(type_, str(exc.detail))

    @app.exception_handler(Exception)
    async def _bug(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return problem_response(ProblemType.INTERNAL, "party B hit a bug; see its log")
