"""What a run id tells someone who does not own it: nothing a missing id would not.

Another token's run, loaded in memory or not, and an id that names no run at all take the
same path through party B: the same database statements, in the same order, and the same
404. (Timing follows the path; benchmarks/run_ids.py measures it over HTTP.)
"""

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

from party_b.errors import ProblemError
from party_b.service import Caller, Service
from tests.utils.small_runs import SmallRun, aligned_in_process, small_party_b


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    """Every SQL statement ``engine`` runs inside the block, in order."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _operations(run: SmallRun) -> dict[str, Callable[[Service, Caller, str], object]]:
    """Every run-scoped operation, with arguments that are valid for ``run``."""
    step, evaluate, predict = run.step_body(2), run.evaluate_body(), run.predict_body()
    ids = [k.hex() for k in run.aligned]
    return {
        "get_run": lambda s, c, i: s.runs.get(c, i),
        "align": lambda s, c, i: s.alignment.align(c, i, ids),
        "step": lambda s, c, i: s.steps.step(c, i, step),
        "resume": lambda s, c, i: s.steps.resume(c, i, 0),
        "evaluate": lambda s, c, i: s.serving.evaluate(c, i, evaluate),
        "predict": lambda s, c, i: s.serving.predict(c, i, predict),
        "step_log": lambda s, c, i: s.runs.step_log(c, i, 0, 10),
        "eval_results": lambda s, c, i: s.runs.eval_results(c, i),
        "finish": lambda s, c, i: s.runs.finish(c, i),
    }


def _refusal(call: Callable[[], object]) -> tuple[int, str]:
    with pytest.raises(ProblemError) as refused:
        call()
    return refused.value.status, str(refused.value.type)


def test_another_tokens_run_takes_the_same_path_as_an_unknown_id(tmp_path: Path) -> None:
    party_b = small_party_b(tmp_path)
    service = party_b.service()
    loaded = aligned_in_process(service, party_b.caller, name="loaded")
    service.steps.step(party_b.caller, loaded.id, loaded.step_body(1))  # in memory now
    unloaded = aligned_in_process(party_b.service(), party_b.caller, name="unloaded")
    engine = party_b.sessions.kw["bind"]

    for name, operation in _operations(loaded).items():
        paths = {}
        for label, run_id in [
            ("loaded", loaded.id),
            ("unloaded", unloaded.id),
            ("unknown", uuid.uuid4().hex),
        ]:
            with statements(engine) as seen:
                outcome = _refusal(lambda: operation(service, party_b.other, run_id))  # noqa: B023
            paths[label] = (outcome, seen)
        assert paths["loaded"] == paths["unknown"] == paths["unloaded"], name
        assert paths["unknown"][0] == (404, "urn:fedlite:problem:not-found"), name

    # the owner's run went on untouched: step 2 is still the next one
    assert service.runs.get(party_b.caller, loaded.id).step == 1
