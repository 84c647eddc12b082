"""benchmarks/parties.py: a tiny real run of every case (N = 1 and 2, FedLite and SplitFed),
each party's bytes being its own messages' lengths; and the committed results agreeing with
the generated table of docs/PERFORMANCE.md."""

import json
from pathlib import Path

import pytest

from benchmarks import parties, report
from benchmarks.common import RESULTS
from tests.utils.data import shared_data

PERFORMANCE = Path(__file__).resolve().parents[2] / "docs" / "PERFORMANCE.md"


@pytest.mark.e2e  # fedlite-b serve as a child process, eight PSIs of 30,000 ids: .ci/run
def test_two_parties_send_half_the_rows_each_and_the_record_says_so(tmp_path: Path) -> None:
    shared_data("fate_hetero", "default_credit_hetero_guest.csv.gz")
    out = tmp_path / "parties.json"
    parties.main(
        [
            "--tasks",
            "default_credit",
            "--seeds",
            "0",
            "--steps",
            "default_credit=2",
            "--out",
            str(out),
        ]
    )

    doc = json.loads(out.read_text())
    runs = {(r["parties"], r["method"]): r for r in doc["records"]}
    assert set(runs) == {(1, "fedlite"), (2, "fedlite"), (1, "splitfed"), (2, "splitfed")}
    one, two = runs[(1, "splitfed")], runs[(2, "splitfed")]
    assert set(one["bytes_per_step"]) == {"all"} and set(two["bytes_per_step"]) == {"left", "right"}
    # raw float32 of 256 rows: d = 32 for the one party, d = 16 for each of the two
    assert 256 * 32 * 4 < one["up_per_step"] < 256 * 32 * 4 + 200
    for party in ("left", "right"):
        assert 256 * 16 * 4 < two["bytes_per_step"][party]["up_per_step"] < 256 * 16 * 4 + 200
        assert 256 * 16 * 4 < two["bytes_per_step"][party]["down_per_step"] < 256 * 16 * 4 + 200
    assert runs[(2, "fedlite")]["up_per_step"] < two["up_per_step"] / 10  # PQ: far fewer bytes
    assert all(0 < r["value"] <= 1 for r in doc["records"])
    assert doc["target"]["gap"] == runs[(2, "fedlite")]["value"] - runs[(1, "fedlite")]["value"]


def test_the_committed_results_are_the_table_in_the_performance_document() -> None:
    doc = json.loads((RESULTS / "parties.json").read_text())
    table = "\n".join(report.parties_table(doc))
    assert table in PERFORMANCE.read_text()
    assert {s["task"] for s in doc["summary"]} == {"default_credit", "femnist"}
    assert doc["target"]["met"] and doc["target"]["gap"] >= -parties.TARGET_AUC_GAP
