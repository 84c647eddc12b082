"""Party B's in-memory state stays bounded: by live runs, never by run ids asked for."""

from pathlib import Path

import pytest

from experiments.inprocess import in_process_party_b
from loadtests.scenarios import SCENARIOS, StepSchedule, hashed_ids, read_ids, write_label_table
from party_b.errors import ProblemError
from party_b.labels import load_label_table


def test_no_bookkeeping_is_left_behind_per_run_id(tmp_path: Path) -> None:
    labels_csv = write_label_table(tmp_path / "labels.csv", n=200)
    service, caller = in_process_party_b(
        load_label_table(labels_csv, id_column="id", label_column="y", feature_columns=None),
        tmp_path / "b.sqlite",
    )
    scenario = SCENARIOS["femnist-fedlite"]
    spec = scenario.run_create("bounded", steps=10, seed=0)
    run = service.create_run(caller, spec)
    answer = service.align(caller, run.id, hashed_ids(run.alignment_key, read_ids(labels_csv)))
    schedule = StepSchedule(scenario, spec, answer.intersection)

    for unknown in ("nope-1", "nope-2", "nope-3"):
        with pytest.raises(ProblemError):
            service.step(caller, unknown, schedule.body(1))
    for t in (1, 2):
        service.step(caller, run.id, schedule.body(t))
    service.finish(caller, run.id)

    assert service._loading == {}  # noqa: SLF001 - the bookkeeping under test
