"""The dashboard's routes: the page and its files (no secret in them), and the JSON it reads
(the operator credential required).

    GET /dashboard/                      the page (static/index.html)
    GET /dashboard/static/{file}         its script, style sheet and icon, from this package
    GET /dashboard/api/overview          runs of every token, and the server's health
    GET /dashboard/api/runs/{id}?points= one run: curves of at most ``points`` points

Every file is served from the installed package: nothing is fetched from another host, and
the Content-Security-Policy forbids the page to try (it works in a closed network). None of
these routes is in the OpenAPI document: that describes party A's API.
"""

from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Path, Query
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, RedirectResponse, Response

from party_b.dashboard.access import OperatorCredential
from party_b.dashboard.reports import MAX_POINTS, Reports
from party_b.errors import ProblemError

__all__ = ["STATIC_FILES", "dashboard_router"]

# file -> media type: the only files served (no path from the request reaches the disk)
STATIC_FILES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_DATA_HEADERS = {**_PAGE_HEADERS, "Cache-Control": "no-store"}


@dataclass(frozen=True)
class _Asset:
    body: bytes
    media_type: str


def _load_assets() -> dict[str, _Asset]:
    folder = files("party_b.dashboard").joinpath("static")
    return {
        name: _Asset(folder.joinpath(name).read_bytes(), media)
        for name, media in STATIC_FILES.items()
    }


def dashboard_router(reports: Reports, credential: OperatorCredential) -> APIRouter:
    """The dashboard's routes over ``reports``, the JSON behind ``credential``."""
    assets = _load_assets()
    # No request here has a body, so the API's ContractRoute has nothing to check; errors are
    # ProblemErrors, rendered as problem+json by the app's handlers like any other.
    router = APIRouter(include_in_schema=False)
    operator = [Depends(credential)]

    @router.get("/dashboard")
    async def to_the_page() -> Response:
        return RedirectResponse("/dashboard/", status_code=308)

    @router.get("/dashboard/")
    async def page() -> Response:
        return _asset(assets["index.html"])

    @router.get("/dashboard/static/{name}")
    async def static(name: str) -> Response:
        if name not in assets:
            raise ProblemError.not_found(f"the dashboard has no file {name!r}")
        return _asset(assets[name])

    @router.get("/dashboard/api/overview", dependencies=operator)
    async def overview() -> Response:
        return _json(await anyio.to_thread.run_sync(reports.overview))

    @router.get("/dashboard/api/runs/{run_id}", dependencies=operator)
    async def run(
        run_id: Annotated[str, Path(max_length=64)],
        points: Annotated[int, Query(ge=2, le=MAX_POINTS)] = 400,
    ) -> Response:
        return _json(await anyio.to_thread.run_sync(reports.run, run_id, points))

    return router


def _asset(asset: _Asset) -> Response:
    headers = {**_PAGE_HEADERS, "Cache-Control": "no-cache"}  # revalidate after an upgrade
    return Response(asset.body, media_type=asset.media_type, headers=headers)


def _json(data: Any) -> JSONResponse:
    encoded = jsonable_encoder(data, custom_encoder={datetime: _iso})
    return JSONResponse(encoded, headers=_DATA_HEADERS)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
