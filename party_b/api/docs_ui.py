"""``/docs``: Swagger UI from files party B serves itself, so it works in a closed network.

FastAPI's own ``/docs`` (and ``/redoc``) load their scripts from a CDN: an institution running
party B without internet access saw a blank page. The Swagger UI files come from the
``fastapi-swagger`` package (MIT; a current Swagger UI 5 build, which reads OpenAPI 3.1),
installed from PyPI like any other dependency; nothing of that package runs but its files.
"""

from functools import cache
from importlib.resources import files

from fastapi import FastAPI, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from api_schemas import ProblemType
from party_b.errors import ProblemError

__all__ = ["ASSETS", "install_docs"]

DOCS = "/docs"
# name under /docs/assets/ -> (file of the package, media type)
ASSETS = {
    "swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript"),
    "swagger-ui.css": ("swagger-ui.css", "text/css"),
    "favicon.png": ("favicon-32x32.png", "image/png"),
}
_PACKAGE = "fastapi_swagger.resources"
_CACHE = "public, max-age=86400"  # the files change only with the package's version


def install_docs(app: FastAPI) -> None:
    """``/docs`` and its assets; the app must be built with ``docs_url=None``."""

    @app.get(DOCS, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - API",
            swagger_js_url=f"{root}{DOCS}/assets/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS}/assets/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS}/assets/favicon.png",
            swagger_ui_parameters={"persistAuthorization": True, "displayRequestDuration": True},
        )

    @app.get(DOCS + "/assets/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise ProblemError(ProblemType.NOT_FOUND, f"no docs asset {name!r}")
        _filename, media_type = ASSETS[name]
        return Response(_read(name), media_type=media_type, headers={"Cache-Control": _CACHE})


@cache
def _read(name: str) -> bytes:
    return files(_PACKAGE).joinpath(ASSETS[name][0]).read_bytes()
