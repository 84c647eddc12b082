"""A run on a raw table (credit_data: text categories, empty cells) survives kill -9 of
``fedlite-a train`` bit-identically.

Party A is SIGKILLed three times at seeded random steps and simply run again; the run must end
as an uninterrupted one: the same held-out loss and AUC, the same bottom model (party A's last
checkpoint) and top model (party B's checksum), every step applied once. Its preparation --
the medians, indicators and vocabularies fitted on the training rows when the run was
aligned -- is read back from party A's state by every restart, never fitted again.
"""

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.tables.data import CreditTables, write_credit_tables
from party_a.store import LocalStore
from party_a.transport.http import HttpTransport
from shared.training import state_from_bytes, state_sha256
from tests.utils.crash import integrity
from tests.utils.servers import ALICE, REPO_ROOT, PartyBProcess

STEPS = 120


@pytest.fixture(scope="module")
def credit(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[PartyBProcess, CreditTables]]:
    root = tmp_path_factory.mktemp("tables-kill")
    tables = write_credit_tables(root / "data")
    # label privacy off: a killed run must end as an uninterrupted one, a run of its own
    server = PartyBProcess(
        root / "party_b", tables.labels, {"alice": ALICE},
        extra_args=["--label-column", "Status", "--privacy", "off"],
    )  # fmt: skip
    server.start()
    try:
        yield server, tables
    finally:
        server.stop()


def _command(url: str, tables: CreditTables, name: str, state: Path, summary: Path) -> list[str]:
    return [
        sys.executable, "-m", "party_a.cli", "train", "--server", url, "--token", ALICE,
        "--features", str(tables.features), "--config", str(REPO_ROOT / "examples" / "credit.toml"),
        "--name", name, "--steps", str(STEPS), "--checkpoint-interval", "10",
        "--state-dir", str(state), "--summary-json", str(summary),
    ]  # fmt: skip


def _bottom(state: Path, url: str, name: str) -> str:
    store = LocalStore.in_directory(state)
    try:
        local = store.find_run(url, name)
        assert local is not None
        last = store.load_checkpoint(local.id)
        assert last is not None and last.step == STEPS
        return state_sha256(state_from_bytes(last.model_state))
    finally:
        store.close()


def _wait_for_step(
    client: httpx.Client, name: str, at: int, process: subprocess.Popen[bytes]
) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        mine = [r for r in client.get("/v1/runs").json()["runs"] if r["name"] == name]
        if mine and mine[0]["step"] >= at or process.poll() is not None:
            return str(mine[0]["id"]) if mine else ""
        time.sleep(0.005)
    raise AssertionError(f"party A never reached step {at}")


def test_party_a_killed_on_a_raw_table_ends_like_an_uninterrupted_run(
    credit: tuple[PartyBProcess, CreditTables], tmp_path: Path
) -> None:
    party_b, tables = credit
    reference_summary = tmp_path / "reference.json"
    done = subprocess.run(
        _command(party_b.url, tables, "reference", tmp_path / "ref", reference_summary),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Home: categorical (text values)" in done.stderr  # it is the raw table
    expected: dict[str, Any] = json.loads(reference_summary.read_text())

    state, summary = tmp_path / "killed", tmp_path / "killed.json"
    command = _command(party_b.url, tables, "killed", state, summary)
    rng = random.Random(35)
    run_id = ""
    with httpx.Client(
        base_url=party_b.url, headers={"Authorization": f"Bearer {ALICE}"}, timeout=60
    ) as client:
        for at in sorted(rng.sample(range(10, STEPS - 20), 3)):
            process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            run_id = _wait_for_step(client, "killed", at, process) or run_id
            time.sleep(rng.uniform(0.0, 0.05))
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
            assert process.returncode == -signal.SIGKILL, f"party A ended before step {at}"
            assert integrity(state / "party_a.sqlite") == "ok"
        assert client.get(f"/v1/runs/{run_id}").json()["step"] < STEPS

        final = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert final.returncode == 0, final.stderr
        runs = {r["name"]: r["id"] for r in client.get("/v1/runs").json()["runs"]}
        top = {name: client.get(f"/v1/runs/{runs[name]}").json()["model_sha256"]
               for name in ("killed", "reference")}  # fmt: skip

    got: dict[str, Any] = json.loads(summary.read_text())
    assert got["last_step"] == STEPS
    assert got["eval_metrics"]["eval_loss"] == expected["eval_metrics"]["eval_loss"]
    assert got["eval_metrics"]["eval_auc"] == expected["eval_metrics"]["eval_auc"]
    assert top["killed"] == top["reference"]
    with HttpTransport(party_b.url, ALICE) as transport:
        assert [row["step"] for row in transport.step_log(run_id)] == list(range(1, STEPS + 1))
    assert _bottom(state, party_b.url, "killed") == _bottom(tmp_path / "ref", party_b.url,
                                                           "reference")  # fmt: skip
