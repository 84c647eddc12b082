"""Tokens with scope and expiry, issued with ``fedlite-b token issue`` and checked over HTTP.

* a predict-only token scores the training token's runs (``--runs-of``) and can neither create
  runs, align, step, evaluate nor delete, nor read a run's step log or evaluations (PSI and
  scores only, as DEPLOY.md says): 403 ``forbidden`` naming its scope and the one needed,
  before the run is looked up (an unknown run id gets the same 403);
* a read-only token only reads;
* an expired token is 401 with ``reason: "expired"``; ``token list`` shows scope and expiry;
* a database from before grants existed keeps its tokens working with every scope.
"""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from party_b.api import create_app
from party_b.settings import Settings
from party_b.store import make_engine
from tests.utils.cli import run_cli
from tests.utils.live import live_server
from tests.utils.small_runs import MSGPACK, TOKEN, SmallRun, aligned_run, labels_csv, problem


@pytest.fixture
def party_b(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(URL, data dir) of a party B with the training token ``t`` (TOKEN)."""
    data_dir = tmp_path / "b"
    settings = Settings(
        data_dir=data_dir, labels=labels_csv(tmp_path / "l.csv"), tokens=f"t:{TOKEN}"
    )
    with live_server(create_app(settings)) as url:
        yield url, data_dir


def _issue(data_dir: Path, name: str, *flags: str) -> str:
    ran = run_cli("b", "token", "issue", "--name", name, "--data-dir", str(data_dir), *flags)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def _expire_now(data_dir: Path, name: str) -> None:
    """Move the token's expiry to a second ago, in party B's database."""
    engine = make_engine(f"sqlite:///{data_dir / 'party_b.sqlite'}")
    past = (datetime.now(UTC) - timedelta(seconds=1)).replace(tzinfo=None)
    with engine.begin() as db:
        db.execute(
            text(
                "UPDATE token_grants SET expires_at = :past WHERE token_id = "
                "(SELECT id FROM api_tokens WHERE name = :name)"
            ),
            {"past": past, "name": name},
        )
    engine.dispose()


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _msgpack(body: bytes) -> dict[str, Any]:
    return {"content": body, "headers": MSGPACK}


def _calls(run: SmallRun) -> dict[str, tuple[str, str, dict[str, Any]]]:
    return {
        "create": ("POST", "/v1/runs", {"json": {"name": "x", "model": "tabular_mlp"}}),
        "align": ("POST", f"/v1/runs/{run.id}/alignment", {"json": {"hashed_ids": ["00" * 32]}}),
        "step": ("POST", f"/v1/runs/{run.id}/steps", _msgpack(run.step_body(2))),
        "resume": ("POST", f"/v1/runs/{run.id}/resume", {"json": {"from_step": 0}}),
        "evaluate": (
            "POST",
            f"/v1/runs/{run.id}/evaluate",
            {"content": run.evaluate_body(), "headers": MSGPACK},
        ),
        "finish": ("POST", f"/v1/runs/{run.id}/finish", {}),
        "delete": ("DELETE", f"/v1/runs/{run.id}", {}),
        "predict": ("POST", f"/v1/runs/{run.id}/predict", _msgpack(run.predict_body())),
        "psi": ("POST", "/v1/psi", {"content": b"\x80", "headers": MSGPACK}),
        "read": ("GET", f"/v1/runs/{run.id}", {}),
        "list": ("GET", "/v1/runs", {}),
        "log": ("GET", f"/v1/runs/{run.id}/steps", {}),
        "evaluations": ("GET", f"/v1/runs/{run.id}/evaluations", {}),
        "psi-info": ("GET", "/v1/psi", {}),
    }  # fmt: skip


def test_a_predict_only_token_scores_the_trainers_runs_and_can_do_nothing_else(
    party_b: tuple[str, Path],
) -> None:
    url, data_dir = party_b
    scorer = _issue(data_dir, "scorer", "--scope", "predict", "--runs-of", "t")
    with _client(url, TOKEN) as trainer, _client(url, scorer) as client:
        run = aligned_run(trainer)
        assert trainer.post(
            f"/v1/runs/{run.id}/steps", content=run.step_body(1), headers=MSGPACK
        ).is_success
        before = trainer.get(f"/v1/runs/{run.id}").json()
        calls = _calls(run)

        for name in ("create", "align", "step", "resume", "evaluate", "finish", "delete"):
            method, path, kwargs = calls[name]
            body = problem(client.request(method, path, **kwargs), 403, "forbidden")
            assert body["reason"] == "scope" and body["scope"] == ["predict"], body
            assert body["needs"] == ["train"] and "'scorer' has scope predict" in body["detail"]
        for name in ("log", "evaluations"):  # label-derived metrics: not a scorer's
            method, path, kwargs = calls[name]
            body = problem(client.request(method, path, **kwargs), 403, "forbidden")
            assert body["needs"] == ["read", "train"], body
        # the scope is checked before the run: an id that names no run is the same 403
        problem(
            client.post("/v1/runs/nosuchrun/steps", content=b"", headers=MSGPACK), 403, "forbidden"
        )

        scored = client.post(calls["predict"][1], content=run.predict_body(), headers=MSGPACK)
        assert scored.status_code == 200, scored.text
        assert [r["id"] for r in client.get("/v1/runs").json()["runs"]] == [run.id]
        assert client.get(f"/v1/runs/{run.id}").is_success
        problem(client.post(*calls["psi"][1:2], **calls["psi"][2]), 400, "malformed-message")
        assert trainer.get(f"/v1/runs/{run.id}").json() == before  # nothing changed


def test_a_read_only_token_reads_and_is_refused_the_rest(party_b: tuple[str, Path]) -> None:
    url, data_dir = party_b
    reader = _issue(data_dir, "auditor", "--scope", "read", "--runs-of", "t")
    with _client(url, TOKEN) as trainer, _client(url, reader) as client:
        run = aligned_run(trainer)
        for name, (method, path, kwargs) in _calls(run).items():
            answer = client.request(method, path, **kwargs)
            if name in ("read", "list", "log", "evaluations", "psi-info"):
                assert answer.status_code == 200, (name, answer.text)
            else:
                assert problem(answer, 403, "forbidden")["needs"], name


def test_an_expired_token_is_refused_with_the_reason_and_listed_as_expired(
    party_b: tuple[str, Path],
) -> None:
    url, data_dir = party_b
    brief = _issue(data_dir, "brief", "--expires", "1h")
    lasting = _issue(data_dir, "lasting", "--scope", "train,predict", "--expires", "30d")
    with _client(url, brief) as client:
        assert client.get("/v1/runs").status_code == 200
        _expire_now(data_dir, "brief")  # the hour has passed (no test waits for a clock)
        body = problem(client.get("/v1/runs"), 401, "unauthorized")
    assert body["reason"] == "expired" and "'brief' expired at" in body["detail"]
    assert body["expired_at"].endswith("Z")
    with _client(url, lasting) as client:
        assert client.get("/v1/runs").status_code == 200

    listing = run_cli("b", "token", "list", "--data-dir", str(data_dir)).stdout.splitlines()
    rows = {line.split("\t")[0]: line.split("\t") for line in listing}
    assert rows["brief"][1].startswith("expired ")
    assert rows["lasting"][1:3] == ["active", "scope predict,train"]
    assert rows["lasting"][3].startswith("expires 20") and rows["lasting"][3].endswith("Z")
    assert rows["t"][1:] == ["active", "scope all", "expires never"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--scope", "score"), "unknown scope 'score'; choose from train, predict, read, all"),
        (("--expires", "soon"), "give a duration (30d, 12h, 90m, 2w) or a UTC date"),
        (("--expires", "2001-01-01"), "is not in the future"),
        (("--runs-of", "nobody"), "--runs-of 'nobody': no token of that name"),
        (("--certificate-only",), "--certificate-only needs --subject"),
        (("--subject", "bank-a"), "expected NAME=value pairs"),
    ],
)
def test_token_issue_refuses_a_bad_scope_expiry_or_owner_in_one_line(
    tmp_path: Path, flags: tuple[str, ...], message: str
) -> None:
    data_dir = tmp_path / "b"
    _issue(data_dir, "first")
    ran = run_cli("b", "token", "issue", "--name", "x", "--data-dir", str(data_dir), *flags)

    assert ran.returncode in (1, 2) and ran.stdout == ""
    assert message in ran.stderr and len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    names = run_cli("b", "token", "list", "--data-dir", str(data_dir)).stdout
    assert "x\t" not in names  # nothing half-issued


def test_tokens_of_a_database_from_before_grants_keep_every_scope(tmp_path: Path) -> None:
    # a database as an older party B left it: tokens, and no token_grants table
    data_dir = tmp_path / "b"
    labels = labels_csv(tmp_path / "l.csv")
    create_app(Settings(data_dir=data_dir, labels=labels, tokens=f"t:{TOKEN}"))
    engine = make_engine(f"sqlite:///{data_dir / 'party_b.sqlite'}")
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE token_grants"))
    engine.dispose()

    with (
        live_server(create_app(Settings(data_dir=data_dir, labels=labels))) as url,
        _client(url, TOKEN) as client,
    ):
        run = aligned_run(client)  # create + align: the train scope
        assert client.post(
            f"/v1/runs/{run.id}/predict", content=run.predict_body(), headers=MSGPACK
        ).is_success
