"""Party B's HTTP contract: auth, problem+json errors, limits, content types, ops endpoints.

The real app on a real SQLite file behind uvicorn in a thread of the test process (fast to
start); test_two_party_http.py runs the same app as a separate ``fedlite-b serve`` process.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from party_b import auth
from party_b.api import create_app
from party_b.settings import Limits, Settings
from party_b.store import make_engine, make_session_factory
from shared import codec
from shared.alignment import hmac_ids
from tests.utils.live import live_server
from tests.utils.small_runs import (
    MSGPACK,
    OTHER,
    TOKEN,
    aligned_run,
    labels_csv,
    problem,
    run_spec,
)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"tester:{TOKEN},other:{OTHER}",
        limits=Limits(max_body_bytes=64 * 1024, max_runs_per_token=2),
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[httpx.Client]:
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as c,
    ):
        yield c


def _spec(**overrides: Any) -> dict[str, Any]:
    return run_spec(**{"steps": 5, **overrides})


# ------------------------------------------------------------------------ ops


def test_health_metrics_and_openapi(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    client.get("/v1/runs")
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert 'fedlite_b_requests_total{route="/v1/runs",status="200"}' in metrics.text
    spec = client.get("/openapi.json").json()
    assert "/v1/runs" in spec["paths"]
    step_body = spec["paths"]["/v1/runs/{run_id}/steps"]["post"]["requestBody"]
    assert "application/msgpack" in step_body["content"]


# ------------------------------------------------------------------------ auth


def test_missing_bad_and_revoked_tokens_get_401(client: httpx.Client, settings: Settings) -> None:
    problem(client.get("/v1/runs", headers={"Authorization": ""}), 401, "unauthorized")
    problem(client.get("/v1/runs", headers={"Authorization": "Basic abc"}), 401, "unauthorized")
    problem(
        client.get("/v1/runs", headers={"Authorization": "Bearer nope-nope-nope-nope"}),
        401,
        "unauthorized",
    )
    assert client.get("/v1/runs", headers={"Authorization": f"Bearer {OTHER}"}).status_code == 200
    # an operator revokes "other" in the database; the running app honours it at once
    sessions = make_session_factory(make_engine(settings.resolved_database_url()))
    with sessions() as session:
        assert auth.revoke_token(session, "other")
    problem(
        client.get("/v1/runs", headers={"Authorization": f"Bearer {OTHER}"}), 401, "unauthorized"
    )


def test_tokens_are_stored_only_as_hashes(client: httpx.Client, settings: Settings) -> None:
    database = Path(settings.resolved_database_url().removeprefix("sqlite:///"))
    raw = database.read_bytes() + Path(f"{database}-wal").read_bytes()
    assert TOKEN.encode() not in raw
    assert auth.hash_token(TOKEN).encode() in raw


# ------------------------------------------------------------------------ problems


def test_unknown_route_and_method_are_problems(client: httpx.Client) -> None:
    problem(client.get("/v2/nothing"), 404, "not-found")
    problem(client.delete("/v1/runs"), 405, "method-not-allowed")


def test_wrong_content_types_get_415(client: httpx.Client) -> None:
    body = problem(
        client.post("/v1/runs", content=b"{}", headers={"Content-Type": "text/plain"}),
        415,
        "unsupported-media-type",
    )
    assert "application/json" in str(body["detail"])
    problem(
        client.post(
            "/v1/runs/x/steps", content=b"{}", headers={"Content-Type": "application/json"}
        ),
        415,
        "unsupported-media-type",
    )


def test_bodies_over_the_limit_get_413_even_without_content_length(client: httpx.Client) -> None:
    big = b"\0" * (64 * 1024 + 1)
    problem(client.post("/v1/runs/x/steps", content=big, headers=MSGPACK), 413, "payload-too-large")

    def chunks() -> Iterator[bytes]:  # chunked transfer: no Content-Length to trust
        for _ in range(80):
            yield b"\0" * 1024

    problem(
        client.post("/v1/runs/x/steps", content=chunks(), headers=MSGPACK), 413, "payload-too-large"
    )


def test_invalid_json_config_gets_422_with_every_error(client: httpx.Client) -> None:
    body = problem(
        client.post("/v1/runs", json=_spec(batch_size=0, seed=-1)), 422, "invalid-request"
    )
    locations = {tuple(e["loc"]) for e in body["errors"]}
    assert ("body", "batch_size") in locations and ("body", "seed") in locations
    problem(
        client.post("/v1/runs", content=b"{not json", headers={"Content-Type": "application/json"}),
        422,
        "invalid-request",
    )
    bad_top = problem(
        client.post("/v1/runs", json=_spec(top={"hidden": [0]})), 422, "invalid-request"
    )
    assert "top model" in str(bad_top["detail"])
    over = problem(client.post("/v1/runs", json=_spec(batch_size=10**6)), 422, "limit-exceeded")
    assert "limit" in str(over["detail"])


def test_run_quota_per_token_gets_429(client: httpx.Client) -> None:
    assert client.post("/v1/runs", json=_spec()).status_code == 201
    assert client.post("/v1/runs", json=_spec()).status_code == 201
    problem(client.post("/v1/runs", json=_spec()), 429, "too-many-runs")


# ------------------------------------------------------------------------ training endpoints


def test_a_rejected_step_changes_nothing(client: httpx.Client) -> None:
    run = aligned_run(client, steps=5)
    url = f"/v1/runs/{run.id}/steps"

    problem(client.post(url, content=b"\xc1garbage", headers=MSGPACK), 400, "malformed-message")
    problem(
        client.post(url, content=run.step_body(1, digest=b"12345678"), headers=MSGPACK),
        409,
        "batch-mismatch",
    )
    problem(client.post(url, content=run.step_body(2), headers=MSGPACK), 409, "step-out-of-order")
    assert client.get(f"/v1/runs/{run.id}").json()["step"] == 0

    ok = client.post(url, content=run.step_body(1), headers=MSGPACK)
    assert ok.status_code == 200 and ok.headers["content-type"] == "application/msgpack"
    answer = codec.decode_step_response(ok.content)
    assert answer.step == 1 and answer.grad.shape == (8, 8)
    assert client.get(f"/v1/runs/{run.id}").json()["step"] == 1


def test_steps_before_alignment_and_after_finish_are_refused(client: httpx.Client) -> None:
    created = client.post("/v1/runs", json=_spec()).json()
    problem(
        client.post(f"/v1/runs/{created['id']}/steps", content=b"\x80", headers=MSGPACK),
        409,
        "run-state",
    )
    run = aligned_run(client, steps=5)
    assert client.post(f"/v1/runs/{run.id}/finish").json()["status"] == "finished"
    problem(
        client.post(f"/v1/runs/{run.id}/steps", content=run.step_body(1), headers=MSGPACK),
        409,
        "run-state",
    )


def test_alignment_keeps_only_common_ids_and_is_idempotent(client: httpx.Client) -> None:
    run = client.post("/v1/runs", json=_spec()).json()
    ids = [f"u{i:03d}" for i in range(0, 64, 2)] + ["stranger"]
    hashed = [k.hex() for k in hmac_ids(bytes.fromhex(run["alignment_key"]), ids)]
    url = f"/v1/runs/{run['id']}/alignment"

    first = client.post(url, json={"hashed_ids": hashed})
    again = client.post(url, json={"hashed_ids": hashed})

    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert len(first.json()["intersection"]) == 32
    assert first.json()["train"] + first.json()["eval"] == 32
    problem(client.post(url, json={"hashed_ids": hashed[:20]}), 409, "run-state")
    bad = client.post("/v1/runs", json=_spec()).json()
    problem(
        client.post(f"/v1/runs/{bad['id']}/alignment", json={"hashed_ids": ["zz"]}),
        422,
        "invalid-request",
    )


def test_too_small_an_alignment_names_the_rule_it_breaks(client: httpx.Client) -> None:
    """At least 2 ids in common, and batch_size training samples: each refusal says which."""
    one = client.post("/v1/runs", json=_spec(batch_size=1)).json()
    key = bytes.fromhex(one["alignment_key"])
    body = problem(
        client.post(
            f"/v1/runs/{one['id']}/alignment",
            json={"hashed_ids": [hmac_ids(key, ["u000"])[0].hex()]},
        ),
        422,
        "invalid-request",
    )
    assert body["detail"] == "1 id(s) in common; a run needs at least 2 aligned ids"
    big = client.post("/v1/runs", json=_spec(batch_size=30)).json()
    ids = [f"u{i:03d}" for i in range(32)]  # 0.25 of 32 for eval: 24 train < 30
    hashed = [k.hex() for k in hmac_ids(bytes.fromhex(big["alignment_key"]), ids)]
    body = problem(
        client.post(f"/v1/runs/{big['id']}/alignment", json={"hashed_ids": hashed}),
        422,
        "invalid-request",
    )
    assert "leave 24 training samples" in body["detail"] and "batch_size=30" in body["detail"]


def test_resume_to_a_missing_checkpoint_lists_the_kept_ones(client: httpx.Client) -> None:
    run = aligned_run(client, steps=5)
    body = problem(
        client.post(f"/v1/runs/{run.id}/resume", json={"from_step": 4}),
        409,
        "checkpoint-not-found",
    )
    assert body["checkpoints"] == [0]


def test_create_app_needs_a_label_table(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="label table"):
        create_app(Settings(data_dir=tmp_path, tokens=f"t:{TOKEN}"))
