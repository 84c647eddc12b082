"""Who may do what: per-token isolation on every run route, constant-time token checks,
revocation from the CLI while party B runs, and TLS between the two CLIs."""

import hmac
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from party_b import auth
from party_b.api import create_app
from party_b.settings import Settings
from party_b.store import make_engine, make_session_factory
from shared.alignkeys import encode_align_request, request_for
from tests.utils.data import breast_pair
from tests.utils.live import live_server
from tests.utils.servers import ALICE, MALLORY, REPO_ROOT, PartyBProcess, breast_party_b
from tests.utils.small_runs import MSGPACK, OTHER, TOKEN, aligned_run, labels_csv, problem

# ------------------------------------------------------------------------ isolation


@pytest.fixture
def app_and_url(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"tester:{TOKEN},other:{OTHER}",
    )
    app = create_app(settings)
    with live_server(app) as url:
        yield app, url


def test_another_token_gets_404_on_every_run_route_and_changes_nothing(
    app_and_url: tuple[Any, str],
) -> None:
    app, url = app_and_url
    with (
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        ) as owner,
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {OTHER}"}, timeout=60
        ) as stranger,
    ):
        run = aligned_run(owner)
        assert owner.post(
            f"/v1/runs/{run.id}/steps", content=run.step_body(1), headers=MSGPACK
        ).is_success
        before = owner.get(f"/v1/runs/{run.id}").json()
        # valid requests for the owner's run, so a 404 can only come from the ownership check
        bodies: dict[str, dict[str, Any]] = {
            "steps": {"content": run.step_body(2), "headers": MSGPACK},
            "evaluate": {"content": run.evaluate_body(), "headers": MSGPACK},
            "predict": {"content": run.predict_body(), "headers": MSGPACK},
            "alignment": {"json": {"hashed_ids": [k.hex() for k in run.aligned]}},
            "keys": {
                "content": encode_align_request(request_for(run.aligned)[0]),
                "headers": MSGPACK,
            },
            "resume": {"json": {"from_step": 0}},
        }
        # every route of the app, from its OpenAPI document (FastAPI keeps included routers'
        # routes behind wrappers in app.routes)
        # (a run's feature parties' routes take party tokens only: tests/party_b/service/
        # test_parties.py::test_every_party_route_takes_its_own_party_token_only)
        routes = [
            (method.upper(), path)
            for path, operations in app.openapi()["paths"].items()
            if "{run_id}" in path and "/parties/" not in path
            for method in sorted(operations)
        ]
        assert len(routes) >= 9, routes  # every run route the app has, present and future

        for method, path in routes:
            kwargs = bodies.get(path.rsplit("/", 1)[-1], {})
            answer = stranger.request(method, path.format(run_id=run.id), **kwargs)
            problem(answer, 404, "not-found")

        assert run.id not in {r["id"] for r in stranger.get("/v1/runs").json()["runs"]}
        after = owner.get(f"/v1/runs/{run.id}").json()
        assert (after["step"], after["status"], after["model_sha256"]) == (
            before["step"],
            before["status"],
            before["model_sha256"],
        )
        for method, path in routes:  # the owner is let through on each (no 404, no 401)
            if method == "DELETE":
                continue  # last: it ends the run
            kwargs = bodies.get(path.rsplit("/", 1)[-1], {})
            answer = owner.request(method, path.format(run_id=run.id), **kwargs)
            assert answer.status_code not in (401, 404), (method, path, answer.text)
        assert owner.delete(f"/v1/runs/{run.id}").status_code == 204
        problem(owner.get(f"/v1/runs/{run.id}"), 404, "not-found")


def test_tokens_are_checked_with_a_constant_time_comparison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row is found by the SHA-256 of the token (an index lookup whose timing can only
    leak bits of a hash, which do not help to guess a 256-bit token); the final check is
    ``hmac.compare_digest``. This proves it is called, on the digests, for every request."""
    calls: list[tuple[str, str]] = []
    compare_digest = hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        calls.append((a, b))
        return compare_digest(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    sessions = make_session_factory(make_engine(f"sqlite:///{tmp_path / 'b.sqlite'}"))
    with sessions() as session:
        auth.register_token(session, "tester", TOKEN)
        assert auth.authenticate(session, TOKEN) is not None
        assert auth.authenticate(session, TOKEN + "x") is None
    assert calls == [(auth.hash_token(TOKEN), auth.hash_token(TOKEN))]


def test_a_revoked_token_stays_revoked_after_its_name_gets_a_new_one(tmp_path: Path) -> None:
    """Revoke a leaked token, issue a new one under the same name, restart (which registers
    the configured, leaked token again): the leaked one stays refused, the new one works."""
    leaked = "leaked-token-0123456789abcdef"
    sessions = make_session_factory(make_engine(f"sqlite:///{tmp_path / 'b.sqlite'}"))
    with sessions() as session:
        assert auth.register_token(session, "alice", leaked)
        assert auth.revoke_token(session, "alice")
        fresh = auth.issue_token(session, "alice")

        assert auth.register_token(session, "alice", leaked) is False  # the next start-up
        assert auth.authenticate(session, leaked) is None
        assert auth.authenticate(session, fresh) is not None
        # and the rotation can go on: revoke the fresh one too, issue a third
        assert auth.revoke_token(session, "alice")
        third = auth.issue_token(session, "alice")
        assert auth.register_token(session, "alice", fresh) is False
        assert [auth.authenticate(session, t) is not None for t in (leaked, fresh, third)] == [
            False,
            False,
            True,
        ]


# ------------------------------------------------------------------------ revocation


@pytest.fixture
def party_b(tmp_path: Path) -> Iterator[PartyBProcess]:
    with breast_party_b(tmp_path / "party_b", {"alice": ALICE, "mallory": MALLORY}) as server:
        yield server


def _cli_b(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "party_b.ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )


def _status(party_b: PartyBProcess, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{party_b.url}/v1/runs", headers=headers, timeout=60).status_code


def test_the_operator_revokes_and_issues_tokens_with_the_cli_while_party_b_runs(
    party_b: PartyBProcess,
) -> None:
    assert _status(party_b, MALLORY) == 200
    pid = party_b.proc.pid  # type: ignore[union-attr]

    revoked = _cli_b("token", "revoke", "--name", "mallory", "--data-dir", str(party_b.data_dir))
    issued = _cli_b("token", "issue", "--name", "carol", "--data-dir", str(party_b.data_dir))

    assert revoked.returncode == 0, revoked.stderr
    assert _status(party_b, MALLORY) == 401  # at once, no restart
    assert _status(party_b, ALICE) == 200
    assert issued.returncode == 0, issued.stderr
    assert _status(party_b, issued.stdout.strip()) == 200
    assert party_b.proc is not None and party_b.proc.pid == pid and party_b.proc.poll() is None
    listing = _cli_b("token", "list", "--data-dir", str(party_b.data_dir)).stdout
    assert "mallory\trevoked" in listing and "alice\tactive" in listing
    # a restart with the same configured tokens (--tokens alice:...,mallory:...) must not
    # bring the revoked one back
    party_b.stop()
    party_b.start()
    assert _status(party_b, MALLORY) == 401
    assert _status(party_b, ALICE) == 200


# ------------------------------------------------------------------------ TLS


@pytest.fixture
def tls_party_b(tmp_path: Path) -> Iterator[tuple[PartyBProcess, Path]]:
    """Party B over HTTPS with a certificate from a CA the test makes (trustme)."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_pem, cert_pem, key_pem = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(str(ca_pem))
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    cert.private_key_pem.write_to_path(str(key_pem))
    guest, _host = breast_pair()
    server = PartyBProcess(
        tmp_path / "party_b",
        guest,
        {"alice": ALICE},
        extra_args=["--ssl-certfile", str(cert_pem), "--ssl-keyfile", str(key_pem)],
    )
    server.start(verify=ssl.create_default_context(cafile=str(ca_pem)))
    yield server, ca_pem
    server.stop()


def _train_cli(server: str, tmp_path: Path, name: str, *extra: str) -> subprocess.CompletedProcess:
    _guest, host = breast_pair()
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "party_a.cli",
            "train",
            "--server",
            server,
            "--token",
            ALICE,
            "--features",
            str(host),
            "--config",
            str(REPO_ROOT / "examples" / "breast.toml"),
            "--name",
            name,
            "--steps",
            "20",
            "--state-dir",
            str(tmp_path / f"a-{name}"),
            "--summary-json",
            str(tmp_path / f"{name}.json"),
            "--retry-for",
            "120",
            *extra,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )


def test_the_two_clis_train_over_tls_and_party_a_without_the_ca_is_refused(
    tls_party_b: tuple[PartyBProcess, Path], tmp_path: Path
) -> None:
    party_b, ca_pem = tls_party_b
    assert party_b.url.startswith("https://")

    trusted = _train_cli(party_b.url, tmp_path, "over-tls", "--ca-bundle", str(ca_pem))
    # retried for longer than the subprocess may run: a certificate error that were retried
    # would end in TimeoutExpired, not exit 2 (no clock decides it, whatever the load)
    untrusted = _train_cli(party_b.url, tmp_path, "no-ca", "--retry-for", "600")

    assert trusted.returncode == 0, trusted.stderr
    summary = json.loads((tmp_path / "over-tls.json").read_text())
    assert summary["last_step"] == 20 and summary["eval_metrics"]["eval_auc"] > 0.5
    assert untrusted.returncode == 2  # a configuration error: retrying would not fix it
    assert "certificate was refused" in untrusted.stderr and "--ca-bundle" in untrusted.stderr
    headers = {"Authorization": f"Bearer {ALICE}"}
    trust = ssl.create_default_context(cafile=str(ca_pem))
    runs = httpx.get(f"{party_b.url}/v1/runs", headers=headers, verify=trust, timeout=60).json()
    assert [r["name"] for r in runs["runs"]] == ["over-tls"]  # "no-ca" never reached party B
    with pytest.raises(httpx.HTTPError):  # and plain HTTP to the TLS port gets nowhere
        httpx.get(f"http://127.0.0.1:{party_b.port}/healthz", timeout=10)
