"""The OpenAPI document party B serves (``/openapi.json``), made to say what the server does.

FastAPI's generated document describes every 422 as its own ``HTTPValidationError``, although
party B answers every error as RFC 9457 problem+json (``party_b.api.problems``), and lists a
422 even on routes that cannot fail validation. Here those are dropped; each route's real
problems come from its ``contract(...)`` declaration and share one ``Problem`` schema. The
msgpack bodies are described there too (binary, pointing to docs/PROTOCOL.md), and the bearer
scheme comes from the ``Authorization`` dependency (``party_b.api.deps``).
"""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api_schemas import Problem

__all__ = ["install_openapi", "truthful"]

_FASTAPI_ERRORS = ("HTTPValidationError", "ValidationError")

DESCRIPTION = (
    "Party B of FedLite-VFL: the label holder's top-model service. The JSON bodies are "
    "described here; the training bodies (`application/msgpack`) and every derived value "
    "(aligned keys, split, batch schedule, digests) are specified byte for byte in "
    "docs/PROTOCOL.md, whose section 10 is the HTTP binding of every route. Every error is "
    "`application/problem+json` with a stable `type` URN. Every route but `/healthz` and "
    "`/metrics` needs `Authorization: Bearer <token>`."
)


def install_openapi(app: FastAPI) -> None:
    """Serve ``truthful(...)`` of the app's generated document, built once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = truthful(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    summary=app.summary,
                    description=DESCRIPTION,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


def truthful(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` without FastAPI's validation-error responses, with the Problem schema."""
    for item in document.get("paths", {}).values():
        for operation in item.values():
            responses: dict[str, Any] = operation.get("responses", {})
            for status in [s for s, r in responses.items() if _is_fastapi_error(r)]:
                del responses[status]  # a declared 422 is problem+json and was not replaced
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in _FASTAPI_ERRORS:
        schemas.pop(name, None)
    schemas["Problem"] = Problem.model_json_schema()
    return document


def _is_fastapi_error(response: dict[str, Any]) -> bool:
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    return bool(schema.get("$ref", "").endswith("/HTTPValidationError"))
