"""The HTTP-path benchmark's servers (``benchmarks.floor.http_path``): every layer answers a
body with itself, and the layers with party B's authentication refuse a wrong token as
party B does, so that what the benchmark times is the real path."""

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from benchmarks.floor import http_path


def _post(app: Any, headers: dict[str, str]) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://b") as client:
            return await client.post(http_path.PATH, content=http_path.BODY, headers=headers)

    return anyio.run(call)


@pytest.mark.parametrize("layer", http_path.LAYERS)
def test_every_layer_answers_the_body_with_itself(layer: str, tmp_path: Path) -> None:
    app = http_path.build_app(layer, tmp_path / "party_b.sqlite")

    response = _post(app, http_path.HEADERS)

    assert response.status_code == 200
    assert response.content == http_path.BODY


@pytest.mark.parametrize("layer", ["auth", "thread"])
def test_the_authenticated_layers_refuse_an_unknown_token(layer: str, tmp_path: Path) -> None:
    app = http_path.build_app(layer, tmp_path / "party_b.sqlite")

    response = _post(
        app, {"authorization": "Bearer not-a-token", "content-type": "application/msgpack"}
    )

    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")


def test_a_layer_is_served_by_uvicorn_with_the_loop_and_parser_named(tmp_path: Path) -> None:
    """The benchmark's own server process, over real HTTP (uvloop and httptools)."""
    with http_path.server("thread", "uvloop", "httptools", tmp_path) as url:
        with httpx.Client(timeout=30) as client:
            times = http_path.block(client, url, 5)  # raises unless each answer is the body

    assert len(times) == 5
