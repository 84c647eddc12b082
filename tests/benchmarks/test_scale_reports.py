"""The tables of party B's scaling benchmarks agree with their JSON: runs in memory under a
bound, replicas under locust (docs/PERFORMANCE.md), failover (docs/RELIABILITY.md) and
checkpoint sizes (docs/DEPLOY.md), each rendered from the committed result."""

import json
from typing import Any

from benchmarks.common import RESULTS
from benchmarks.scale import checkpoints, failover
from benchmarks.scale.report import memory_bounded_table, replicas_table


def _result(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())
    return loaded


def test_the_bounded_memory_table_shows_every_measured_rss() -> None:
    doc = _result("memory-bounded")
    rows = [
        line for line in memory_bounded_table(doc) if line.startswith("| ") and "|---" not in line
    ]
    assert len(rows) == 1 + len(doc["rss_bounded"])  # header + one row per open run
    last_free, last_capped = doc["rss_unbounded"][-1], doc["rss_bounded"][-1]
    assert rows[-1] == (
        f"| {last_free['open_runs']} | {last_free['rss_kib'] / 1024:,.0f} "
        f"| {last_capped['rss_kib'] / 1024:,.0f} |"
    )


def test_the_replicas_table_has_a_row_per_replica_count_with_its_failures() -> None:
    doc = _result("replicas")
    rows = [line for line in replicas_table(doc) if line.startswith("| ") and "|---" not in line]
    assert [row.split("|")[1].strip() for row in rows[1:]] == [
        str(r["replicas"]) for r in doc["rows"]
    ]
    assert all(
        row.split("|")[-2].strip() == str(r["failures"])
        for row, r in zip(rows[1:], doc["rows"], strict=True)
    )


def test_the_failover_and_checkpoint_tables_are_what_the_docs_hold() -> None:
    for module, name in ((failover, "failover"), (checkpoints, "checkpoints")):
        rendered = "\n".join(module.table(_result(name)))
        text = module.DOC.read_text()
        generated = text.split(module.BEGIN, 1)[1].split(module.END, 1)[0].strip()
        assert generated == rendered, name
