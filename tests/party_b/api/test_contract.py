"""Routes declare what they consume and which problems they answer; the app enforces and
documents exactly that (``party_b.api.contract``)."""

from pathlib import Path

import anyio
import httpx
from fastapi import APIRouter, FastAPI, Request, Response
from pydantic import BaseModel

from api_schemas import PROBLEM_CONTENT_TYPE, ProblemType
from party_b.api import create_app
from party_b.api.contract import MSGPACK, ContractRoute, contract
from party_b.api.problems import install_problem_handlers
from party_b.settings import Settings
from tests.utils.small_runs import TOKEN, labels_csv


class Echo(BaseModel):
    n: int


def _app() -> FastAPI:
    """A new app with one new msgpack route and one JSON route, declared and nothing else."""
    router = APIRouter(route_class=ContractRoute)

    @router.post("/anything/{x}/bytes", **contract(consumes=MSGPACK))
    async def raw(request: Request) -> Response:
        return Response(await request.body(), media_type=MSGPACK)

    @router.post("/anything/json", **contract(problems=(ProblemType.INVALID_REQUEST,)))
    async def echo(body: Echo) -> Echo:
        return body

    app = FastAPI()
    app.include_router(router)
    install_problem_handlers(app)
    return app


def _post(app: FastAPI, path: str, body: bytes, media: str) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://b") as client:
            return await client.post(path, content=body, headers={"Content-Type": media})

    return anyio.run(call)


def test_a_new_route_gets_its_media_type_checked_from_its_declaration_alone() -> None:
    app = _app()
    assert _post(app, "/anything/1/bytes", b"\x80", MSGPACK).content == b"\x80"
    assert _post(app, "/anything/1/bytes", b"\x80", "application/x-msgpack").status_code == 200
    refused = _post(app, "/anything/1/bytes", b"{}", "application/json")
    assert refused.status_code == 415
    assert refused.headers["content-type"] == PROBLEM_CONTENT_TYPE
    assert "/anything/{x}/bytes takes application/msgpack" in refused.json()["detail"]
    assert _post(app, "/anything/json", b'{"n": 1}', "application/json").json() == {"n": 1}
    assert _post(app, "/anything/json", b'{"n": 1}', "application/ld+json").status_code == 200
    assert _post(app, "/anything/json", b'{"n": 1}', MSGPACK).status_code == 415


def test_the_openapi_document_shows_what_each_route_consumes_and_answers(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "labels.csv"), tokens=f"t:{TOKEN}"
    )
    paths = create_app(settings).openapi()["paths"]
    step = paths["/v1/runs/{run_id}/steps"]["post"]
    assert list(step["requestBody"]["content"]) == [MSGPACK]
    assert {"400", "401", "404", "409", "413", "415", "422"} <= set(step["responses"])
    assert PROBLEM_CONTENT_TYPE in step["responses"]["409"]["content"]
    assert "step-out-of-order" in step["responses"]["409"]["description"]
    create = paths["/v1/runs"]["post"]
    assert list(create["requestBody"]["content"]) == ["application/json"]
    assert "too-many-runs" in create["responses"]["429"]["description"]
