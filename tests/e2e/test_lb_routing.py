"""The replicated setup for real: Debian's HAProxy with docker/haproxy/haproxy.cfg (TLS for
the client) in front of two ``fedlite-b serve`` replicas on one PostgreSQL database.

* Run affinity: every step of a run reaches one replica, and the runs spread over both.
* Handing over on a drain: SIGTERM to one replica; HAProxy marks it down from its failing
  ``/readyz`` while it answers 503 and checkpoints its runs, and the next step of each of its
  runs reaches the other replica, which loads the run from that checkpoint (off the runs'
  checkpoint interval) and applies the step: the step log of every run is 1, 2, 3, each once.

The failover benchmark (kill -9 at random moments, leases) is another issue's; here the load
balancer's configuration and party B's drain are shown to work together."""

import os
import re
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from tests.utils.databases import fresh_database
from tests.utils.deploy_tools import require_tool
from tests.utils.servers import PartyBProcess, free_port
from tests.utils.small_runs import MSGPACK, TOKEN, SmallRun, aligned_run, labels_csv

ROOT = Path(__file__).resolve().parents[2]
RUNS = 16  # all on one replica by chance: 2 in 2^16
STEP = re.compile(r"POST /v1/runs/([0-9a-f]{32})/steps")


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


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[PartyBProcess, PartyBProcess]]:
    labels = labels_csv(tmp_path / "labels.csv")
    with fresh_database("postgresql", tmp_path) as url:
        made = [
            PartyBProcess(
                tmp_path / f"b{i}",
                labels,
                {"tester": TOKEN},
                extra_args=["--database-url", url, "--log-level", "info", "--access-log", "all"],
                env={"FEDLITE_B_DRAIN_SECONDS": "4"},
            )
            for i in (1, 2)
        ]
        try:
            for replica in made:  # one after the other: the first creates the tables
                replica.start()
            yield made[0], made[1]
        finally:
            for replica in made:
                replica.stop()


@pytest.mark.timeout(300)
def test_haproxy_keeps_each_run_on_one_replica_and_hands_it_over_on_a_drain(
    tmp_path: Path, replicas: tuple[PartyBProcess, PartyBProcess]
) -> None:
    haproxy = require_tool("haproxy", "apt-get install -y haproxy (.ci/run does it)")
    first, second = replicas
    ca = trustme.CA()
    pem = tmp_path / "lb.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    verify = ssl.create_default_context()
    ca.configure_trust(verify)
    port = free_port()
    env = {
        **os.environ,
        "FEDLITE_LB_BIND": f"127.0.0.1:{port}",
        "FEDLITE_LB_CERT": str(pem),
        "FEDLITE_B1": f"127.0.0.1:{first.port}",
        "FEDLITE_B2": f"127.0.0.1:{second.port}",
    }
    log = open(tmp_path / "haproxy.log", "wb")  # noqa: SIM115 - handed to the child process
    lb = subprocess.Popen(
        [haproxy, "-f", str(ROOT / "docker" / "haproxy" / "haproxy.cfg")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    log.close()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(
            base_url=f"https://127.0.0.1:{port}", headers=auth, verify=verify, timeout=60
        ) as client:
            deadline = time.monotonic() + 60
            while True:  # both replicas up: 2 good checks a second apart
                try:
                    if client.get("/v1/runs").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and lb.poll() is None, "HAProxy did not start"
                time.sleep(0.2)
            time.sleep(2.5)

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
            while httpx.get(f"{first.url}/readyz").status_code != 503:  # draining from now on
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
    finally:
        lb.terminate()
        lb.wait(timeout=10)

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
