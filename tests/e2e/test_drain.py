"""SIGTERM to a real ``fedlite-b serve`` while party A trains: a drain that loses nothing.

While it drains, party B refuses new API requests with 503 ``unavailable`` and
``Retry-After``, says 503 on ``/readyz`` and 200 on ``/healthz``, and a request already in
flight still gets its answer. It then exits cleanly (code 0), having checkpointed the run at
the very step it had applied. Restarted on the same database it resumes there: party A, which
only saw 503s and refused connections and retried them, never rolls back, every step is
applied once, and the run ends bit-identical to an uninterrupted one (eval metrics, party A's
bottom model, party B's top model).
"""

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from party_a.trainer import PartyATrainer, TrainSummary
from party_a.transport.http import HttpTransport
from shared import codec
from shared.schedule import batch_digest
from shared.training import state_sha256
from tests.utils.crash import party_b_checkpoints
from tests.utils.data import breast_pair
from tests.utils.party_a import breast_config, make_trainer
from tests.utils.servers import ALICE, breast_party_b

STEPS = 200
CONFIG: dict[str, Any] = {
    "run.steps": STEPS,
    "run.checkpoint_interval": 10,
    "run.pipeline_depth": 2,  # a step in flight beside the one being answered
}
DRAIN_SECONDS = 10.0  # unready this long: the probes below have time under any load


def _trainer(tmp_path: Path, url: str, name: str) -> PartyATrainer:
    _guest, host = breast_pair()
    config = breast_config(name, **CONFIG)
    return make_trainer(tmp_path / f"a-{name}", url, ALICE, host, config, retry_for=180)


def _held_step_body(trainer: PartyATrainer, step: int) -> bytes:
    """A request for ``step`` of the trainer's run whose step 1 never comes, that passes every
    check but its order (its batch's digest, breast_config's batch of 32 rows, a 32-wide cut,
    PQ q = 8, L = 4): party B holds it for its turn (up to 5 s), then answers 409
    step-out-of-order. Its activations are never used."""
    rng = np.random.default_rng(step)
    chunk = codec.PQActivations(
        codebook=rng.standard_normal((1, 4, 4)).astype(np.float32),
        codewords=rng.integers(0, 4, (32, 8)),
    )
    assert trainer.data is not None
    digest = batch_digest([trainer.data.aligned[p] for p in trainer.batch(step).positions])
    request = codec.StepRequest(step=step, batch_digest=digest, chunks=(chunk,))
    return codec.encode_step_request(request)


def _held_steps(url: str) -> float:
    """Party B's count of steps it held for their turn (its /metrics, no token needed)."""
    text = httpx.get(f"{url}/metrics").text
    line = next(
        (x for x in text.splitlines() if x.startswith('fedlite_b_steps_total{outcome="held"}')),
        None,
    )
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


def _until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` (no fixed sleep decides a verdict) for at most 60 s."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


@pytest.mark.timeout(600)
def test_sigterm_drains_checkpoints_and_the_run_resumes_bit_identical(tmp_path: Path) -> None:
    auth = {"Authorization": f"Bearer {ALICE}"}
    # two runs compared to the bit: privacy off (label DP draws labels from each run's secret)
    env = {"FEDLITE_B_DRAIN_SECONDS": str(DRAIN_SECONDS), "FEDLITE_B_PRIVACY": "off"}
    with breast_party_b(tmp_path / "b", env=env) as b:
        reference = _trainer(tmp_path, b.url, "reference")
        reference.prepare()
        reference.train()
        expected = reference.evaluate()
        expected_top = httpx.get(f"{b.url}/v1/runs/{reference.run_id}", headers=auth).json()
        bystander = _trainer(tmp_path, b.url, "bystander")  # aligned, never trained
        bystander.prepare()

        trainer = _trainer(tmp_path, b.url, "drained")
        trainer.prepare()
        result: dict[str, Any] = {}

        def train() -> None:
            try:
                result["summary"] = trainer.train()
            except Exception as exc:  # reported by the assertions below
                result["error"] = exc

        training = threading.Thread(target=train, daemon=True)
        training.start()

        def reach(step: int) -> None:
            deadline = time.monotonic() + 300
            while trainer.step < step and training.is_alive() and time.monotonic() < deadline:
                time.sleep(0.005)
            assert training.is_alive() and trainer.step >= step, result

        # a request in flight when SIGTERM comes: held for its turn (5 s), then answered
        reach(20)
        in_flight: list[httpx.Response] = []
        held_before = _held_steps(b.url)  # pipelined steps may have been held already
        held = threading.Thread(
            target=lambda: in_flight.append(
                httpx.post(
                    f"{b.url}/v1/runs/{bystander.run_id}/steps",
                    content=_held_step_body(bystander, 2),
                    headers={**auth, "Content-Type": "application/msgpack"},
                )
            )
        )
        held.start()
        _until(lambda: _held_steps(b.url) > held_before, "party B holds the bystander's step")
        reach(23)
        assert held.is_alive()  # no answer yet: it is in flight
        assert b.proc is not None
        b.proc.send_signal(signal.SIGTERM)
        # the drain starts at the server's next tick (0.1 s)
        _until(lambda: httpx.get(f"{b.url}/readyz").status_code == 503, "party B drains")
        ready = httpx.get(f"{b.url}/readyz")
        live = httpx.get(f"{b.url}/healthz")
        refused = httpx.get(f"{b.url}/v1/runs", headers=auth)
        exit_code = b.proc.wait(timeout=120)
        held.join(timeout=30)
        drained_log = b.log()
        kept = party_b_checkpoints(b.database)[trainer.run_id]
        applied_at_stop = max(kept)

        b.start()  # the same database and port: party A's retries reach it
        training.join(timeout=300)
        assert "error" not in result, result.get("error")
        summary: TrainSummary = result["summary"]
        answer = trainer.evaluate()
        with HttpTransport(b.url, ALICE) as transport:
            log = [row["step"] for row in transport.step_log(trainer.run_id)]
        top = httpx.get(f"{b.url}/v1/runs/{trainer.run_id}", headers=auth).json()
        for t in (reference, bystander, trainer):
            t.close()

    # the drain, as a client saw it
    assert ready.status_code == 503 and ready.json()["type"].endswith(":unavailable")
    assert live.status_code == 200
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
    assert refused.headers["content-type"] == "application/problem+json"
    # answered, not cut off: its turn never came (409), as without a drain
    assert in_flight and in_flight[0].status_code == 409, in_flight
    assert in_flight[0].json()["type"].endswith(":step-out-of-order")
    assert exit_code == 0, drained_log[-3000:]
    # it checkpointed the run where it stopped (unless a periodic checkpoint was there)
    if applied_at_stop % CONFIG["run.checkpoint_interval"]:
        assert f"checkpointed at step {applied_at_stop} on the way down" in drained_log
    assert "drained in" in drained_log
    assert 23 <= applied_at_stop < STEPS
    assert f"resumes from checkpoint at step {applied_at_stop}" in b.log()
    # and the run went on from there: nothing lost, nothing twice, nothing rolled back
    assert summary.last_step == STEPS and summary.rollbacks == 0
    assert log == list(range(1, STEPS + 1))
    assert (answer.loss, answer.metrics) == (expected.loss, expected.metrics)
    assert state_sha256(trainer.bottom.model.state_dict()) == state_sha256(
        reference.bottom.model.state_dict()
    )
    assert top["model_sha256"] == expected_top["model_sha256"]
