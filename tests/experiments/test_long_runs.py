"""The runs at the paper's length: a run cut at a deadline is the run of that many steps, the
plateau rule, the tables generated from such runs, and the GPU batch driver end to end (its
smoke, on the CPU)."""

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from experiments import long, records
from experiments.runner import RunConfig, run_split
from experiments.sweeps import SWEEPS
from tests.utils.data import shared_data


def _numbers(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in record["curve"]]


def test_a_run_cut_at_its_deadline_is_the_run_of_that_many_steps() -> None:
    """A deadline already past cuts the run at its first evaluation (step 2 of 8): its record
    is, number for number and key for key, the record of a 2-step run."""
    shared_data()
    base = SWEEPS["vertical"].jobs(smoke=True)[0]
    assert isinstance(base, RunConfig)
    base = replace(base, steps=8, eval_every=2)
    cut = run_split(base, deadline=time.time() - 1)
    short = run_split(replace(base, steps=2))
    assert cut["key"] == short["key"] and cut["config"] == short["config"]
    assert cut["cut_from"] == base.key and cut["nominal_steps"] == 8 and cut["steps"] == 2
    assert _numbers(cut) == _numbers(short)
    assert cut["final"] == short["final"] and cut["wire_bytes"] == short["wire_bytes"]


def test_plateau_is_the_first_step_the_smoothed_gain_falls_below_half_a_percent() -> None:
    rising = {s: 0.5 + 0.0001 * s for s in range(100, 5001, 100)}  # +2 % a 1,000 steps
    assert long.plateau_step(rising) is None
    flat_from_3000 = {s: min(0.5 + 0.0001 * s, 0.8) for s in range(100, 8001, 100)}
    # the 5 evaluations ending at t (all 0.8 from 3,400) against the 5 ending at t - 1,000:
    # 0.8 against 0.798 (2,900-3,300) is the first gain under 0.5 %
    assert long.plateau_step(flat_from_3000) == 4300
    assert long.plateau_step({100: 0.1, 200: 0.2}) is None  # too short to say


def _record(method: str, seed: int, lr: float, accuracies: dict[int, float]) -> dict[str, Any]:
    steps = max(accuracies)
    config = {
        "task": "femnist", "method": method, "seed": seed, "lr_bottom": lr, "steps": steps,
        "clients_per_step": 10, "q": 1152 if method == "fedlite" else None,
        "L": 2 if method == "fedlite" else None, "R": 1, "lam": 2e-4 if method == "fedlite" else 0,
    }  # fmt: skip
    key = f"femnist-{method}-lr{lr:.3g}-s{seed}-T{steps}"
    curve = [{"step": s, "eval_accuracy": a, "wire_bytes": s} for s, a in accuracies.items()]
    return {
        "key": key, "config": config, "lambda_units": "paper", "curve": curve, "steps": steps,
        "final": {"eval_accuracy": accuracies[steps]}, "paper_ratio": 489.6 if method ==
        "fedlite" else 1.0, "wire_ratio": 246.0 if method == "fedlite" else 1.0, "seconds": 1.0,
    }  # fmt: skip


def test_the_long_tables_compare_at_the_last_step_every_run_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three seeds at two rates, cut at different steps: the table reads every pair at the
    last step all of one rate reached; the headline row takes the rate best for SplitFed."""
    results, figures = tmp_path / "results", tmp_path / "figures"
    (results / "femnist_long").mkdir(parents=True)
    figures.mkdir()
    for module in (records, long):
        monkeypatch.setattr(module, "RESULTS", results)
    monkeypatch.setattr(records, "FIGURES", figures)
    for seed in (0, 1, 2):
        for lr, split_top, reached in ((0.1, 0.86, 4000 + 100 * seed), (0.0316, 0.84, 2500)):
            split = {s: min(split_top, 0.5 + 0.0002 * s) for s in range(100, reached + 1, 100)}
            fed = {s: 0.96 * a for s, a in split.items()}
            for method, curve in (("splitfed", split), ("fedlite", fed)):
                record = _record(method, seed, lr, curve)
                path = results / "femnist_long" / f"{record['key']}.json"
                path.write_text(json.dumps(record))
    assert long.best_rate(records.records_of("femnist_long")) == 0.1
    long.femnist_long_table()
    table = (figures / "headline_femnist_long.md").read_text()
    # SplitFed at 0.1 tops out at step 1,800; the rule (5 evaluations against the 5 ending
    # 1,000 steps earlier) first sees less than 0.5 % at 3,100. At 0.0316 it is still rising
    # at 2,500, the last step all three seeds reached.
    assert "| 0.1 | 0, 1, 2 | 4000 | step 3100 | 0.8600 | 0.8256 | **4.0 %** | yes |" in table
    assert "| 0.0316 | 0, 1, 2 | 2500 | not by step 2500 |" in table
    at = long.at_common_step(records.records_of("femnist_long"))
    assert {r["steps"] for r in at} == {2500}
