"""Scoring new samples and serving from the exports, with real processes: ``fedlite-b serve``
over HTTP and the two CLIs as a user runs them, on the bundled demo data.

* party B's table holds new customers with an empty label: they are never trained on, yet
  ``fedlite-a predict`` scores them from a serving table that holds none of the training
  rows (columns in another order), with the transform fitted on the training rows;
* a new customer's score from ``predict`` is the same alone and inside the batch (for any
  id and random batches: tests/party_a/test_inference.py, in process);
* ``fedlite-a export`` and ``fedlite-b export`` write the two halves; loaded in fresh
  processes (examples/serve_export.py) they reproduce the service's scores.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from party_a.store import LocalStore
from shared.alignment import hmac_ids
from tests.utils.cli import DEMO_CONFIG, REPO_ROOT, TOKEN, demo_tables, run_cli
from tests.utils.servers import PartyBProcess

NEW = 25  # customers party B holds without a label, and party A only in its serving table


def _scores(text: str) -> dict[str, np.ndarray]:
    rows = list(csv.reader(text.strip().splitlines()))
    return {r[0]: np.array([float(v) for v in r[1:]]) for r in rows[1:]}


@pytest.mark.timeout(900)  # eight CLI processes, each importing torch: 271 s for ten at load 12
def test_new_customers_are_scored_and_the_exports_reproduce_the_service(tmp_path: Path) -> None:
    features, labels = demo_tables(tmp_path)
    a, b = pd.read_csv(features, dtype={"id": str}), pd.read_csv(labels, dtype={"id": str})
    new = sorted(a["id"])[-NEW:]
    b.loc[b["id"].isin(new), "y"] = None  # new customers: features, no label
    b.to_csv(labels, index=False)
    training = tmp_path / "training.csv"
    a[~a["id"].isin(new)].to_csv(training, index=False)
    known = sorted(a["id"])[:3]
    serving = tmp_path / "serving.csv"  # independent of the training table
    a[a["id"].isin([*new, *known])][["id", *a.columns[1:][::-1]]].to_csv(serving, index=False)

    party_b = PartyBProcess(tmp_path / "b", labels, {"alice": TOKEN})
    party_b.start()
    try:
        state = str(tmp_path / "a-state")
        connect = ["--server", party_b.url, "--token", TOKEN, "--state-dir", state]
        train = run_cli(
            "a", "train", *connect, "--features", str(training), "--config", str(DEMO_CONFIG),
            "--steps", "12", timeout=300,
        )  # fmt: skip
        assert train.returncode == 0, train.stderr
        ids = [*new, *known]
        scored = run_cli(
            "a", "predict", *connect, "--name", "breast-demo", "--features", str(serving),
            "--ids", ",".join(ids),
        )  # fmt: skip
        assert scored.returncode == 0, scored.stderr
        # which probability each column is: party B's classes as its table holds them (pandas
        # wrote the labels 0.0 and 1.0 once a cell was emptied above)
        said = "scores: score_0 = '0.0', score_1 = '1.0' (positive class: '1.0')"
        assert said in scored.stderr, scored.stderr
        batch = _scores(scored.stdout)
        assert list(batch) == ids
        # one CLI process per id costs a torch import: the new customer stands for all ids
        # here; any id in random batches is tests/party_a/test_inference.py's property (in process)
        alone = run_cli(
            "a", "predict", *connect, "--name", "breast-demo", "--features", str(serving),
            "--ids", new[0],
        )  # fmt: skip
        assert alone.returncode == 0, alone.stderr
        np.testing.assert_allclose(_scores(alone.stdout)[new[0]], batch[new[0]], atol=2e-6)

        # the new customers were not trained on: party B aligned the labeled rows only
        store = LocalStore.in_directory(Path(state))  # `fedlite-a runs`: test_party_a_cli.py
        local = store.find_run(party_b.url, "breast-demo")
        store.close()
        assert local is not None
        run_id = local.remote_id
        a_export, b_export = tmp_path / "a-export", tmp_path / "b-export"
        exported_a = run_cli("a", "export", "--name", "breast-demo", "--state-dir", state,
                             "--out", str(a_export))  # fmt: skip
        exported_b = run_cli("b", "export", "--run", run_id, "--data-dir", str(tmp_path / "b"),
                             "--labels", str(labels), "--out", str(b_export))  # fmt: skip
        assert exported_a.returncode == 0, exported_a.stderr
        assert exported_b.returncode == 0, exported_b.stderr
        again = run_cli("a", "export", "--name", "breast-demo", "--state-dir", state,
                        "--out", str(a_export))  # fmt: skip
        assert again.returncode == 2 and "not an empty directory" in again.stderr
    finally:
        party_b.stop()

    # serving from the exports, party B stopped, each half in a fresh process
    manifest_a = json.loads((a_export / "manifest.json").read_text())
    assert manifest_a["transform"]["columns"] == list(a.columns[1:])
    assert (a_export / "codebook.npy").stat().st_mode & 0o777 == 0o600
    activations, out = tmp_path / "activations.npz", tmp_path / "scores.csv"
    script = str(REPO_ROOT / "examples" / "serve_export.py")
    for argv in (
        ["party-a", "--export", str(a_export), "--features", str(serving),
         "--out", str(activations)],
        ["party-b", "--export", str(b_export), "--activations", str(activations),
         "--table", str(labels), "--out", str(out)],
    ):  # fmt: skip
        done = run_python(script, *argv)
        assert done.returncode == 0, done.stderr
    served = _scores(out.read_text())
    key = bytes.fromhex(manifest_a["alignment_key"])
    serving_ids = pd.read_csv(serving, dtype={"id": str})["id"].tolist()
    for raw_id, hashed in zip(serving_ids, hmac_ids(key, serving_ids), strict=True):
        np.testing.assert_allclose(served[hashed.hex()], batch[raw_id], atol=2e-6)


def run_python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter that finds this source tree as an installed one."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, timeout=120, env=env
    )
