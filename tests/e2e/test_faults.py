"""Crashes and a flaky network, over real HTTP, with seeded randomness.

* party B (``fedlite-b serve``) SIGKILLed several times in one run, at random moments, in the
  middle of a checkpoint write and right after a restart;
* party A (``fedlite-a train``) SIGKILLed several times and simply run again;
* a fault-injecting proxy between the parties that drops, delays, truncates and resets;
* a checkpoint writer killed mid-transaction, again and again.

Every run must end bit-identical to an uninterrupted run with the same seed: the same eval
metrics, the same bottom model at party A and the same top model at party B (checksums), with
every step applied exactly once (the step log holds 1..N, each once). After every crash the
database passes ``PRAGMA integrity_check`` and every checkpoint in it is whole.
"""

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from party_a.errors import TransportError
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer, TrainSummary
from party_a.transport.http import HttpTransport
from shared.training import state_from_bytes, state_sha256
from tests.utils.crash import integrity, party_b_checkpoints
from tests.utils.data import breast_pair
from tests.utils.faults import Fault, FaultPlan, FaultProxy
from tests.utils.party_a import breast_config, make_trainer
from tests.utils.servers import ALICE, REPO_ROOT, PartyBProcess, breast_party_b


@pytest.fixture(scope="module")
def party_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PartyBProcess]:
    """Party B with the checkpoint-stall hook (inactive until a test arms it), shared by the
    module: its start-up is much of a test's time on a loaded machine. Every test trains runs
    of its own names, counts log lines from where it started, and leaves party B running."""
    root = tmp_path_factory.mktemp("faults")
    with breast_party_b(
        root / "party_b",
        module="tests.utils.party_b_faulty",
        env={"FEDLITE_TEST_ARM": str(root / "arm"), "FEDLITE_TEST_PAUSED": str(root / "paused")},
        # a killed run must end as an uninterrupted one, a run of its own: under label DP
        # (the default) each run draws its randomized labels from a secret of its own
        # (recovery under the default: tests/party_b/test_label_dp_recovery.py)
        extra_args=["--privacy", "off"],
    ) as server:
        yield server


@pytest.fixture
def trainers(party_b: PartyBProcess, tmp_path: Path) -> Iterator[Callable[..., PartyATrainer]]:
    made: list[PartyATrainer] = []

    def make(
        name: str,
        *,
        server: str | None = None,
        timeout: float = 120.0,
        retry_for: float = 120.0,
        **overrides: Any,
    ):
        _guest, host = breast_pair()
        config = breast_config(name, **overrides)
        url = server or party_b.url
        state = tmp_path / f"a-{name}"
        made.append(
            make_trainer(state, url, ALICE, host, config, timeout=timeout, retry_for=retry_for)
        )
        return made[-1]

    yield make
    for trainer in made:
        trainer.close()
    if party_b.proc is None or party_b.proc.poll() is not None:
        party_b.start()  # a test that failed between a kill and its restart


def _remote(party_b: PartyBProcess, run_id: str) -> dict[str, Any]:
    with httpx.Client(
        base_url=party_b.url, headers={"Authorization": f"Bearer {ALICE}"}, timeout=60
    ) as c:
        run: dict[str, Any] = c.get(f"/v1/runs/{run_id}").json()
        return run


def _step_log(party_b: PartyBProcess, run_id: str) -> list[int]:
    with HttpTransport(party_b.url, ALICE) as transport:
        return [row["step"] for row in transport.step_log(run_id)]


def _bottom_sha(trainer: PartyATrainer) -> str:
    return state_sha256(trainer.bottom.model.state_dict())


def _train_in_thread(trainer: PartyATrainer) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def train() -> None:
        try:
            result["summary"] = trainer.train()
        except Exception as exc:  # surfaced by the test's assertions
            result["error"] = exc

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    return thread, result


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


# ------------------------------------------------------------------------ party B killed


@pytest.mark.timeout(900)  # two runs and four restarts of party B, on a shared machine
def test_party_b_sigkilled_at_random_moments_and_mid_checkpoint_ends_like_an_uninterrupted_run(
    party_b: PartyBProcess, trainers: Callable[..., PartyATrainer]
) -> None:
    """At K = 2 only: K = 2 adds steps in flight (resent after each restart) to everything
    K = 1 goes through, and what party B does at a kill (its checkpoint transaction) does not
    depend on K. Party B killed at K = 1: tests/e2e/test_two_party_http.py::
    test_sigkill_party_b_mid_run_applies_every_step_exactly_once."""
    steps = 100
    config = {
        "run.steps": steps,
        "run.checkpoint_interval": 4,
        "run.pipeline_depth": 2,  # K steps in flight (party_a.loop)
        "model.top": {"hidden": [128, 128]},  # checkpoints of ~0.3 MB: writes take a while
    }
    reference = trainers("reference", **config)
    reference.prepare()
    reference.train()
    expected = reference.evaluate()
    expected_top = _remote(party_b, reference.run_id)["model_sha256"]

    trainer = trainers("killed", **config)
    trainer.prepare()
    rng = random.Random(20240606)
    # one kill of each kind (a second of a kind repeated its property for 2 restarts' time)
    modes = ["mid-checkpoint", "random", "after-restart"]
    rng.shuffle(modes)
    kill_at = sorted(rng.sample(range(8, steps - 16), len(modes)))
    arm = Path(party_b.env["FEDLITE_TEST_ARM"])
    paused = Path(party_b.env["FEDLITE_TEST_PAUSED"])
    resumed = party_b.log().count("resumes from checkpoint")  # before this test's kills
    thread, result = _train_in_thread(trainer)
    killed_mid_write: list[int] = []

    for mode, at in zip(modes, kill_at, strict=True):
        _wait_for(lambda at=at: trainer.step >= at or not thread.is_alive(), 120, f"step {at}")
        assert thread.is_alive(), result
        if mode == "mid-checkpoint":
            arm.touch()  # the next checkpoint write stalls before its commit...
            _wait_for(paused.exists, 60, "a checkpoint write")
            killed_mid_write.append(int(paused.read_text()))
            paused.unlink()
        elif mode == "random":
            time.sleep(rng.uniform(0.0, 0.05))
        elif mode == "after-restart":  # party A is still retrying when B dies again
            party_b.kill9()
            party_b.start()
        party_b.kill9()  # ...and is killed there
        assert integrity(party_b.database) == "ok"
        kept = party_b_checkpoints(party_b.database)[trainer.run_id]  # each loads whole
        if mode == "mid-checkpoint":
            assert killed_mid_write[-1] not in kept, "an uncommitted checkpoint survived"
        party_b.start()

    thread.join(timeout=300)
    assert "error" not in result, result.get("error")
    summary: TrainSummary = result["summary"]
    assert summary.last_step == steps
    assert summary.rollbacks >= 1
    assert len(killed_mid_write) == 1
    assert party_b.log().count("resumes from checkpoint") - resumed >= len(modes)
    assert _step_log(party_b, trainer.run_id) == list(range(1, steps + 1))  # each once
    answer = trainer.evaluate()
    assert (answer.loss, answer.metrics) == (expected.loss, expected.metrics)
    assert _bottom_sha(trainer) == _bottom_sha(reference)
    assert _remote(party_b, trainer.run_id)["model_sha256"] == expected_top


def test_party_b_gone_with_steps_in_flight_is_reported_within_retry_for(
    party_b: PartyBProcess, trainers: Callable[..., PartyATrainer]
) -> None:
    """K=2 steps in flight when party B dies for good: party A stops retrying after
    ``retry_for`` with an error that says so, no thread left waiting on an answer. (That a
    run picks up again once party B is back: the kill tests below.)"""
    retry_for = 3.0
    settings = {"run.steps": 60, "run.checkpoint_interval": 5, "run.pipeline_depth": 2}
    trainer = trainers("gone", retry_for=retry_for, **settings)
    trainer.prepare()
    before = set(threading.enumerate())
    thread, result = _train_in_thread(trainer)
    _wait_for(lambda: trainer.step >= 12 or not thread.is_alive(), 120, "step 12")
    party_b.kill9()
    died = time.monotonic()
    thread.join(timeout=120)
    waited = time.monotonic() - died
    party_b.start()  # for the next test (the module shares party B)

    assert not thread.is_alive(), "party A still waits for a party B that is gone"
    assert isinstance(result.get("error"), TransportError), result
    assert "unreachable for 3 s" in str(result["error"])
    # each of the K requests in flight gives up after retry_for (+ one attempt's timeouts)
    assert waited < 10 * retry_for, waited
    # (threads of this run only: a failed test before this one may have left its own)
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("fedlite-step")]


# ------------------------------------------------------------------------ party A killed


@pytest.mark.parametrize("depth", [1, 2], ids=["one-step", "pipelined-K2"])
def test_party_a_cli_sigkilled_three_times_ends_like_an_uninterrupted_run(
    party_b: PartyBProcess, trainers: Callable[..., PartyATrainer], tmp_path: Path, depth: int
) -> None:
    _guest, host = breast_pair()
    steps = 120
    name = f"killed-a-k{depth}"  # the module's party B holds both depths' runs
    reference = trainers(
        "reference-a",
        **{"run.steps": steps, "run.checkpoint_interval": 10, "run.pipeline_depth": depth},
    )
    reference.prepare()
    reference.train()
    expected = reference.evaluate()
    reference.finish()
    expected_top = _remote(party_b, reference.run_id)["model_sha256"]

    config = tmp_path / "run.toml"
    config.write_text(
        (REPO_ROOT / "examples" / "breast.toml")
        .read_text()
        .replace('name = "breast-demo"', f'name = "{name}"')
        .replace("steps = 100 ", f"steps = {steps} ")
        .replace("checkpoint_interval = 25", f"checkpoint_interval = 10\npipeline_depth = {depth}")
    )
    state = tmp_path / "a-state"
    summary_path = tmp_path / "summary.json"
    command = [
        sys.executable, "-m", "party_a.cli", "train", "--server", party_b.url,
        "--token", ALICE, "--features", str(host), "--config", str(config),
        "--state-dir", str(state), "--summary-json", str(summary_path),
    ]  # fmt: skip
    rng = random.Random(7)
    kill_at = sorted(rng.sample(range(10, steps - 20), 3))
    run_id = ""
    with httpx.Client(
        base_url=party_b.url, headers={"Authorization": f"Bearer {ALICE}"}, timeout=60
    ) as c:
        for at in kill_at:
            process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )

            def reached(at: int = at, process: subprocess.Popen[bytes] = process) -> bool:
                nonlocal run_id
                mine = [r for r in c.get("/v1/runs").json()["runs"] if r["name"] == name]
                run_id = mine[0]["id"] if mine else ""
                return bool(mine) and mine[0]["step"] >= at or process.poll() is not None

            _wait_for(reached, 120, f"party A at step {at}")
            time.sleep(rng.uniform(0.0, 0.05))
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
            assert process.returncode == -signal.SIGKILL, (
                f"party A exited by itself before step {at}"
            )
            assert integrity(state / "party_a.sqlite") == "ok"
        assert c.get(f"/v1/runs/{run_id}").json()["step"] < steps

    final = subprocess.run(command, capture_output=True, text=True, timeout=300)

    assert final.returncode == 0, final.stderr
    summary = json.loads(summary_path.read_text())
    assert summary["last_step"] == steps
    assert _step_log(party_b, run_id) == list(range(1, steps + 1))
    assert summary["eval_metrics"]["eval_loss"] == expected.loss
    assert summary["eval_metrics"]["eval_auc"] == expected.metrics["auc"]
    assert _remote(party_b, run_id)["model_sha256"] == expected_top
    store = LocalStore.in_directory(state)
    try:
        local = store.find_run(party_b.url, name)
        assert local is not None
        last = store.load_checkpoint(local.id)
        assert last is not None and last.step == steps
        assert state_sha256(state_from_bytes(last.model_state)) == _bottom_sha(reference)
    finally:
        store.close()


# ------------------------------------------------------------------------ flaky network

FLAKY = {
    Fault.PASS: 0.55,
    Fault.DELAY: 0.15,
    Fault.RESET: 0.08,
    Fault.DROP: 0.10,
    Fault.TRUNCATE: 0.05,
    Fault.STALL: 0.04,
    Fault.LATE: 0.03,
}


@pytest.mark.timeout(600)  # two runs, the second through a proxy that fails 45 % of requests
@pytest.mark.parametrize(
    "depth",
    [1, 2],
    ids=["one-step", "pipelined-K2"],
)
def test_a_flaky_network_converges_with_no_double_update(
    party_b: PartyBProcess, trainers: Callable[..., PartyATrainer], depth: int
) -> None:
    steps = 40  # every fault kind is scripted to happen; more steps only repeat them
    name = f"flaky-k{depth}"  # the module's party B holds both depths' runs
    settings = {"run.steps": steps, "run.checkpoint_interval": 10, "run.pipeline_depth": depth}
    reference = trainers("reference-net", **settings)
    reference.prepare()
    reference.train()
    expected = reference.evaluate()
    expected_top = _remote(party_b, reference.run_id)["model_sha256"]
    # The first request (POST /v1/runs) loses its answer: the retry must not create a second
    # run. Then one of each fault for certain (whatever the timing), then seeded draws.
    script = [Fault.DROP, Fault.PASS, Fault.PASS, Fault.PASS]
    script += [Fault.RESET, Fault.DROP, Fault.TRUNCATE, Fault.STALL, Fault.LATE, Fault.DELAY]
    plan = FaultPlan(seed=11, weights=FLAKY, script=script, stall_s=4.0)

    with FaultProxy(party_b.port, plan) as proxy:
        trainer = trainers(
            name,
            server=proxy.url,
            # < stall_s: a stalled answer times out and is retried; 3 s, so that a request
            # no fault touched does not time out on a loaded machine
            timeout=3.0,
            **settings,
        )
        trainer.prepare()
        summary = trainer.train()
        answer = trainer.evaluate()

    assert proxy.requests[0] == ("POST /v1/runs HTTP/1.1", Fault.DROP)
    # issue 17: only that first fault, before any answer, asks whether the port speaks TLS
    assert proxy.tls_hellos == 1
    assert {f for f in Fault if f is not Fault.PASS} <= set(proxy.counts), proxy.counts
    assert trainer.transport.retries >= sum(  # type: ignore[attr-defined]
        n for f, n in proxy.counts.items() if f is not Fault.PASS and f is not Fault.DELAY
    )
    assert summary.last_step == steps
    runs = [r for r in _runs(party_b) if r["name"] == name]
    assert len(runs) == 1, "a retried POST /v1/runs created a second run"
    assert _step_log(party_b, trainer.run_id) == list(range(1, steps + 1))
    assert (answer.loss, answer.metrics) == (expected.loss, expected.metrics)
    assert _bottom_sha(trainer) == _bottom_sha(reference)
    assert _remote(party_b, trainer.run_id)["model_sha256"] == expected_top


def _runs(party_b: PartyBProcess) -> list[dict[str, Any]]:
    with httpx.Client(
        base_url=party_b.url, headers={"Authorization": f"Bearer {ALICE}"}, timeout=60
    ) as c:
        runs: list[dict[str, Any]] = c.get("/v1/runs").json()["runs"]
        return runs
