"""``python -m experiments.sweep NAME --ray``: the sweep's jobs as tasks on a real local Ray
instance. Same records as the process pool (to the last bit, wall times aside), the same
resumability (a finished record is never run again; a missing one is), artifacts written by
the driver, and a job that raises reported as failed with no record."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from experiments.ray_sweep import run_on_ray
from experiments.runner import RunConfig
from experiments.sweep import _report, load_records, run_sweep, save_record
from experiments.sweeps import SWEEPS
from tests.utils.data import shared_data


@pytest.fixture(autouse=True)
def _data_present() -> None:
    shared_data()  # skip (or fail under CI) without ../shared/data


def _without_times(record: Any) -> Any:
    if isinstance(record, dict):
        return {k: _without_times(v) for k, v in record.items() if k != "seconds"}
    if isinstance(record, list):
        return [_without_times(v) for v in record]
    return record


@pytest.mark.timeout(1800)
def test_the_femnist_smoke_sweep_on_ray_matches_the_pool_and_resumes(tmp_path: Path) -> None:
    ray_out, pool_out = tmp_path / "ray", tmp_path / "pool"
    jobs = SWEEPS["femnist"].jobs(smoke=True)

    failed = run_sweep("femnist", out=ray_out, jobs=2, smoke=True, ray=True)
    directory = ray_out / "femnist"
    written = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    again = run_sweep("femnist", out=ray_out, jobs=2, smoke=True, ray=True)
    unchanged = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    splitfed = next(j for j in jobs if j.key.startswith("femnist-splitfed"))
    (directory / f"{splitfed.key}.json").unlink()
    resumed = run_sweep("femnist", out=ray_out, jobs=2, smoke=True, ray=True)
    pool = run_sweep("femnist", out=pool_out, jobs=1, smoke=True, match="femnist-fedlite")

    assert failed == again == resumed == pool == []
    assert sorted(r["key"] for r in load_records(directory)) == sorted(j.key for j in jobs)
    # the second command found every record and ran nothing; the third ran only the missing one
    assert {k: v for k, v in unchanged.items() if k != "summary.csv"} == {
        k: v for k, v in written.items() if k != "summary.csv"
    }
    assert (directory / f"{splitfed.key}.json").exists()
    # bit for bit what the process pool writes: records and the trained bottom models
    for record in load_records(pool_out / "femnist"):
        on_ray = json.loads((directory / f"{record['key']}.json").read_text())
        assert _without_times(on_ray) == _without_times(record), record["key"]
        bottom = f"{record['key']}.bottom.pt"
        assert (directory / bottom).read_bytes() == (pool_out / "femnist" / bottom).read_bytes()


@pytest.mark.timeout(900)
def test_a_job_that_raises_is_reported_failed_and_leaves_no_record(tmp_path: Path) -> None:
    fedavg = next(j for j in SWEEPS["femnist"].jobs(smoke=True) if "fedavg" in j.key)
    first = next(j for j in SWEEPS["femnist"].jobs(smoke=True) if isinstance(j, RunConfig))
    broken = replace(first, method="fedlite", steps=2, q=7)  # no L: party A's config refuses it

    failed = run_on_ray(
        [fedavg, broken], tmp_path, address=None, cpus=2, save=save_record, report=_report
    )

    assert failed == [broken.key]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [f"{fedavg.key}.json"]
