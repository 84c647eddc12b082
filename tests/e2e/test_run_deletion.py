"""Runs can be listed, inspected and deleted from both CLIs and the API, with real processes
(``fedlite-b serve`` over HTTP, the CLIs as a user runs them, on the bundled demo data).

Deleting a run frees its place in ``max_runs_per_token`` and removes everything party B
stored for it (step log, checkpoints, evaluations); party A forgets it too.
"""

import json
import sqlite3
from pathlib import Path

import httpx

from tests.utils.cli import DEMO_CONFIG, TOKEN, demo_tables, run_cli
from tests.utils.servers import PartyBProcess

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _stored_rows(database: Path, run_id: str) -> int:
    """Rows party B holds for ``run_id`` in every table that refers to a run."""
    with sqlite3.connect(database) as db:
        tables = ("runs", "step_log", "checkpoints", "eval_results", "idempotency_keys")
        return sum(
            db.execute(
                f"SELECT count(*) FROM {t} WHERE {'id' if t == 'runs' else 'run_id'} = ?",
                (run_id,),
            ).fetchone()[0]
            for t in tables
        )


def test_runs_are_listed_shown_and_deleted_from_both_clis_and_the_api(tmp_path: Path) -> None:
    features, labels = demo_tables(tmp_path)
    party_b = PartyBProcess(
        tmp_path / "b", labels, {"alice": TOKEN}, env={"FEDLITE_B_LIMIT_MAX_RUNS_PER_TOKEN": "1"}
    )
    party_b.start()
    state = str(tmp_path / "a-state")
    connect = ["--server", party_b.url, "--token", TOKEN, "--state-dir", state]

    def train(name: str) -> int:
        ran = run_cli(
            "a", "train", *connect, "--features", str(features), "--config", str(DEMO_CONFIG),
            "--name", name, "--steps", "2", "--no-finish", "--no-evaluate", timeout=300,
        )  # fmt: skip
        assert ran.returncode in (0, 1), ran.stderr
        return ran.returncode

    try:
        assert train("first") == 0
        refused = run_cli(
            "a", "train", *connect, "--features", str(features), "--config", str(DEMO_CONFIG),
            "--name", "second", "--steps", "2", "--no-finish", timeout=300,
        )  # fmt: skip
        assert refused.returncode == 1 and "finish or delete one first" in refused.stderr

        shown = run_cli("a", "show", *connect, "--name", "first")
        assert shown.returncode == 0, shown.stderr
        first = json.loads(shown.stdout)
        first_id = first["party_b"]["id"]
        assert first["party_b"]["status"] == "training" and first["party_a"]["checkpoints"]
        assert _stored_rows(party_b.database, first_id) > 2

        deleted = run_cli("a", "delete", *connect, "--name", "first")
        assert deleted.returncode == 0, deleted.stderr
        assert httpx.get(f"{party_b.url}/v1/runs/{first_id}", headers=AUTH).status_code == 404
        assert _stored_rows(party_b.database, first_id) == 0
        assert "first" not in run_cli("a", "runs", "--state-dir", state).stdout
        again = run_cli("a", "delete", *connect, "--name", "first")
        assert again.returncode == 2 and "no run named 'first'" in again.stderr

        assert train("second") == 0  # the quota is free again
        listed = httpx.get(f"{party_b.url}/v1/runs", headers=AUTH).json()["runs"]
        assert [r["name"] for r in listed] == ["second"]
        second_id = listed[0]["id"]
        gone = httpx.delete(f"{party_b.url}/v1/runs/{second_id}", headers=AUTH)
        assert gone.status_code == 204 and _stored_rows(party_b.database, second_id) == 0
        twice = httpx.delete(f"{party_b.url}/v1/runs/{second_id}", headers=AUTH)
        assert twice.status_code == 404
        assert twice.headers["content-type"] == "application/problem+json"
        assert httpx.delete(f"{party_b.url}/v1/runs/{second_id}").status_code == 401

        assert train("third") == 0
        third_id = httpx.get(f"{party_b.url}/v1/runs", headers=AUTH).json()["runs"][0]["id"]
    finally:
        party_b.stop()

    # the operator, party B stopped
    data = ["--data-dir", str(tmp_path / "b")]
    listed_b = run_cli("b", "runs", "list", *data)
    assert listed_b.returncode == 0 and listed_b.stdout.startswith(f"{third_id}\tthird\talice\t")
    shown_b = run_cli("b", "runs", "show", third_id, *data)
    assert shown_b.returncode == 0 and json.loads(shown_b.stdout)["steps_logged"] == 2
    assert run_cli("b", "runs", "delete", third_id, *data).returncode == 0
    assert _stored_rows(party_b.database, third_id) == 0
    assert run_cli("b", "runs", "list", *data).stdout == ""
    unknown = run_cli("b", "runs", "delete", third_id, *data)
    assert unknown.returncode == 1 and unknown.stderr.count("\n") == 1
    assert "no run" in unknown.stderr
    missing = run_cli("b", "runs", "list", "--data-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 1 and "no database at" in missing.stderr
