"""Party B's OpenAPI document tells the truth: bearer security, problem+json errors (never
FastAPI's HTTPValidationError), msgpack bodies described, date-times with a time zone.

What the server really answers is checked against this document by schemathesis on a live
server (tests/contract/test_openapi_fuzz.py); these tests pin the document's shape itself, and that
``created_at`` carries its time zone on every read, not only on the first 201.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api_schemas import PROBLEMS, ProblemType
from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.live import live_server
from tests.utils.small_runs import MSGPACK, TOKEN, aligned_run, labels_csv, run_spec

UNAUTHENTICATED = {"/healthz", "/readyz", "/metrics"}
MSGPACK_OPERATIONS = {
    ("post", "/v1/psi"): ("PsiRequest", "PsiReply"),
    ("post", "/v1/runs/{run_id}/steps"): ("StepRequest", "StepResponse"),
    ("post", "/v1/runs/{run_id}/evaluate"): ("EvaluateRequest", "EvaluateResponse"),
    ("post", "/v1/runs/{run_id}/predict"): ("PredictRequest", "PredictResponse"),
    ("post", "/v1/runs/{run_id}/alignment/keys"): ("AlignRequest", "AlignReply"),
    # a run's feature parties (docs/PROTOCOL.md section 12)
    ("post", "/v1/runs/{run_id}/parties/{party}/psi"): ("PsiRequest", "PsiReply"),
    ("post", "/v1/runs/{run_id}/parties/{party}/steps"): ("StepRequest", "StepResponse"),
    ("post", "/v1/runs/{run_id}/parties/{party}/evaluate"): ("EvaluateRequest", "EvaluateResponse"),
    ("post", "/v1/runs/{run_id}/parties/{party}/predict"): ("PredictRequest", "PredictResponse"),
}


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp: Path = tmp_path_factory.mktemp("openapi-doc")
    settings = Settings(data_dir=tmp / "b", labels=labels_csv(tmp / "l.csv"), tokens=f"t:{TOKEN}")
    doc: dict[str, Any] = create_app(settings).openapi()
    return doc


def _operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            yield method, path, operation


def test_every_route_but_health_and_metrics_needs_the_bearer_token(
    document: dict[str, Any],
) -> None:
    schemes = document["components"]["securitySchemes"]
    assert schemes == {"bearer": {"type": "http", "scheme": "bearer", "description": ANY_TEXT}}
    for method, path, operation in _operations(document):
        if path in UNAUTHENTICATED:
            assert "security" not in operation, path
            continue
        assert operation["security"] == [{"bearer": []}], (method, path)
        answer = operation["responses"]["401"]
        assert ProblemType.UNAUTHORIZED.value in answer["description"]
        assert "WWW-Authenticate" in answer["headers"]


def test_every_error_is_a_documented_problem(document: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in str(document)
    assert "Problem" in document["components"]["schemas"]
    titles: dict[int, set[str]] = {kind.status: set() for kind in PROBLEMS.values()}
    for type_, kind in PROBLEMS.items():
        titles[kind.status].add(type_.value)
    for method, path, operation in _operations(document):
        for status, answer in operation["responses"].items():
            if int(status) < 400:
                continue
            content = answer["content"]
            assert list(content) == ["application/problem+json"], (method, path, status)
            assert content["application/problem+json"]["schema"] == {
                "$ref": "#/components/schemas/Problem"
            }
            named = {t for t in titles[int(status)] if f"`{t}`" in answer["description"]}
            assert named, (method, path, status, answer["description"])


def test_msgpack_bodies_are_described(document: dict[str, Any]) -> None:
    binary = {"type": "string", "format": "binary"}
    for (method, path), (request, reply) in MSGPACK_OPERATIONS.items():
        operation = document["paths"][path][method]
        body = operation["requestBody"]
        assert body["content"] == {"application/msgpack": {"schema": binary}}
        assert request in body["description"] and "docs/PROTOCOL.md" in body["description"]
        ok = operation["responses"]["200"]
        assert ok["content"] == {"application/msgpack": {"schema": binary}}, path
        assert reply in ok["description"]
    json_routes = {(m, p) for m, p, _ in _operations(document)} - set(MSGPACK_OPERATIONS)
    for method, path in json_routes:
        for answer in document["paths"][path][method]["responses"].values():
            assert "application/msgpack" not in answer.get("content", {}), (method, path)


def test_date_times_say_they_carry_a_time_zone(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for name in ("RunOut", "StepLogOut", "EvalResultOut"):
        moment = schemas[name]["properties"]["created_at"]
        assert moment["type"] == "string" and moment["format"] == "date-time", name
        assert "time zone" in moment["description"]


def test_created_at_carries_its_time_zone_on_every_read(tmp_path: Path) -> None:
    """The first 201, the idempotent replay, GET, the list, the step log, the evaluations."""
    settings = Settings(
        data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "l.csv"), tokens=f"t:{TOKEN}"
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=auth, timeout=60) as c,
    ):
        key = {"Idempotency-Key": "once"}
        first = c.post("/v1/runs", json=run_spec(), headers=key)
        replay = c.post("/v1/runs", json=run_spec(), headers=key)
        assert first.status_code == 201 and replay.status_code == 201, replay.text
        run = aligned_run(c, name="trained")
        assert c.post(f"/v1/runs/{run.id}/steps", content=run.step_body(1), headers=MSGPACK)
        evaluated = c.post(
            f"/v1/runs/{run.id}/evaluate", content=run.evaluate_body(), headers=MSGPACK
        )
        assert evaluated.status_code == 200, evaluated.text
        moments = [
            first.json()["created_at"],
            replay.json()["created_at"],
            c.get(f"/v1/runs/{first.json()['id']}").json()["created_at"],
            *[r["created_at"] for r in c.get("/v1/runs").json()["runs"]],
            *[s["created_at"] for s in c.get(f"/v1/runs/{run.id}/steps").json()["steps"]],
            *[e["created_at"] for e in c.get(f"/v1/runs/{run.id}/evaluations").json()],
        ]
    assert len(moments) == 7
    assert replay.json()["created_at"] == first.json()["created_at"]
    for moment in moments:
        assert moment.endswith("Z") or moment[-6] in "+-", moment


class _AnyText:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY_TEXT: Any = _AnyText()
