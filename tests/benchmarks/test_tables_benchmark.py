"""benchmarks.tables: its measurement runs the product's own path, its verdict is computed
from the records, and the documents show what tables.json holds."""

from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.tables import big, credit
from benchmarks.tables import report as tables_report


def test_the_big_table_is_prepared_by_party_as_own_path(tmp_path: Path) -> None:
    path = tmp_path / "big.parquet"
    shape = big.write_table(path, rows=3_000)
    assert (shape["rows"], shape["columns"]) == (3_000, 100)

    measured = big.child_prepare(path)  # in this process here: the numbers, not the memory

    # 84 numbers, 8 of them with empty cells (indicators), 16 categorical code columns
    assert measured["prepared_columns"] == 84 + 8 + 16
    assert len(measured["categories"]) == 16
    assert max(measured["categories"]) <= 1000 + 3  # the id-like columns: capped, pooled


def test_the_verdict_is_the_mean_gap_to_the_better_baseline() -> None:
    records = [
        {"auc": 0.84, "logistic_auc": 0.84, "lightgbm_auc": 0.86},
        {"auc": 0.85, "logistic_auc": 0.84, "lightgbm_auc": 0.86},
    ]
    summary = credit.summarize(records)
    assert summary["best_baseline"] == pytest.approx(0.86)
    assert summary["gap"] == pytest.approx(0.015) and summary["target_met"]
    records[0]["auc"] = 0.80
    assert not credit.summarize(records)["target_met"]


def test_the_documents_show_what_tables_json_holds() -> None:
    doc = tables_report.load()
    text = tables_report.DOC.read_text()
    section = text[text.index(tables_report.BEGIN) + len(tables_report.BEGIN) :]
    section = section[: section.index(tables_report.END)]
    assert section.strip() == tables_report.render(doc).strip(), (
        "docs/RESULTS.md is stale: run python -m benchmarks.tables.report"
    )
    assert "\n".join(tables_report.preparation_table(doc)) in report.DOC.read_text(), (
        "docs/PERFORMANCE.md is stale: run python -m benchmarks.report"
    )
    assert doc["credit"]["summary"]["target_met"]
    assert len(doc["credit"]["records"]) == 5
