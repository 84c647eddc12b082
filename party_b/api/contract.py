"""What each route consumes and which problems it answers, declared on the route itself.

A route's request body is either a JSON model (FastAPI reads it), a msgpack message
(``consumes(MSGPACK)``: the route reads the raw bytes) or nothing. ``ContractRoute`` enforces
that declaration before anything else runs for the request (415 ``unsupported-media-type``),
so a new msgpack route needs no edit anywhere else; the same declaration is what the OpenAPI
document shows. ``contract(...)`` also lists the problem types a route can answer, which
become its documented error responses.
"""

from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from api_schemas.problems import (
    MSGPACK_CONTENT_TYPE,
    PROBLEM_CONTENT_TYPE,
    PROBLEMS,
    ProblemType,
)
from party_b.api.problems import problem_response

__all__ = [
    "AUTHENTICATED",
    "JSON",
    "MSGPACK",
    "OF_A_RUN",
    "PROBLEM_SCHEMA",
    "WITH_BODY",
    "ContractRoute",
    "MsgpackResponse",
    "contract",
]

JSON = "application/json"
MSGPACK = MSGPACK_CONTENT_TYPE
_ALSO_ACCEPTED = {MSGPACK: {"application/x-msgpack"}}  # a common older name
_BODY_METHODS = {"POST", "PUT", "PATCH"}

# Problems every authenticated route can answer (401; 403 for a token outside its scope,
# party_b.access; 503 while party B drains: party_b.api.lifecycle), and every route with a body.
AUTHENTICATED = (ProblemType.UNAUTHORIZED, ProblemType.FORBIDDEN, ProblemType.UNAVAILABLE)
WITH_BODY = (ProblemType.PAYLOAD_TOO_LARGE, ProblemType.UNSUPPORTED_MEDIA_TYPE)
# ... and every route of a run: 404 for a run the caller cannot see, 422 for a path not
# written canonically (party_b.api.paths)
OF_A_RUN = (*AUTHENTICATED, ProblemType.NOT_FOUND, ProblemType.INVALID_REQUEST)


PROBLEM_SCHEMA = {"$ref": "#/components/schemas/Problem"}  # party_b.api.openapi adds it
_BINARY = {"type": "string", "format": "binary"}
_SPEC = "docs/PROTOCOL.md"


class MsgpackResponse(Response):
    """A msgpack body; the route's OpenAPI entry then shows this media type, not JSON's."""

    media_type = MSGPACK


def contract(
    *,
    consumes: str | None = None,
    problems: Iterable[ProblemType] = (),
    message: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Route-decorator kwargs declaring a msgpack body (``consumes=MSGPACK``; JSON bodies are
    declared by the endpoint's model) and the problems the route answers, by status.

    ``message``: with ``consumes=MSGPACK``, the names of the request and reply messages in
    docs/PROTOCOL.md (e.g. ``("StepRequest", "StepResponse")``); the route answers msgpack.
    """
    extra: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    responses: dict[int | str, dict[str, Any]] = {}
    if consumes is not None:
        body: dict[str, Any] = {"required": True, "content": {consumes: {"schema": _BINARY}}}
        if message is not None:
            body["description"] = f"a msgpack `{message[0]}`, byte for byte as in {_SPEC}"
        extra["requestBody"] = body
    if consumes == MSGPACK:
        kwargs["response_class"] = MsgpackResponse
        reply = f"a msgpack `{message[1]}` ({_SPEC})" if message else "a msgpack message"
        responses[200] = {"description": reply, "content": {MSGPACK: {"schema": _BINARY}}}
    by_status: dict[int, list[ProblemType]] = {}
    for type_ in dict.fromkeys(problems):
        by_status.setdefault(PROBLEMS[type_].status, []).append(type_)
    for status, types in sorted(by_status.items()):
        responses[status] = {
            "description": "; ".join(f"`{t.value}`: {PROBLEMS[t].title}" for t in types),
            "content": {PROBLEM_CONTENT_TYPE: {"schema": PROBLEM_SCHEMA}},
        }
        if status == 401:
            responses[status]["headers"] = {
                "WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}
            }
        if status == 503:
            responses[status]["headers"] = {
                "Retry-After": {"description": "seconds", "schema": {"type": "integer"}}
            }
    return {"openapi_extra": extra or None, "responses": responses, **kwargs}


class ContractRoute(APIRoute):
    """An APIRoute that refuses a request body of another media type than it declares."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        # called from APIRoute.__init__, once body_field and openapi_extra are set
        handler = super().get_route_handler()
        consumes, path = _consumed(self), self.path_format

        async def checked(request: Request) -> Response:
            if consumes is not None and request.method in _BODY_METHODS:
                media = request.headers.get("content-type", "").split(";")[0].strip().lower()
                if not _accepts(consumes, media):
                    return problem_response(
                        ProblemType.UNSUPPORTED_MEDIA_TYPE,
                        f"{path} takes {consumes}, got {media or 'no Content-Type'}",
                    )
            return await handler(request)

        return checked


def _consumed(route: APIRoute) -> str | None:
    """The media type of the route's request body: its JSON model's, or its declared one."""
    if route.body_field is not None:
        return JSON
    declared = (route.openapi_extra or {}).get("requestBody", {}).get("content", {})
    return next(iter(declared), None)


def _accepts(consumes: str, media: str) -> bool:
    if consumes == JSON:
        return media == JSON or media.endswith("+json")
    return media == consumes or media in _ALSO_ACCEPTED.get(consumes, set())
