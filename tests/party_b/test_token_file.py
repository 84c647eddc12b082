"""Tokens with grants from a file (``FEDLITE_B_TOKENS_FILE``, ``party_b.token_file``): what a
Kubernetes Secret or a compose secret holds. Against a real party B over HTTP: each token
works within its scope, an expired one is refused, one bound to a certificate needs it; the
file is the source of truth at every start (an edit applies, a revoked token stays revoked);
a mistake stops ``fedlite-b serve`` with one line naming the entry."""

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from party_b import auth
from party_b.api import create_app
from party_b.settings import Settings
from party_b.token_file import read_token_file
from tests.utils.cli import run_cli
from tests.utils.live import live_server
from tests.utils.small_runs import labels_csv, run_spec

TRAINER = "trainer-token-from-a-secret-0001"
SCORER = "scorer-token-from-a-secret-0001"
OLD = "expired-token-from-a-secret-0001"
BOUND = "bound-token-from-a-secret-00001"


def _file(path: Path, *, scorer_scope: str = "predict") -> Path:
    yesterday = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    path.write_text(
        f"""
[[token]]
name = "trainer"
token = "{TRAINER}"
scope = "train"
expires = 2999-01-31

[[token]]
name = "scorer"
token = "{SCORER}"
scope = "{scorer_scope}"
runs_of = "trainer"

[[token]]
name = "old"
token = "{OLD}"
expires = "{yesterday}"

[[token]]
name = "bound"
token = "{BOUND}"
subject = "cn=bank-a, o=Bank A"
"""
    )
    return path


def _get(url: str, token: str, path: str = "/v1/runs") -> httpx.Response:
    return httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=60)


def test_each_token_of_the_file_works_within_its_grant(tmp_path: Path) -> None:
    # Prepare
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens_file=_file(tmp_path / "tokens.toml"),
    )
    with live_server(create_app(settings)) as url:
        headers = {"Authorization": f"Bearer {TRAINER}"}

        # Execute
        created = httpx.post(f"{url}/v1/runs", json=run_spec(), headers=headers, timeout=60)
        scorer_sees = _get(url, SCORER)
        scorer_creates = httpx.post(
            f"{url}/v1/runs", json=run_spec(name="x"), timeout=60,
            headers={"Authorization": f"Bearer {SCORER}"},
        )  # fmt: skip
        expired = _get(url, OLD)
        unbound = _get(url, BOUND)  # no client certificate on this connection

    # Assert
    assert created.status_code == 201, created.text
    assert [r["id"] for r in scorer_sees.json()["runs"]] == [created.json()["id"]]
    assert scorer_creates.status_code == 403 and scorer_creates.json()["needs"] == ["train"]
    assert expired.status_code == 401 and expired.json()["reason"] == "expired"
    assert unbound.status_code == 401 and unbound.json()["reason"] == "certificate"
    assert "CN=bank-a,O=Bank A" in unbound.json()["detail"]


def test_the_file_is_the_source_of_truth_at_every_start(tmp_path: Path) -> None:
    labels = labels_csv(tmp_path / "labels.csv")
    tokens = _file(tmp_path / "tokens.toml")
    settings = Settings(data_dir=tmp_path / "b", labels=labels, tokens_file=tokens)
    with live_server(create_app(settings)):
        pass
    revoked = run_cli(
        "b", "token", "revoke", "--name", "trainer", "--data-dir", str(tmp_path / "b")
    )
    assert revoked.returncode == 0, revoked.stderr
    _file(tokens, scorer_scope="read")  # the operator edits the secret

    with live_server(create_app(settings)) as url:
        assert _get(url, TRAINER).status_code == 401  # revoked stays revoked
        scorer = httpx.post(
            f"{url}/v1/psi", content=b"x", timeout=60,
            headers={"Authorization": f"Bearer {SCORER}", "Content-Type": "application/msgpack"},
        )  # fmt: skip
        assert scorer.status_code == 403 and scorer.json()["scope"] == ["read"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[[token]]\nname = "a"\ntoken = "short"\n', "at least 16 characters"),
        ('[[token]]\nname = "a"\ntoken = "0123456789abcdefg"\nexpires = "30d"\n', "duration"),
        ('[[token]]\nname = "a"\ntoken = "0123456789abcdefg"\nscope = "everything"\n', "scope"),
        ('[[token]]\nname = "a"\ntoken = "0123456789abcdefg"\nsubject = "O=x,CN=a"\n', "CN=a,O=x"),
        ('[[token]]\nname = "a"\ntoken = "0123456789abcdefg"\ncolour = "red"\n', "colour"),
        ("[token]\n", "[[token]]"),
    ],
)
def test_a_mistake_is_one_line_naming_the_entry(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text)

    with pytest.raises(ValueError, match=re.escape(named)):
        read_token_file(path)
    ran = run_cli(
        "b", "serve", "--data-dir", str(tmp_path / "b"), "--labels",
        str(labels_csv(tmp_path / "labels.csv")), "--tokens-file", str(path),
    )  # fmt: skip
    assert ran.returncode == 2
    assert str(path) in ran.stderr and len(ran.stderr.strip().splitlines()) == 1, ran.stderr


def test_tokens_are_stored_hashed_only(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens_file=_file(tmp_path / "tokens.toml"),
    )
    with live_server(create_app(settings)):
        pass
    stored = (tmp_path / "b" / "party_b.sqlite").read_bytes()
    assert TRAINER.encode() not in stored and auth.hash_token(TRAINER).encode() in stored
