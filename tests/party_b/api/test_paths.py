"""One spelling per path (``party_b.api.paths``): a path that percent-encodes a character
needing none, encodes a ``/``, or has an empty or dot segment is refused (422
``invalid-request`` naming the canonical path) before it is routed or authenticated, so it
never loads the run it names; a path encoded only where it must be is served as ever.

Requests go over real HTTP with ``http.client``, which sends a path byte for byte as given
(httpx and most clients resolve dot segments before sending).
"""

import http.client
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI

from party_b.api import create_app
from party_b.api.paths import canonical_path, non_canonical
from party_b.settings import Settings
from tests.utils.live import live_server
from tests.utils.small_runs import TOKEN, aligned_run, labels_csv


@pytest.fixture(scope="module")
def party_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FastAPI, str]]:
    tmp = tmp_path_factory.mktemp("paths")
    settings = Settings(
        data_dir=tmp / "b", labels=labels_csv(tmp / "labels.csv"), tokens=f"t:{TOKEN}"
    )
    app = create_app(settings)
    with live_server(app) as url:
        yield app, url


def _get(url: str, path: str, token: str | None = TOKEN) -> tuple[int, dict[str, object]]:
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        connection.close()


SPELLINGS: list[tuple[Callable[[str], str], str | None]] = [
    (lambda r: f"/v1/runs/{r}", None),
    (lambda r: f"/v1/runs/%{ord(r[0]):02X}{r[1:]}", "percent-encodes"),  # first character
    (lambda r: f"/v1/runs/{r[:-1]}%{ord(r[-1]):02x}", "percent-encodes"),  # lower case
    (lambda r: f"/v1//runs/{r}", "empty"),
    (lambda r: f"/v1/runs/./{r}", "'.'"),
    (lambda r: f"/v1/x/../runs/{r}", "'..'"),
    (lambda r: f"/v1/runs%2F{r}", "percent-encodes"),
]


@pytest.mark.parametrize(("spelling", "why"), SPELLINGS)
def test_a_run_is_named_in_one_spelling_only(
    party_b: tuple[FastAPI, str], spelling: Callable[[str], str], why: str | None
) -> None:
    # Prepare: a run trained to a checkpoint, then out of memory
    app, url = party_b
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        run = aligned_run(client)
    cache = app.state.service.context.cache
    cache.drop(run.id)
    path = spelling(run.id)

    # Execute
    status, body = _get(url, path)

    # Assert: the canonical spelling is served; any other is refused and loads nothing
    if why is None:
        assert status == 200, body
        return
    assert status == 422, body
    assert body["type"] == "urn:fedlite:problem:invalid-request"
    assert why in str(body["detail"])
    assert body["canonical_path"] == f"/v1/runs/{run.id}"
    assert cache.peek(run.id) is None


def test_the_path_is_checked_before_the_token(party_b: tuple[FastAPI, str]) -> None:
    _app, url = party_b

    status, body = _get(url, "/v1/runs/%61bc", token=None)

    assert status == 422 and body["canonical_path"] == "/v1/runs/abc"


def test_characters_that_must_be_encoded_stay_encoded(party_b: tuple[FastAPI, str]) -> None:
    _app, url = party_b

    status, body = _get(url, "/v1/runs/%C3%A9t%C3%A9%20x")  # 'été x': no such run

    assert status == 404, body
    assert non_canonical("/v1/runs/%C3%A9t%C3%A9%20x") is None


def test_the_canonical_path_decodes_needless_escapes_and_resolves_dot_segments() -> None:
    assert canonical_path("/v1/runs/%61b%2dc/./x/../steps") == "/v1/runs/ab-c/steps"
    assert canonical_path("/v1//psi/") == "/v1/psi/"
    assert non_canonical("/v1/runs/abc/") is None  # a trailing slash is a path of its own


def test_the_route_tables_say_every_run_route_may_answer_422(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "l.csv")))
    paths = app.openapi()["paths"]
    for path, operations in paths.items():
        if path.startswith("/v1/runs/{run_id}"):
            for operation in operations.values():
                assert "422" in operation["responses"], path
