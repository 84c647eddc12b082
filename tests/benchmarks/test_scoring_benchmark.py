"""The scoring benchmark (``benchmarks.scoring``): its synthetic table is what it says (ids
shared by both parties, labels for the first rows only, the rest empty: customers party B
serves but cannot train on), and its table in docs/PERFORMANCE.md shows every measured case
as the committed JSON has it."""

import json
from pathlib import Path

import pandas as pd

from benchmarks.common import RESULTS
from benchmarks.scoring import scoring_table, synthetic


def test_the_synthetic_table_labels_only_its_history(tmp_path: Path) -> None:
    features, labels = synthetic(tmp_path, 1000, labeled=300)

    a = pd.read_csv(features, dtype={"id": str})
    b = pd.read_csv(labels, dtype={"id": str})
    assert list(a["id"]) == list(b["id"]) and a["id"].is_unique and len(a) == 1000
    assert list(a.columns[1:]) == [f"f{j}" for j in range(10)]
    assert b["y"].notna().sum() == 300 and b["y"].iloc[:300].notna().all()
    assert set(b["y"].dropna().astype(int)) == {0, 1}


def test_the_table_shows_every_case_of_the_committed_result() -> None:
    doc = json.loads((RESULTS / "scoring.json").read_text())

    rows = [line for line in scoring_table(doc) if line.startswith("| ") and "---" not in line]

    assert len(rows) == 1 + len(doc["cases"])
    for row, case in zip(rows[1:], doc["cases"], strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0] == case["table"]
        assert cells[1] == cells[2] == f"{case['ids']:,}"  # every id scored
        assert cells[5] == f"{case['party_a_peak_rss_mb']:,}"
