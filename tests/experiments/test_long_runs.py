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


def _results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An empty results tree and figures folder the modules read and write instead."""
    results, figures = tmp_path / "results", tmp_path / "figures"
    (results / "femnist_long").mkdir(parents=True)
    figures.mkdir()
    for module in (records, long):
        monkeypatch.setattr(module, "RESULTS", results)
    monkeypatch.setattr(records, "FIGURES", figures)
    return results, figures


def _write(results: Path, record: dict[str, Any]) -> None:
    (results / "femnist_long" / f"{record['key']}.json").write_text(json.dumps(record))


def test_the_long_tables_compare_at_the_last_step_every_run_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three seeds at two rates, cut at different steps: the table reads every pair at the
    last step all of one rate reached; the headline row takes the rate best for SplitFed."""
    results, figures = _results(tmp_path, monkeypatch)
    for seed in (0, 1, 2):
        for lr, split_top, reached in ((0.1, 0.86, 4000 + 100 * seed), (0.0316, 0.84, 2500)):
            split = {s: min(split_top, 0.5 + 0.0002 * s) for s in range(100, reached + 1, 100)}
            fed = {s: 0.96 * a for s, a in split.items()}
            for method, curve in (("splitfed", split), ("fedlite", fed)):
                _write(results, _record(method, seed, lr, curve))
    assert long.best_rate(records.records_of("femnist_long")) == 0.1
    long.headline_long_table()
    table = (figures / "headline_long.md").read_text()
    # SplitFed at 0.1 tops out at step 1,800; the rule (5 evaluations against the 5 ending
    # 1,000 steps earlier) first sees less than 0.5 % at 3,100, and FedLite, 0.96 of it at
    # every step, at the same step. At 0.0316 both are still rising at 2,500, the last step
    # all three seeds reached.
    assert (
        "| femnist (accuracy) | 0.1 | 0, 1, 2 | q=1152 L=2 lambda=0.0002 (490x) | "
        "step 3100: 0.8600 | step 3100: 0.8256 | 4000 | 0.8600 ± 0.0000 | 0.8256 ± 0.0000 | "
        "**4.0 %** (4.0, 4.0, 4.0 %) | < 5 % at 490x | "
        "**reproduced**: 4.0 %, 1.0 points under the bar |"
    ) in table
    assert (
        "| femnist (accuracy) | 0.0316 | 0, 1, 2 | q=1152 L=2 lambda=0.0002 (490x) | "
        "not by step 2500 (0.8400 there) | not by step 2500 (0.8064 there) | 2500 |"
    ) in table
    assert "not settled at step 2500: SplitFed not plateaued, FedLite not plateaued" in table
    long.femnist_long_table()
    detail = (figures / "headline_femnist_long.md").read_text()
    assert "| 0.1 | 0.0002 | 4000 | 0.8600 ± 0.0000 | 0.8256 ± 0.0000 | **4.0 %** |" in detail
    at = long.at_common_step(records.records_of("femnist_long"))
    assert {r["steps"] for r in at} == {2500}


def test_fedlite_is_held_to_the_same_plateau_rule_and_read_where_both_have_plateaued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FedLite climbing half as fast to 0.83 plateaus later than SplitFed (0.86): each
    method's plateau step and value are its own; the drop at the last common step, both
    plateaued by then, is the verdict (3.5 % < 5 %: reproduced)."""
    results, figures = _results(tmp_path, monkeypatch)
    for seed in (0, 1, 2):
        split = {s: min(0.86, 0.5 + 0.0002 * s) for s in range(100, 6001, 100)}
        fed = {s: min(0.83, 0.5 + 0.0001 * s) for s in range(100, 5001 + 100 * seed, 100)}
        _write(results, _record("splitfed", seed, 0.1, split))
        _write(results, _record("fedlite", seed, 0.1, fed))
    (runs,) = long._by_rate(records.records_of("femnist_long")).values()
    found = long.compare(runs, "eval_accuracy")
    assert found is not None
    # FedLite reaches 0.83 at 3,300: the 5 evaluations ending at 4,600 (0.83) are the first
    # less than 0.5 % above the 5 ending 1,000 steps earlier (3,200-3,600: 0.828)
    assert found["plateau"]["splitfed"] == {"step": 3100, "last": 6000, "value": 0.86}
    assert found["plateau"]["fedlite"]["step"] == 4600
    assert found["plateau"]["fedlite"]["last"] == 5000  # the last step all 3 seeds reached
    assert found["plateau"]["fedlite"]["value"] == pytest.approx(0.83)
    assert found["at"]["step"] == 5000
    long.headline_long_table()
    table = (figures / "headline_long.md").read_text()
    assert "**3.5 %** (3.5, 3.5, 3.5 %)" in table
    assert "**reproduced**: 3.5 %, 1.5 points under the bar" in table


def test_the_verdict_needs_both_plateaus_by_the_step_it_reads() -> None:
    both = {"SplitFed": 3800, "FedLite": 5300}
    assert long.verdict(0.033, both, 6300) == "**reproduced**: 3.3 %, 1.7 points under the bar"
    assert long.verdict(0.061, both, 6300) == ("**not reproduced**: 6.1 %, 1.1 points over the bar")
    assert long.verdict(0.021, {"SplitFed": 1500, "FedLite": None}, 800) == (
        "not settled at step 800: SplitFed plateaus only at step 1500, FedLite not plateaued "
        "(2.1 % there, 2.9 points under the bar)"
    )
    # a plateau at the very step read counts as reached
    assert long.verdict(0.04, {"SplitFed": 800, "FedLite": 800}, 800).startswith("**reproduced")


def test_a_run_cut_twice_counts_once_its_longest_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run cut at one batch's deadline and run again to a later one leaves two records of
    one run (same ``cut_from``): the tables read only the longer."""
    results, _ = _results(tmp_path, monkeypatch)
    curve = {s: 0.5 + 0.0001 * s for s in range(100, 3001, 100)}
    for steps in (1700, 3000):
        record = _record("splitfed", 0, 0.1, {s: a for s, a in curve.items() if s <= steps})
        record["cut_from"] = "femnist-splitfed-lr0.1-s0-T20000"
        _write(results, record)
    _write(results, _record("splitfed", 1, 0.1, curve))  # no cut_from: a run of its own
    loaded = records.records_of("femnist_long")
    assert sorted((r["config"]["seed"], r["steps"]) for r in loaded) == [(0, 3000), (1, 3000)]
