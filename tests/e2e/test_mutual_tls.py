"""Mutual TLS between two institutions, with real certificates over real TLS.

A CA made by the test (trustme) signs party B's server certificate and two client
certificates (bank A's and a scoring partner's); another CA signs a certificate party B must
refuse. ``fedlite-b serve --ssl-ca-certs`` runs as a process; the tokens are issued with
``fedlite-b token issue`` while it serves:

* a connection without a client certificate, or with one of another CA, never reaches HTTP,
  and ``fedlite-a`` says which of the two it is (exit 2, no retries);
* a token bound to bank A's certificate (``--subject``) is refused with another certificate;
* the scoring partner's certificate alone is its credential (``--certificate-only``), with
  the predict scope on bank A's runs: it scores, and cannot train;
* ``fedlite-a train`` / ``predict`` and ``party_a.api.connect`` present the certificate;
* ``fedlite-b health`` checks the server with its own certificate.
"""

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme
from cryptography import x509

from party_a.api import connect
from tests.utils.cli import DEMO_CONFIG, REPO_ROOT, demo_tables
from tests.utils.servers import ALICE, PartyBProcess


def _subject(pem: Path) -> str:
    """The certificate's subject as RFC 4514 text, by the cryptography library (an oracle
    apart from party B's own reading of it), e.g. ``CN=bank-a,OU=Testing cert #x,O=Bank A``."""
    return x509.load_pem_x509_certificate(pem.read_bytes()).subject.rfc4514_string()


@dataclass
class World:
    party_b: PartyBProcess
    ca: Path  # the CA party A trusts for party B, and party B for clients
    bank_a: Path  # bank A's client certificate with its key (PEM)
    scorer: Path
    foreign: Path  # a client certificate of another CA
    server_cert: Path
    server_key: Path
    features: Path
    bank_a_token: str
    subjects: dict[str, str]  # bank_a, scorer: RFC 4514


def _cli(party: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FEDLITE_A_", "FEDLITE_B_"))}
    return subprocess.run(
        [sys.executable, "-m", f"party_{party}.cli" if party == "a" else "party_b.ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        env={**clean, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("mtls")
    ca, foreign_ca = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(root / "server.pem"))
    server.private_key_pem.write_to_path(str(root / "server.key"))
    certs = {
        "bank_a": ca.issue_cert(
            "bank-a@example.org", common_name="bank-a", organization_name="Bank A"
        ),
        "scorer": ca.issue_cert(
            "scorer@example.org", common_name="scorer", organization_name="Scoring Partner"
        ),
        "foreign": foreign_ca.issue_cert("bank-a@example.org", common_name="bank-a"),
    }
    for name, cert in certs.items():
        cert.private_key_and_cert_chain_pem.write_to_path(str(root / f"{name}.pem"))
    features, labels = demo_tables(root)
    party_b = PartyBProcess(
        root / "party_b",
        labels,
        {"alice": ALICE},
        extra_args=[
            "--ssl-certfile", str(root / "server.pem"), "--ssl-keyfile", str(root / "server.key"),
            "--ssl-ca-certs", str(root / "ca.pem"),
        ],
    )  # fmt: skip
    trust = ssl.create_default_context(cafile=str(root / "ca.pem"))
    trust.load_cert_chain(str(root / "bank_a.pem"))
    party_b.start(verify=trust)
    try:
        data = ["--data-dir", str(party_b.data_dir)]
        subjects = {n: _subject(root / f"{n}.pem") for n in ("bank_a", "scorer")}
        # bank A's token and certificate go together; the operator's spelling of the subject
        # (lower-case attribute names, spaces after commas) is normalized
        typed = ", ".join(
            f"{k.lower()}={v}" for k, v in (p.split("=", 1) for p in subjects["bank_a"].split(","))
        )
        bound = _cli("b", "token", "issue", "--name", "bank-a", "--subject", typed, *data)
        assert bound.returncode == 0, bound.stderr
        scorer = _cli(
            "b", "token", "issue", "--name", "scorer", "--subject", subjects["scorer"],
            "--certificate-only", "--scope", "predict", "--runs-of", "bank-a", *data,
        )  # fmt: skip
        assert scorer.returncode == 0, scorer.stderr
        assert "authenticates with the client certificate" in scorer.stdout
        yield World(
            party_b,
            root / "ca.pem",
            root / "bank_a.pem",
            root / "scorer.pem",
            root / "foreign.pem",
            root / "server.pem",
            root / "server.key",
            features,
            bound.stdout.strip(),
            subjects,
        )
    finally:
        party_b.stop()


def _client(world: World, cert: Path | None, token: str | None = None) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(world.ca))
    if cert is not None:
        context.load_cert_chain(str(cert))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=world.party_b.url, verify=context, headers=headers, timeout=60)


def test_only_certificates_of_party_bs_ca_reach_http(world: World) -> None:
    for cert in (None, world.foreign):
        with _client(world, cert, ALICE) as client, pytest.raises(httpx.TransportError):
            client.get("/healthz")
    with _client(world, world.bank_a, ALICE) as client:
        assert client.get("/v1/runs").status_code == 200  # a token not bound to a subject


def test_a_token_bound_to_a_subject_needs_that_certificate(world: World) -> None:
    with _client(world, world.bank_a, world.bank_a_token) as client:
        assert client.get("/v1/runs").status_code == 200
    with _client(world, world.scorer, world.bank_a_token) as client:
        refused = client.get("/v1/runs")
    assert refused.status_code == 401, refused.text
    body = refused.json()
    assert body["reason"] == "certificate"
    bank_a, scorer = world.subjects["bank_a"], world.subjects["scorer"]
    assert f"bound to the client certificate {bank_a!r}, not to {scorer!r}" in body["detail"]
    with _client(world, world.bank_a) as client:  # bank A's certificate is not enough alone
        assert client.get("/v1/runs").json()["reason"] == "certificate"


def test_fedlite_a_names_a_missing_or_refused_client_certificate(world: World) -> None:
    common = ["check", "--server", world.party_b.url, "--token", world.bank_a_token,
              "--ca-bundle", str(world.ca), "--retry-for", "30"]  # fmt: skip
    missing = _cli("a", *common)
    foreign = _cli("a", *common, "--client-cert", str(world.foreign))
    good = _cli("a", *common, env={"FEDLITE_A_CLIENT_CERT": str(world.bank_a)})

    assert missing.returncode == 2, missing.stderr
    assert "requires mutual TLS" in missing.stderr and "--client-cert" in missing.stderr
    assert "retrying" not in missing.stderr  # told at once, not after --retry-for
    assert foreign.returncode == 2, foreign.stderr
    assert f"refuses the client certificate {world.foreign}" in foreign.stderr
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["ok"] is True


def test_train_with_a_bound_token_then_score_with_a_certificate_alone(
    world: World, tmp_path: Path
) -> None:
    state = ["--state-dir", str(tmp_path / "a"), "--features", str(world.features),
             "--server", world.party_b.url, "--ca-bundle", str(world.ca)]  # fmt: skip
    trained = _cli(
        "a", "train", *state, "--config", str(DEMO_CONFIG), "--name", "mtls", "--steps", "6",
        "--token", world.bank_a_token, "--client-cert", str(world.bank_a),
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr

    scored = _cli("a", "predict", *state, "--name", "mtls", "--ids", "s0001,s0002",
                  "--client-cert", str(world.scorer))  # fmt: skip
    retrain = _cli("a", "train", *state, "--config", str(DEMO_CONFIG), "--name", "other",
                   "--client-cert", str(world.scorer))  # fmt: skip

    assert scored.returncode == 0, scored.stderr
    lines = scored.stdout.strip().splitlines()
    assert len(lines) == 3 and lines[1].startswith("s0001,")
    assert retrain.returncode == 2, retrain.stderr  # a predict-only credential cannot train
    assert "scope predict" in retrain.stderr and "needs scope train" in retrain.stderr

    # the audit trail names the certificate behind each call
    trail = _cli("b", "audit", "--jsonl", "--data-dir", str(world.party_b.data_dir))
    events = [json.loads(line) for line in trail.stdout.splitlines()]
    scoring = [e for e in events if e["action"] == "predict" and e["outcome"] == "ok"]
    assert [(e["actor"], e["subject"], e["ids"]) for e in scoring] == [
        ("scorer", world.subjects["scorer"], 2)
    ]
    aligned = [e for e in events if e["action"] == "align"]
    assert aligned and aligned[0]["subject"] == world.subjects["bank_a"]
    assert {"psi", "create-run", "evaluate", "finish"} <= {e["action"] for e in events}
    refused = [e for e in events if e["outcome"] == "refused"]
    assert [(e["actor"], e["action"]) for e in refused] == [("scorer", "create-run")]


def test_the_python_api_presents_the_certificate(world: World, tmp_path: Path) -> None:
    with connect(
        world.party_b.url,
        world.bank_a_token,
        features=world.features,
        config=DEMO_CONFIG,
        overrides={"run.name": "api-mtls", "run.steps": 4},
        state_dir=tmp_path / "a",
        ca_bundle=world.ca,
        client_cert=world.bank_a,
    ) as run:
        summary = run.train()
        run.finish()
    assert summary.last_step == 4


def test_fedlite_b_health_presents_the_servers_own_certificate(world: World) -> None:
    env = {
        "FEDLITE_B_SSL_CERTFILE": str(world.server_cert),
        "FEDLITE_B_SSL_KEYFILE": str(world.server_key),
        "FEDLITE_B_SSL_CA_CERTS": str(world.ca),
    }
    healthy = _cli("b", "health", "--port", str(world.party_b.port), env=env)
    without = _cli(
        "b", "health", "--port", str(world.party_b.port),
        env={"FEDLITE_B_SSL_CERTFILE": str(world.server_cert)},
    )  # fmt: skip

    assert healthy.returncode == 0, healthy.stderr
    assert without.returncode == 1 and "ok" not in without.stdout
