"""benchmarks/results/tables.json as the tables of docs/RESULTS.md and docs/PERFORMANCE.md.

    python -m benchmarks.tables.report     # rewrites RESULTS.md's generated credit table

``benchmarks.report`` renders ``preparation_table`` into PERFORMANCE.md with the other
measurements.
"""

import json
from typing import Any

from benchmarks.common import RESULTS, ROOT, load_note

__all__ = ["BEGIN", "DOC", "END", "credit_table", "load", "preparation_table", "render"]

DOC = ROOT / "docs" / "RESULTS.md"
BEGIN, END = "<!-- BEGIN GENERATED tables -->", "<!-- END GENERATED tables -->"


def load() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((RESULTS / "tables.json").read_text())
    return doc


def credit_table(doc: dict[str, Any]) -> list[str]:
    """Held-out AUC per seed: the product against the centralized baselines."""
    credit = doc["credit"]
    summary = credit["summary"]
    lines = [
        f"*{load_note(credit)}; `{credit['command']}`; {credit['rows']:,} applicants, AUC of "
        f"P({credit['positive_class']!r})*",
        "",
        "| seed | FedLite-VFL, raw columns | logistic regression, all columns | "
        "LightGBM, all columns | product's bottom inputs | baselines' inputs |",
        "|---|---|---|---|---|---|",
    ]
    for r in credit["records"]:
        lines.append(
            f"| {r['seed']} | {r['auc']:.4f} | {r['logistic_auc']:.4f} | "
            f"{r['lightgbm_auc']:.4f} | {r['bottom_inputs']} | {r['central_inputs']} |"
        )
    mean = {k: summary[k] for k in ("auc", "logistic_auc", "lightgbm_auc")}
    lines.append(
        "| mean ± sd | "
        + " | ".join(f"**{v['mean']:.4f}** ± {v['stdev']:.4f}" for v in mean.values())
        + " | | |"
    )
    verdict = "met" if summary["target_met"] else "not met"
    better = max(("logistic regression", "logistic_auc"), ("LightGBM", "lightgbm_auc"),
                 key=lambda b: summary[b[1]]["mean"])[0]  # fmt: skip
    where = "below" if summary["gap"] >= 0 else "above"
    lines += [
        "",
        f"The product's mean AUC is {abs(summary['gap']):.4f} {where} the better baseline's "
        f"({better}, {summary['best_baseline']:.4f}): the target, within 0.02 of it, is "
        f"**{verdict}**.",
    ]
    return lines


def preparation_table(doc: dict[str, Any]) -> list[str]:
    """The 1,000,000-row preparation: seconds per phase and the peak memory."""
    if "big" not in doc:
        return ["*not measured yet: `python -m benchmarks.tables big`*"]
    big = doc["big"]
    table, prepared, whole = big["table"], big["prepare"], big["pandas_read_parquet"]
    return [
        f"*{load_note(big)}; `{big['command']}`*",
        "",
        f"A Parquet file of {table['rows']:,} rows × {table['columns']} columns "
        f"({table['number_columns']} numbers, {table['categorical_columns']} categorical; "
        f"{table['file_mb']:,} MB on disk), prepared by party A's own path in a fresh process:",
        "",
        "| phase | seconds |",
        "|---|---|",
        f"| read, a batch of 65,536 rows at a time (`load_features`) | {prepared['read_s']} |",
        f"| fit on 80 % of the rows (`FeatureTransform.fit`) | {prepared['fit_s']} |",
        f"| apply to every row (`FeatureTransform.apply`) | {prepared['apply_s']} |",
        f"| **total** | **{prepared['total_s']}** |",
        "",
        "| memory (MB) | party A's preparation | `pandas.read_parquet` of the whole file |",
        "|---|---|---|",
        f"| peak resident (`ru_maxrss`) | **{prepared['peak_rss_mb']:,}** | "
        f"{whole['peak_rss_mb']:,} (read alone, {whole['read_s']} s) |",
        f"| of which the interpreter and imports | {prepared['rss_after_imports_mb']:,} | "
        f"{whole['rss_after_imports_mb']:,} |",
        f"| the numbers as read (float32) | {prepared['table_float32_mb']:,} | "
        f"{whole['frame_mb']:,} (the frame) |",
        f"| the prepared matrix ({prepared['prepared_columns']} columns, float32) | "
        f"{prepared['prepared_mb']:,} | – |",
    ]


def render(doc: dict[str, Any]) -> str:
    return "\n".join(credit_table(doc))


def main() -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + BEGIN + "\n" + render(load()) + "\n" + END + tail)
    print(f"updated {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
