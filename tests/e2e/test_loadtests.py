"""The load tests' pieces: the SLO gate, real step requests party B accepts, a bounded smoke.

The locustfile itself is never imported here: importing locust monkey-patches the whole
process with gevent. The smoke test runs it in a subprocess, as CI and users do.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadtests.scenarios import SCENARIOS, StepSchedule, hashed_ids, read_ids, write_label_table
from loadtests.slo import Totals, violations
from party_b.inprocess import in_process_party_b
from party_b.labels import load_label_table
from shared import codec

ROOT = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------- SLO gate


def test_the_gate_passes_a_run_within_its_thresholds() -> None:
    totals = Totals(requests=1000, failures=1, steps=990, p99_ms=120.0)

    assert violations(totals, max_fail_ratio=0.01, max_p99_ms=200.0) == []


@pytest.mark.parametrize(
    ("totals", "reason"),
    [
        (Totals(requests=1000, failures=11, steps=990, p99_ms=120.0), "failure ratio 0.0110"),
        (Totals(requests=1000, failures=0, steps=990, p99_ms=250.0), "p99 250 ms > 200 ms"),
        (Totals(requests=8, failures=0, steps=0, p99_ms=0.0), "no step requests"),
        (Totals(requests=0, failures=0, steps=0, p99_ms=0.0), "no step requests"),
    ],
)
def test_the_gate_names_each_missed_threshold(totals: Totals, reason: str) -> None:
    problems = violations(totals, max_fail_ratio=0.01, max_p99_ms=200.0)

    assert len(problems) == 1 and reason in problems[0], problems


# ----------------------------------------------------------------------------- real steps


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_steps_are_accepted_in_order_by_party_b(name: str, tmp_path: Path) -> None:
    """The load generator's requests are real ones: party B applies them and answers with a
    gradient of the scenario's shape."""
    labels_csv = write_label_table(tmp_path / "labels.csv", n=6000)
    service, caller = in_process_party_b(
        load_label_table(labels_csv, id_column="id", label_column="y", feature_columns=None),
        tmp_path / "b.sqlite",
    )
    scenario = SCENARIOS[name]
    spec = scenario.run_create("load", steps=100, seed=3)
    run = service.runs.create(caller, spec)
    answer = service.alignment.align(
        caller, run.id, hashed_ids(run.alignment_key, read_ids(labels_csv))
    )
    schedule = StepSchedule(scenario, spec, answer.intersection)

    responses = [
        codec.decode_step_response(service.steps.step(caller, run.id, schedule.body(t)))
        for t in (1, 2, 3)
    ]

    assert [r.step for r in responses] == [1, 2, 3]
    assert all(r.grad.shape == (scenario.batch, scenario.cut_dim) for r in responses)
    assert all(np.isfinite(r.loss) for r in responses)
    assert service.runs.get(caller, run.id).step == 3


# ----------------------------------------------------------------------------- smoke


def test_locust_smoke_against_a_fresh_party_b_meets_its_slo(tmp_path: Path) -> None:
    """The documented command, bounded: two concurrent runs for 10 s, no failed request."""
    out = tmp_path / "summary.json"
    command = [
        sys.executable, "-m", "loadtests.run",
        "--scenarios", "femnist-fedlite,femnist-splitfed",
        "--users", "2",
        "--run-time", "10s",
        "--warmup", "3",
        "--ids", "2000",  # alignment hashes every id on both sides: keep it short here
        "--max-fail-ratio", "0",
        "--max-p99-ms", "30000",  # a smoke on a shared CI box: only failures really gate
        "--out", str(out),
    ]  # fmt: skip

    # a bound for a hang, not a speed: party B's start-up and the alignment come first
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(out.read_text())
    steps = {k: v for k, v in summary["locust"].items() if "/steps" in k}
    assert steps and all(v["requests"] > 0 and v["failures"] == 0 for v in steps.values())
    assert summary["locust"]["Aggregated"]["failures"] == 0
