"""The experiments' records as the figures and tables read them, and where those are written.

``records_of(sweep)`` loads a sweep's records in the paper's units (and, for FEMNIST, the
grid points read off the headline pair's longer runs); ``save_figure`` and ``write_table``
write into docs/figures/. Shared by ``experiments.figures`` and ``experiments.headline``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.sweep import RESULTS, load_records  # noqa: E402
from experiments.sweeps import FEMNIST  # noqa: E402

__all__ = [
    "FIGURES",
    "in_paper_units",
    "one_per_run",
    "prefix_record",
    "records_of",
    "save_figure",
    "write_table",
]

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"


def records_of(sweep: str) -> list[dict[str, Any]]:
    directory = RESULTS / sweep
    if not directory.exists():
        raise SystemExit(f"no results in {directory}: run `python -m experiments.sweep {sweep}`")
    records = [in_paper_units(r) for r in one_per_run(load_records(directory))]
    if sweep == "femnist":
        records += headline_prefixes({r["key"] for r in records})
    return records


def one_per_run(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per run, the longest: a long run cut at a GPU batch's deadline and run
    again to a later one leaves two records (keys ``-T<steps>``) with the same ``cut_from``;
    the longer holds the shorter's whole history (``prefix_record``), and keeping both would
    count the run twice in every seed mean."""
    runs: dict[str, dict[str, Any]] = {}
    for record in records:
        run = record.get("cut_from") or record["key"]
        if run not in runs or record.get("steps", 0) > runs[run].get("steps", 0):
            runs[run] = record
    return list(runs.values())


def prefix_record(record: dict[str, Any], steps: int) -> dict[str, Any]:
    """``record``'s run as it stood after ``steps`` steps: the record a run of that length
    would have written. Nothing in a run depends on its length (the schedule, the rates and
    the evaluations are the same; tests/experiments/test_experiments.py checks it), so the first
    ``steps`` of a longer run are that shorter run; ``prefix_of`` names the longer one."""
    row = next((r for r in record["curve"] if r["step"] == steps), None)
    if row is None:
        raise ValueError(f"{record['key']} has no evaluation at step {steps}")
    config = {**record["config"], "steps": steps}
    key = record["key"].replace(f"-T{record['config']['steps']}", f"-T{steps}")
    final = {k: v for k, v in row.items() if k.startswith("eval_")}
    return {
        **record,
        "key": key,
        "config": config,
        "final": final,
        "curve": [r for r in record["curve"] if r["step"] <= steps],
        "steps": steps,
        "seconds": None,
        "prefix_of": record["key"],
        # the curve's byte counts are cumulative: the totals at ``steps``
        **{k: row[k] for k in ("wire_bytes", "wire_raw_bytes") if k in row},
    }


def headline_prefixes(have: set[str]) -> list[dict[str, Any]]:
    """The FEMNIST grid's SplitFed and headline points (seed 0, 1,000 steps) read off the
    headline pair's 2,000-step runs, where the grid has no record of its own."""
    directory = RESULTS / "femnist_headline"
    if not directory.exists():
        return []
    prefixes = [
        prefix_record(in_paper_units(r), FEMNIST.steps)
        for r in load_records(directory)
        if r["config"]["seed"] == FEMNIST.seed
    ]
    return [r for r in prefixes if r["key"] not in have]


def in_paper_units(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its lambda in the paper's units (shared.correction).

    Runs recorded before the convention changed (no ``lambda_units`` field) scaled the
    correction by 1/n, n the step's rows; the paper's units weight it by n_c/n, n_c the rows of
    one chunk (a client's batch, or the whole batch of a vertical run), so their lambda is
    ``lambda_old / n_c``. For the sequence task n was the step's counted tokens, a little
    below its rows: the conversion there is approximate (within the share of padding).
    """
    if record.get("lambda_units") == "paper" or not record["config"].get("lam"):
        return record
    config = dict(record["config"])
    rows_per_chunk = record["rows_per_step"] / (config.get("clients_per_step") or 1)
    config["lam"] = float(f"{config['lam'] / rows_per_chunk:.3g}")
    return {**record, "config": config, "lambda_units": "paper (converted)"}


def save_figure(fig: Any, name: str) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    path = FIGURES / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def write_table(name: str, lines: list[str]) -> None:
    path = FIGURES / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
