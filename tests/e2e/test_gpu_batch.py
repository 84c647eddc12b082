"""The GPU batch driver end to end on this CPU (parallel processes, a deadline, one tar.gz)."""

import json
import tarfile
from pathlib import Path

from tests.utils.data import shared_data


def test_the_gpu_batch_smoke_packs_what_finished_and_what_was_cut(tmp_path: Path) -> None:
    """experiments.gpu_batch --smoke on this CPU: runs in priority order until the deadline,
    records (finished or cut) and a report in one tar.gz."""
    from experiments.gpu_batch import ARCHIVE, REPORT, main

    shared_data()
    code = main(
        [
            "--smoke", "--budget-seconds", "70", "--pack-seconds", "5",
            "--min-start-seconds", "30", "--workers", "2", "--sweeps", "femnist_long,so_tag_long",
            "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
        ]
    )  # fmt: skip
    assert code == 0
    with tarfile.open(tmp_path / "out" / ARCHIVE) as tar:
        names = tar.getnames()
        report = json.load(tar.extractfile(REPORT))  # type: ignore[arg-type]
    runs = {run["key"]: run for run in report["runs"]}
    started = [run for run in runs.values() if run["state"] in ("finished", "cut")]
    assert started, report
    for run in started:
        assert f"{run['sweep']}/{run['record']}.json" in names
    # a run is killed only if it never reached an evaluation by the deadline's grace
    assert all(run["state"] in ("finished", "cut", "not run", "killed") for run in runs.values())
