"""Party B's runs in memory (``party_b.service.cache``): loaded once, bounded by live runs,
never by run ids asked for."""

import threading
import time
from pathlib import Path

import pytest

from loadtests.scenarios import SCENARIOS, StepSchedule, hashed_ids, read_ids, write_label_table
from party_b.errors import ProblemError
from party_b.inprocess import in_process_party_b
from party_b.labels import load_label_table
from party_b.metrics import Metrics
from party_b.service.cache import RunCache


def test_no_bookkeeping_is_left_behind_per_run_id(tmp_path: Path) -> None:
    labels_csv = write_label_table(tmp_path / "labels.csv", n=200)
    service, caller = in_process_party_b(
        load_label_table(labels_csv, id_column="id", label_column="y", feature_columns=None),
        tmp_path / "b.sqlite",
    )
    scenario = SCENARIOS["femnist-fedlite"]
    spec = scenario.run_create("bounded", steps=10, seed=0)
    run = service.runs.create(caller, spec)
    answer = service.alignment.align(
        caller, run.id, hashed_ids(run.alignment_key, read_ids(labels_csv))
    )
    schedule = StepSchedule(scenario, spec, answer.intersection)

    for unknown in ("nope-1", "nope-2", "nope-3"):
        with pytest.raises(ProblemError):
            service.steps.step(caller, unknown, schedule.body(1))
    for t in (1, 2):
        service.steps.step(caller, run.id, schedule.body(t))
    service.runs.finish(caller, run.id)

    assert service.context.cache._loading == {}  # noqa: SLF001 - the bookkeeping under test


def test_a_failed_load_lets_exactly_one_waiter_load_again(tmp_path: Path) -> None:
    """Eight callers ask for a run that is not in memory; the first load fails while the
    others wait, and a ninth caller arrives while the retry is loading. Never two loads at
    once, one state in the end, no lock left behind."""
    labels_csv = write_label_table(tmp_path / "labels.csv", n=200)
    service, caller = in_process_party_b(
        load_label_table(labels_csv, id_column="id", label_column="y", feature_columns=None),
        tmp_path / "b.sqlite",
    )
    scenario = SCENARIOS["femnist-fedlite"]
    spec = scenario.run_create("reloaded", steps=10, seed=0)
    run = service.runs.create(caller, spec)
    service.alignment.align(caller, run.id, hashed_ids(run.alignment_key, read_ids(labels_csv)))
    real_load = service.loader  # a cache of its own: the run is only in the database
    active, peak, calls = [0], [0], [0]
    guard = threading.Lock()
    everyone_waiting = threading.Barrier(8)

    def load(caller_: object, run_id: str) -> object:
        with guard:
            active[0] += 1
            calls[0] += 1
            first = calls[0] == 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.3)  # the others queue up meanwhile
            if first:
                raise ProblemError.run_state("simulated: the database was busy")
            return real_load(caller_, run_id)  # type: ignore[arg-type]
        finally:
            with guard:
                active[0] -= 1

    cache = RunCache(load, Metrics())  # type: ignore[arg-type]
    results: list[object] = []

    def ask() -> None:
        everyone_waiting.wait(10)
        try:
            results.append(cache.owned(caller, run.id))
        except ProblemError as exc:
            results.append(exc)

    def late() -> None:
        time.sleep(0.45)  # after the first load failed, while the retry loads
        results.append(cache.owned(caller, run.id))

    threads = [threading.Thread(target=ask) for _ in range(8)] + [threading.Thread(target=late)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    states = {id(r) for r in results if not isinstance(r, ProblemError)}
    failures = [r for r in results if isinstance(r, ProblemError)]
    assert len(results) == 9 and len(failures) == 1 and len(states) == 1
    assert peak[0] == 1 and calls[0] == 2
    assert cache._loading == {}  # noqa: SLF001
