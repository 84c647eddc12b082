"""A bank's whole table (issue 34's first "done when"): FATE's default_credit pair (30,000 ids
each side, ../shared/data), ``fedlite-b serve`` and ``fedlite-a`` as processes with their
default settings. After a short run, ``fedlite-a predict --ids-file`` of all 30,000 ids exits 0
and writes 30,000 scores, one per id in the file's order, each a probability row; before,
the 30,000 ids went as one request and party B refused it (400 ``exceeds
max_array_len(16384)``). Time and memory: ``python -m benchmarks.scoring``."""

import csv
import gzip
import shutil
from pathlib import Path

import pytest

from tests.utils.cli import run_cli
from tests.utils.data import shared_data
from tests.utils.servers import ALICE, PartyBProcess

CONFIG = """\
[run]
name = "credit"
model = "tabular_mlp"
steps = 20
batch_size = 256
checkpoint_interval = 10
eval_fraction = 0.2

[model.bottom]
hidden = [32]
cut_dim = 16

[model.top]
hidden = [16]

[quantizer]
mode = "pq"
q = 4
L = 4
"""


def _unzipped(source: Path, target: Path) -> Path:
    with gzip.open(source, "rb") as packed, target.open("wb") as plain:
        shutil.copyfileobj(packed, plain)
    return target


@pytest.mark.timeout(900)
def test_every_id_of_default_credit_is_scored_by_predict_ids_file(tmp_path: Path) -> None:
    # Prepare: the pair, party B serving the guest half, a run trained on the host half
    pair = shared_data("fate_hetero")
    labels = _unzipped(pair / "default_credit_hetero_guest.csv.gz", tmp_path / "labels.csv")
    features = _unzipped(pair / "default_credit_hetero_host.csv.gz", tmp_path / "features.csv")
    with features.open(newline="") as table:
        ids = [row["id"] for row in csv.DictReader(table)]
    (tmp_path / "ids.txt").write_text("".join(f"{i}\n" for i in ids))
    (tmp_path / "run.toml").write_text(CONFIG)
    party_b = PartyBProcess(tmp_path / "b", labels, {"alice": ALICE})
    party_b.start()
    try:
        session = [
            "--server", party_b.url, "--features", str(features),
            "--state-dir", str(tmp_path / "a"),
        ]  # fmt: skip
        trained = run_cli(
            "a", "train", *session, "--config", str(tmp_path / "run.toml"),
            env={"FEDLITE_A_TOKEN": ALICE}, process=True, timeout=600,
        )  # fmt: skip
        assert trained.returncode == 0, trained.stderr

        # Execute
        scored = run_cli(
            "a", "predict", *session, "--name", "credit", "--ids-file", str(tmp_path / "ids.txt"),
            "--out", str(tmp_path / "scores.csv"),
            env={"FEDLITE_A_TOKEN": ALICE}, process=True, timeout=600,
        )  # fmt: skip
    finally:
        party_b.stop()

    # Assert
    assert scored.returncode == 0, scored.stderr
    assert "scoring 30,000 ids, at most 16,384 a request" in scored.stderr
    with (tmp_path / "scores.csv").open(newline="") as written:
        rows = list(csv.reader(written))
    assert rows[0] == ["id", "score_0", "score_1"]
    assert len(ids) == 30_000 and [r[0] for r in rows[1:]] == ids
    sums = [float(r[1]) + float(r[2]) for r in rows[1:]]
    assert all(abs(total - 1) < 1e-5 for total in sums)
