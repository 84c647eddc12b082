"""Smoke versions of every experiment sweep (a few steps on a few clients), so the harness
that produces docs/RESULTS.md cannot rot; and its HTTP spot check."""

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from experiments.runner import RunConfig
from experiments.sweep import load_records, run_sweep, write_summary
from experiments.sweeps import SWEEPS
from tests.utils.data import shared_data


@pytest.fixture(autouse=True)
def _data_present() -> None:
    shared_data()  # skip (or fail under CI) without ../shared/data


# one smoke run per distinct smoke sweep (femnist_headline shares femnist's)
SMOKES = [
    n
    for i, n in enumerate(SWEEPS)
    if SWEEPS[n].smoke not in [SWEEPS[m].smoke for m in list(SWEEPS)[:i]]
]


@pytest.mark.parametrize("name", SMOKES)
def test_smoke_sweep_runs_every_kind_of_run_and_resumes(name: str, tmp_path: Path) -> None:
    failed = run_sweep(name, out=tmp_path, jobs=1, smoke=True)

    records = load_records(tmp_path / name)
    assert failed == []
    assert len(records) == len(SWEEPS[name].jobs(smoke=True))
    for record in records:
        final = record["final"]
        assert final, record["key"]
        assert all(math.isfinite(v) for v in final.values()), final
        assert record["curve"][-1]["step"] == record["curve"][-1]["step"]
    for record in records:
        if record["config"].get("eval_raw"):  # evaluated on z as well as on z~
            assert {"eval_raw_loss", "eval_raw_accuracy"} <= set(record["final"])
    fedlite = [r for r in records if r["config"]["method"] == "fedlite"]
    assert all(r["paper_ratio"] > 1 and r["wire_ratio"] > 0 for r in fedlite)
    summary = (tmp_path / name / "summary.csv").read_text().splitlines()
    assert len(summary) == len(records) + 1
    # a second invocation finds every record and runs nothing
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / name).glob("*.json")}
    assert run_sweep(name, out=tmp_path, jobs=1, smoke=True) == []
    assert before == {p.name: p.stat().st_mtime_ns for p in (tmp_path / name).glob("*.json")}


def test_http_spot_check_gives_the_in_process_numbers(tmp_path: Path) -> None:
    """fedlite-b serve in a subprocess and the in-process service train bit-identically."""
    failed = run_sweep("vertical", out=tmp_path, jobs=1, smoke=True, http=True)

    records = {r["config"]["transport"]: r for r in load_records(tmp_path / "vertical-http")}
    assert failed == [] and set(records) == {"inprocess", "http"}
    verdict = json.loads((tmp_path / "vertical-http" / "http_check.txt").read_text())
    assert verdict["identical"] is True
    assert records["http"]["final"] == records["inprocess"]["final"]


def test_summary_lists_every_record(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    directory.mkdir()
    for i in range(2):
        record = {
            "key": f"k{i}",
            "config": {"method": "splitfed", "seed": i, "task_options": {}},
            "final": {"eval_auc": 0.5 + i / 10},
            "seconds": 1.0,
        }
        (directory / f"k{i}.json").write_text(json.dumps(record))

    lines = write_summary(directory).read_text().splitlines()

    assert lines[0].split(",") == ["key", "method", "seed", "eval_auc", "seconds"]
    assert lines[2].startswith("k1,splitfed,1,0.6")


def test_the_five_percent_point_is_the_most_compressed_good_enough_one() -> None:
    from experiments.figures import within_five_percent

    def point(metric: float, ratio: float) -> dict[str, float]:
        return {"metric": metric, "paper_ratio": ratio, "wire_ratio": ratio / 2}

    points = {
        (4608, 16, 1): {0.0: point(0.76, 32)},
        (4608, 2, 1): {0.0: point(0.70, 128), 5e-5: point(0.74, 128)},  # best lambda counts
        (1152, 2, 1): {0.0: point(0.47, 490)},
    }
    best = within_five_percent(0.77, points)
    assert best is not None and (best["q"], best["L"], best["lam"]) == (4608, 2, 5e-5)
    assert within_five_percent(0.99, points) is None


def test_generated_tables_replace_only_their_own_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from experiments import figures

    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "t.md").write_text("| new |\n")
    doc = tmp_path / "RESULTS.md"
    doc.write_text(
        "prose\n<!-- BEGIN figures/t.md -->\n| old |\n<!-- END figures/t.md -->\nmore\n"
        "<!-- BEGIN figures/missing.md -->\nkept\n<!-- END figures/missing.md -->\n"
    )
    monkeypatch.setattr(figures, "FIGURES", tmp_path / "figures")
    monkeypatch.setattr(figures, "RESULTS_DOC", doc)

    figures.update_results_doc()

    assert doc.read_text() == (
        "prose\n<!-- BEGIN figures/t.md -->\n| new |\n<!-- END figures/t.md -->\nmore\n"
        "<!-- BEGIN figures/missing.md -->\nkept\n<!-- END figures/missing.md -->\n"
    )


def test_headline_drops_pair_each_seed_and_use_only_steps_every_run_reached() -> None:
    from experiments.headline import relative_drops

    def record(method: str, seed: int, curve: dict[int, float]) -> dict[str, object]:
        points = [{"step": s, "eval_accuracy": a} for s, a in curve.items()]
        return {"config": {"method": method, "seed": seed}, "curve": points}

    records = [
        record("splitfed", 0, {100: 0.80, 200: 0.90}),
        record("splitfed", 1, {100: 0.60, 200: 0.70}),
        record("fedlite", 0, {100: 0.40, 200: 0.81}),
        record("fedlite", 1, {100: 0.60}),  # still training: step 200 not reached
        record("fedlite", 2, {100: 0.10, 200: 0.10}),  # no SplitFed partner: left out
    ]
    (row,) = relative_drops(records)
    assert row["step"] == 100 and row["seeds"] == [0, 1]
    assert row["drop"] == pytest.approx(1 - 0.5 / 0.7)
    assert row["drop_per_seed"] == pytest.approx([0.5, 0.0])
    assert relative_drops(records[:2]) == []


def test_a_shorter_run_is_the_prefix_of_a_longer_one() -> None:
    """The FEMNIST grid reads its 1,000-step SplitFed and headline points off the headline
    pair's 2,000-step runs (experiments.records.prefix_record): that is sound only if nothing
    in a run depends on its length. Checked on a FedLite run (quantizer, correction, schedule
    and Adam all in play): 4 steps alone and the first 4 of 8 give the same record."""
    from experiments.records import prefix_record
    from experiments.runner import run_split

    base = SWEEPS["vertical"].jobs(smoke=True)[0]
    assert isinstance(base, RunConfig)
    base = replace(base, eval_every=4)
    short, long = run_split(replace(base, steps=4)), run_split(replace(base, steps=8))
    prefix = prefix_record(long, 4)

    def numbers(record: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in record["curve"]]

    assert prefix["key"] == short["key"] and prefix["prefix_of"] == long["key"]
    assert numbers(prefix) == numbers(short)
    assert prefix["final"] == {k: v for k, v in short["final"].items() if k.startswith("eval_")}
    assert prefix["wire_bytes"] == short["wire_bytes"]
