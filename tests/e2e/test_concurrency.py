"""Load without cross-talk: twenty runs training at once on one party B, each ending exactly
as it does when run alone (same eval metrics, same bottom and top checksums).

Party B is a real ``fedlite-b serve`` process; the twenty party A sessions are threads of this
process over HTTP, started together behind a barrier. The runs differ in seed and in quantizer
(FedLite pq with two codebook sizes, SplitFed raw), so a mix-up between runs would show.
"""

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from party_a.trainer import PartyATrainer
from shared.training import state_sha256
from tests.utils.data import breast_pair
from tests.utils.party_a import breast_config, make_trainer
from tests.utils.servers import ALICE, REPO_ROOT, PartyBProcess, breast_party_b

RUNS = 20
STEPS = 20


@pytest.fixture
def party_b(tmp_path: Path) -> Iterator[PartyBProcess]:
    # privacy off: runs together must end as the same runs alone, byte for byte; label DP
    # (the default) randomizes each run's labels with a secret of its own
    with breast_party_b(tmp_path / "party_b", extra_args=["--privacy", "off"]) as server:
        yield server


def _overrides(i: int) -> dict[str, Any]:
    quantizer: dict[str, Any] = [
        {"quantizer.mode": "pq", "quantizer.L": 4},
        {"quantizer.mode": "pq", "quantizer.L": 2},
        {"quantizer.mode": "raw"},
    ][i % 3]
    return {"run.steps": STEPS, "run.seed": 100 + i, "run.checkpoint_interval": 10, **quantizer}


def _train(party_b: PartyBProcess, tmp_path: Path, name: str, i: int) -> dict[str, Any]:
    """One whole session; returns what must not depend on other runs."""
    _guest, host = breast_pair()
    config = breast_config(name, **_overrides(i))
    trainer: PartyATrainer = make_trainer(tmp_path / f"a-{name}", party_b.url, ALICE, host, config)
    try:
        trainer.prepare()
        summary = trainer.train()
        answer = trainer.evaluate()
        headers = {"Authorization": f"Bearer {ALICE}"}
        remote = httpx.get(
            f"{party_b.url}/v1/runs/{trainer.run_id}", headers=headers, timeout=60
        ).json()
        return {
            "last_step": summary.last_step,
            "loss": answer.loss,
            "metrics": answer.metrics,
            "bottom": state_sha256(trainer.bottom.model.state_dict()),
            "top": remote["model_sha256"],
            "bytes_sent": summary.bytes_sent,
        }
    finally:
        trainer.close()


def test_twenty_runs_at_once_each_end_exactly_as_alone(
    party_b: PartyBProcess, tmp_path: Path
) -> None:
    alone = [_train(party_b, tmp_path, f"alone-{i}", i) for i in range(RUNS)]

    together: list[dict[str, Any] | BaseException | None] = [None] * RUNS
    barrier = threading.Barrier(RUNS)

    def session(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            together[i] = _train(party_b, tmp_path, f"together-{i}", i)
        except BaseException as exc:  # reported below
            together[i] = exc

    threads = [threading.Thread(target=session, args=(i,)) for i in range(RUNS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)

    for i in range(RUNS):
        assert isinstance(together[i], dict), f"run {i}: {together[i]!r}"
        assert together[i] == alone[i], f"run {i} differs when trained alongside the others"
        assert alone[i]["last_step"] == STEPS
    assert len({r["top"] for r in alone}) == RUNS  # the runs really are different


# Sixteen threads answer PSI requests on one PsiServer, as party B's worker threads do. Run in
# a child process: the failure this guards against is the process dying (SIGFPE or abort
# inside the PSI library), which would take pytest down with it.
_PSI_HAMMER = """
import threading
from shared.psi import PsiClient, PsiServer, new_server_key
ids = [f"id{i}" for i in range(500)]
server = PsiServer(ids, new_server_key())
clients = [PsiClient(ids[10 * i : 10 * i + 300]) for i in range(16)]
requests = [c.request() for c in clients]
found = {}
def work(i):
    for _ in range(5):
        response, _n = server.respond(requests[i], max_ids=1000)
        found[i] = clients[i].intersection(server.setup, response)
threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert sorted(len(v) for v in found.values()) == [300] * 16, found
"""


def test_concurrent_psi_requests_on_one_server_neither_crash_nor_mix_up() -> None:
    child = subprocess.run(
        [sys.executable, "-c", _PSI_HAMMER],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
