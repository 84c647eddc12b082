"""The replicated setup for real: Debian's HAProxy with docker/haproxy/haproxy.cfg (mutual TLS
with the client, mutual TLS to the replicas) in front of two ``fedlite-b serve`` replicas on
one PostgreSQL database, with real certificates (``party_b.ops.certs``: openssl).

* Run affinity: every step of a run reaches one replica, and the runs spread over both.
* Handing over on a drain: SIGTERM to one replica; HAProxy marks it down from its failing
  ``/readyz`` while it answers 503 and checkpoints its runs, and the next step of each of its
  runs reaches the other replica, which loads the run from that checkpoint (off the runs'
  checkpoint interval) and applies the step: the step log of every run is 1, 2, 3, each once.
* Routing that cannot split a run: a run id spelled with percent-escapes reaches the replica
  that holds the run (HAProxy hashes the id as party B decodes it), which refuses the
  spelling (422, naming the canonical path); a dozen reads of the run move its lease nowhere.
* Identity end to end: a token bound to a client certificate, scoped and expiring, trains
  through the balancer; the audit trail names the certificate's subject, as the balancer
  verified it; the same token with another certificate is refused, and a subject header the
  client writes itself is dropped by the balancer.

The failover benchmark (kill -9 at random moments, leases) is another issue's; here the load
balancer's configuration and party B's drain and identity are shown to work together."""

import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from party_b.ops.certs import HOP_SUBJECT, StackCertificates, stack_certificates
from tests.utils.cli import DEMO_CONFIG, demo_tables, run_cli
from tests.utils.databases import fresh_database
from tests.utils.deploy_tools import require_tool
from tests.utils.servers import PartyBProcess, free_port
from tests.utils.small_runs import MSGPACK, TOKEN, SmallRun, aligned_run, labels_csv

ROOT = Path(__file__).resolve().parents[2]
RUNS = 16  # all on one replica by chance: 2 in 2^16
STEP = re.compile(r"POST /v1/runs/([0-9a-f]{32})/steps")
SUBJECT = "CN=party-a,O=FedLite demo"  # party_b.ops.certs: the demo party's certificate


@dataclass
class Balanced:
    """Two TLS replicas on one PostgreSQL behind HAProxy (docker/haproxy/haproxy.cfg)."""

    url: str
    database_url: str
    first: PartyBProcess
    second: PartyBProcess
    certificates: StackCertificates
    replica_tls: ssl.SSLContext

    def client_tls(self, party: str = "party-a") -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.certificates.ca))
        tls = self.certificates
        context.load_cert_chain(tls.path(f"{party}.crt"), tls.path(f"{party}.key"))
        return context

    def client(self, token: str = TOKEN, party: str = "party-a") -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            verify=self.client_tls(party),
            timeout=60,
        )


def _steps_served(replica: PartyBProcess) -> set[str]:
    return set(STEP.findall(replica.log()))


def _send(client: httpx.Client, path: str, body: bytes, deadline: float) -> httpx.Response:
    """Party A's way: resend on a 503 or a refused connection until the deadline."""
    while True:
        try:
            response = client.post(path, content=body, headers=MSGPACK)
            if response.status_code != 503:
                return response
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{path}: no answer but 503s and errors"
        time.sleep(0.2)


def _until_both_replicas_answer(balanced: Balanced, lb: subprocess.Popen[bytes]) -> None:
    """Requests without a run id go round robin: once each replica's log has one, both are
    up at the balancer (polled, 60 s at most)."""
    deadline = time.monotonic() + 60
    with balanced.client() as client:
        while not all("GET /v1/psi" in r.log() for r in (balanced.first, balanced.second)):
            assert time.monotonic() < deadline and lb.poll() is None, "HAProxy did not start"
            try:
                client.get("/v1/psi")
            except httpx.TransportError:
                time.sleep(0.2)


@pytest.fixture
def balanced(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Balanced]:
    """The stack on the small label table (``tests.utils.small_runs``), or with the param
    ``"demo"`` on the bundled demo's, whose feature half is ``tmp_path / "features.csv"``."""
    haproxy = require_tool("haproxy", "apt-get install -y haproxy (.ci/run does it)")
    tls = stack_certificates(tmp_path / "tls", parties=("party-a", "party-x"))
    replica_tls = ssl.create_default_context(cafile=str(tls.hop_ca))
    replica_tls.load_cert_chain(tls.path("replica.crt"), tls.path("replica.key"))
    if getattr(request, "param", "small") == "demo":
        _features, labels = demo_tables(tmp_path)
    else:
        labels = labels_csv(tmp_path / "labels.csv")
    with fresh_database("postgresql", tmp_path) as url:
        made = [
            PartyBProcess(
                tmp_path / f"b{i}",
                labels,
                {"tester": TOKEN},
                extra_args=[
                    "--database-url",
                    url,
                    "--log-level",
                    "info",
                    "--access-log",
                    "all",
                    "--replica-id",
                    f"b{i}",
                    "--ssl-certfile",
                    str(tls.path("replica.crt")),
                    "--ssl-keyfile",
                    str(tls.path("replica.key")),
                    "--ssl-ca-certs",
                    str(tls.hop_ca),
                    "--trusted-proxy-subject",
                    HOP_SUBJECT,
                ],  # fmt: skip
                env={"FEDLITE_B_DRAIN_SECONDS": "4"},
            )
            for i in (1, 2)
        ]
        port = free_port()
        env = {
            **os.environ,
            "FEDLITE_LB_BIND": f"127.0.0.1:{port}",
            "FEDLITE_LB_CERT": str(tls.pem("lb")),
            "FEDLITE_LB_CLIENT_CA": str(tls.ca),
            "FEDLITE_LB_HOP_CA": str(tls.hop_ca),
            "FEDLITE_LB_HOP_CERT": str(tls.pem("lb-hop")),
            "FEDLITE_B1": f"127.0.0.1:{made[0].port}",
            "FEDLITE_B2": f"127.0.0.1:{made[1].port}",
        }
        lb: subprocess.Popen[bytes] | None = None
        try:
            for replica in made:  # one after the other: the first creates the tables
                replica.start(verify=replica_tls)
            with (tmp_path / "haproxy.log").open("wb") as log:
                lb = subprocess.Popen(
                    [haproxy, "-f", str(ROOT / "docker" / "haproxy" / "haproxy.cfg")],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            balanced = Balanced(
                f"https://127.0.0.1:{port}", url, made[0], made[1], tls, replica_tls
            )
            _until_both_replicas_answer(balanced, lb)
            yield balanced
        finally:
            if lb is not None:
                lb.terminate()
                lb.wait(timeout=10)
            for replica in made:
                replica.stop()


def _lease(database_url: str, run_id: str) -> tuple[str, int]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                text("SELECT holder, token FROM run_leases WHERE run_id = :id"), {"id": run_id}
            ).one()
    finally:
        engine.dispose()
    return str(row.holder), int(row.token)


@pytest.mark.timeout(300)
def test_haproxy_keeps_each_run_on_one_replica_and_hands_it_over_on_a_drain(
    balanced: Balanced,
) -> None:
    first, second = balanced.first, balanced.second
    with balanced.client() as client:
        # a large checkpoint interval: only the drain's checkpoint is at step 2
        runs: list[SmallRun] = [
            aligned_run(client, name=f"r{i}", checkpoint_interval=100) for i in range(RUNS)
        ]
        for step in (1, 2):
            for run in runs:
                answer = client.post(
                    f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK
                )
                assert answer.status_code == 200, answer.text
        on_first, on_second = _steps_served(first), _steps_served(second)

        assert first.proc is not None
        first.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 120
        readyz = f"{first.url}/readyz"
        while httpx.get(readyz, verify=balanced.replica_tls).status_code != 503:  # draining
            assert time.monotonic() < deadline
            time.sleep(0.02)
        third = {
            run.id: _send(client, f"/v1/runs/{run.id}/steps", run.step_body(3), deadline)
            for run in runs
        }
        assert first.proc.wait(timeout=60) == 0
        logs = {
            run.id: [r["step"] for r in client.get(f"/v1/runs/{run.id}/steps").json()["steps"]]
            for run in runs
        }

    ids = {run.id for run in runs}
    # affinity: each run's steps on one replica, and both replicas used
    assert on_first | on_second == ids and not on_first & on_second
    assert on_first and on_second
    # the drained replica's runs went on at the other one, from the drain's checkpoint
    assert all(answer.status_code == 200 for answer in third.values()), {
        k: v.text for k, v in third.items() if v.status_code != 200
    }
    assert _steps_served(second) == ids
    for run_id in on_first:
        assert f"run {run_id} checkpointed at step 2 on the way down" in first.log()
    assert all(steps == [1, 2, 3] for steps in logs.values()), logs


def _raw_get(balanced: Balanced, path: str) -> tuple[int, dict[str, object]]:
    """GET ``path`` byte for byte (http.client resolves nothing) through the balancer."""
    port = int(balanced.url.rsplit(":", 1)[1])
    connection = http.client.HTTPSConnection(
        "127.0.0.1", port, context=balanced.client_tls(), timeout=60
    )
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        connection.close()


@pytest.mark.timeout(300)
def test_a_percent_encoded_run_id_reaches_the_replica_holding_the_run_and_reads_move_nothing(
    balanced: Balanced,
) -> None:
    # Prepare: runs trained to step 2 on the replicas the balancer chose
    with balanced.client() as client:
        runs = [aligned_run(client, name=f"s{i}") for i in range(4)]
        for run in runs:
            for step in (1, 2):
                assert client.post(
                    f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK
                ).is_success
    holders = {run.id: _lease(balanced.database_url, run.id) for run in runs}
    replica = {"b1": balanced.first, "b2": balanced.second}

    # Execute: each run read 12 times, in its one spelling and in needless percent-escapes
    answers: dict[str, list[tuple[int, dict[str, object]]]] = {}
    for run in runs:
        spellings = [f"/v1/runs/{run.id}"] * 6 + [
            f"/v1/runs/{run.id[:i]}%{ord(run.id[i]):02X}{run.id[i + 1 :]}" for i in range(6)
        ]
        answers[run.id] = [_raw_get(balanced, path) for path in spellings]

    # Assert: the canonical reads answered, every other spelling refused with the canonical
    # path, by the replica that holds the run (its access log); no lease moved
    for run in runs:
        assert [status for status, _ in answers[run.id]] == [200] * 6 + [422] * 6
        assert all(
            body["canonical_path"] == f"/v1/runs/{run.id}" for _, body in answers[run.id][6:]
        )
        name = holders[run.id][0]
        holder, other = replica[name], replica["b2" if name == "b1" else "b1"]
        refused = f'"GET /v1/runs/{run.id} HTTP/1.1" 422'  # uvicorn logs the decoded path
        assert holder.log().count(refused) == 6 and refused not in other.log()
        assert _lease(balanced.database_url, run.id) == holders[run.id]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("balanced", ["demo"], indirect=True)
def test_a_certificate_bound_token_trains_through_the_balancer_and_the_audit_names_it(
    balanced: Balanced, tmp_path: Path
) -> None:
    # Prepare: a scoped, expiring token bound to the demo party's certificate
    url = balanced.database_url
    issued = run_cli(
        "b", "token", "issue", "--name", "bank-a", "--database-url", url, "--scope", "train",
        "--expires", "1d", "--subject", SUBJECT,
    )  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.strip()
    tls = balanced.certificates
    features = tmp_path / "features.csv"  # the demo's feature half (the fixture's)
    connection = [
        "--server", balanced.url, "--token", token, "--ca-bundle", str(tls.ca),
        "--features", str(features), "--state-dir", str(tmp_path / "a"),
    ]  # fmt: skip

    # Execute: train with the certificate; the same token with another party's certificate
    trained = run_cli(
        "a", "train", *connection, "--config", str(DEMO_CONFIG), "--steps", "4",
        "--client-cert", str(tls.path("party-a.crt")), "--client-key", str(tls.path("party-a.key")),
        timeout=600,
    )  # fmt: skip
    wrong = run_cli(
        "a", "check", "--server", balanced.url, "--token", token, "--ca-bundle", str(tls.ca),
        "--client-cert", str(tls.path("party-x.crt")), "--client-key", str(tls.path("party-x.key")),
    )  # fmt: skip
    with balanced.client(token, party="party-x") as client:  # a subject header of its own
        spoofed = client.get("/v1/runs", headers={"X-Fedlite-Client-Subject": SUBJECT})
    audit = run_cli("b", "audit", "--database-url", url, "--jsonl")
    # a pod's own probe (Kubernetes' readiness): its certificate, the replica's /readyz
    probe_env = {
        "FEDLITE_B_SSL_CERTFILE": str(tls.path("replica.crt")),
        "FEDLITE_B_SSL_KEYFILE": str(tls.path("replica.key")),
        "FEDLITE_B_SSL_CA_CERTS": str(tls.hop_ca),
    }
    ready = run_cli(
        "b", "health", "--ready", "--port", str(balanced.first.port), env=probe_env
    )  # fmt: skip

    # Assert
    assert trained.returncode == 0, trained.stderr
    assert ready.returncode == 0 and "/readyz: ok" in ready.stdout, ready.stderr
    assert wrong.returncode == 2 and "certificate" in wrong.stderr, wrong.stderr
    assert spoofed.status_code == 401 and spoofed.json()["reason"] == "certificate"
    rows = [json.loads(line) for line in audit.stdout.splitlines() if line.strip()]
    mine = [r for r in rows if r["actor"] == "bank-a"]
    assert {r["action"] for r in mine} >= {"create-run", "psi", "align", "evaluate", "finish"}
    assert {r["subject"] for r in mine} == {SUBJECT}
