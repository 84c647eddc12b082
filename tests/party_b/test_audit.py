"""Party B's audit trail answers "who scored how many of our ids, when": one row and one
structured log line per run creation, alignment, evaluation, prediction, finish and
deletion (and per call refused for its scope), read back with ``fedlite-b audit``.
"""

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from party_b.api import create_app
from party_b.audit import AUDIT_LOGGER
from party_b.ops.logs import JsonFormatter
from party_b.settings import Settings
from tests.utils.cli import run_cli
from tests.utils.live import live_server
from tests.utils.small_runs import MSGPACK, TOKEN, aligned_run, labels_csv


@pytest.fixture
def party_b(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    data_dir = tmp_path / "b"
    settings = Settings(
        data_dir=data_dir, labels=labels_csv(tmp_path / "l.csv"), tokens=f"t:{TOKEN}"
    )
    with live_server(create_app(settings)) as url:
        yield url, data_dir


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def test_every_run_event_is_one_row_and_one_structured_line(
    party_b: tuple[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    url, data_dir = party_b
    issued = run_cli(
        "b", "token", "issue", "--name", "scorer", "--scope", "predict", "--runs-of", "t",
        "--data-dir", str(data_dir),
    )  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    with _client(url, TOKEN) as trainer, _client(url, issued.stdout.strip()) as scorer:
        run = aligned_run(trainer)
        assert trainer.post(
            f"/v1/runs/{run.id}/evaluate", content=run.evaluate_body(), headers=MSGPACK
        ).is_success
        assert trainer.post(
            f"/v1/runs/{run.id}/predict", content=run.predict_body(4), headers=MSGPACK
        ).is_success
        assert trainer.post(f"/v1/runs/{run.id}/finish").is_success
        for _ in range(2):
            answer = scorer.post(
                f"/v1/runs/{run.id}/predict", content=run.predict_body(3), headers=MSGPACK
            )
            assert answer.is_success
        assert (
            scorer.post(f"/v1/runs/{run.id}/steps", content=b"", headers=MSGPACK).status_code == 403
        )
        assert trainer.delete(f"/v1/runs/{run.id}").status_code == 204

    ran = run_cli("b", "audit", "--jsonl", "--data-dir", str(data_dir))
    assert ran.returncode == 0, ran.stderr
    events = [json.loads(line) for line in ran.stdout.splitlines()]
    got = [(e["action"], e["actor"], e["run"], e["ids"], e["outcome"]) for e in events]
    assert got == [
        ("create-run", "t", run.id, None, "ok"),
        ("align", "t", run.id, 32, "ok"),
        ("evaluate", "t", run.id, 8, "ok"),
        ("predict", "t", run.id, 4, "ok"),
        ("finish", "t", run.id, None, "ok"),
        ("predict", "scorer", run.id, 3, "ok"),
        ("predict", "scorer", run.id, 3, "ok"),
        ("step", "scorer", run.id, None, "refused"),
        ("delete", "t", run.id, None, "ok"),  # the trail outlives the run
    ]
    assert all(e["at"].endswith("Z") for e in events)
    assert events[2]["split"] == "eval"

    # the log: one line per event, key=value in text, the same fields as JSON members
    lines = [r for r in caplog.records if r.name == AUDIT_LOGGER]
    assert len(lines) == len(events)
    assert (
        lines[5].getMessage() == f"audit action=predict actor=scorer run={run.id} ids=3 outcome=ok"
    )
    as_json = json.loads(JsonFormatter().format(lines[5]))
    assert (as_json["action"], as_json["actor"], as_json["ids"]) == ("predict", "scorer", 3)

    totals = run_cli("b", "audit", "--totals", "--action", "predict", "--data-dir", str(data_dir))
    rows = [line.split("\t") for line in totals.stdout.splitlines()]
    assert [r[:5] for r in rows] == [
        ["scorer", "-", "predict", "2 calls", "6 ids"],
        ["t", "-", "predict", "1 calls", "4 ids"],
    ]
    mine = run_cli("b", "audit", "--actor", "scorer", "--run", run.id, "--data-dir", str(data_dir))
    assert len(mine.stdout.splitlines()) == 3
    later = run_cli("b", "audit", "--since", "2999-01-01", "--data-dir", str(data_dir))
    assert later.returncode == 0 and later.stdout == ""


def test_audit_refuses_a_bad_time_in_one_line(party_b: tuple[str, Path]) -> None:
    _url, data_dir = party_b
    ran = run_cli("b", "audit", "--since", "last tuesday", "--data-dir", str(data_dir))
    assert ran.returncode == 2 and "--since 'last tuesday'" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


def test_the_operators_deletion_is_in_the_trail(party_b: tuple[str, Path]) -> None:
    url, data_dir = party_b
    with _client(url, TOKEN) as trainer:
        run = aligned_run(trainer)
    deleted = run_cli("b", "runs", "delete", run.id, "--data-dir", str(data_dir))
    assert deleted.returncode == 0, deleted.stderr

    trail = run_cli("b", "audit", "--run", run.id, "--jsonl", "--data-dir", str(data_dir))
    actions = [(e["action"], e["actor"]) for e in map(json.loads, trail.stdout.splitlines())]
    assert actions == [
        ("create-run", "t"),
        ("align", "t"),
        ("delete", "operator (fedlite-b runs delete)"),
    ]
