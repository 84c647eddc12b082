"""The runs at the paper's length (the ``*_long`` sweeps, trained on a GPU by
``experiments.gpu_batch``): when each method plateaus, and FedLite against SplitFed there.

    python -m experiments.long      # docs/figures/headline_long.md,
                                    # docs/figures/headline_femnist_long.{png,md}

Each long run is cut at the GPU batch's deadline, so runs reach different steps; every
comparison here is made at the last evaluation all compared runs reached (their prefixes,
``records.prefix_record``: nothing in a run depends on its length).

**Plateau** (``plateau_step``): a method has plateaued at step t when the mean of its
seed-mean held-out metric over the ``PLATEAU_EVALS`` evaluations ending at t is less than
``PLATEAU_GAIN`` (relative) above the same mean ``PLATEAU_WINDOW`` steps earlier; the plateau
step is the first such t (experiments.sweeps states the numbers: 5 evaluations, 1,000 steps,
0.5 %). SplitFed and FedLite are held to the same rule. The paper's bar is FedLite within
5 % (relative) of SplitFed; the drop is read at the last common step, and it is a verdict on
the paper's claim (``verdict``) only where both methods had plateaued by that step.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.headline import relative_drops  # noqa: E402
from experiments.records import prefix_record, records_of, save_figure, write_table  # noqa: E402
from experiments.sweep import RESULTS  # noqa: E402
from experiments.sweeps import (  # noqa: E402
    PLATEAU_EVALS,
    PLATEAU_GAIN,
    PLATEAU_WINDOW,
)

__all__ = [
    "at_common_step",
    "best_rate",
    "compare",
    "femnist_long_table",
    "headline_long_table",
    "plateau",
    "plateau_step",
    "verdict",
]

FEMNIST_LONG = "femnist_long"
# sweep: (metric, its name, the paper's claim for the FedLite point the sweep trains)
TASKS = {
    FEMNIST_LONG: ("eval_accuracy", "accuracy", "< 5 % at 490x"),
    "so_tag_long": ("eval_recall_at_5", "Recall@5", "< 5 % at 247x"),
    "so_tag_long_paper_rate": ("eval_recall_at_5", "Recall@5", "< 5 % at 247x"),
    "shakespeare_long": ("eval_accuracy", "accuracy", "< 5 % at 51x (SO NWP)"),
}
PAPER_BAR = 0.05  # the paper's bar: FedLite within 5 % (relative) of SplitFed
METHODS = {"splitfed": "SplitFed", "fedlite": "FedLite"}
TABLE_EVERY = 1000  # the step table shows every 1,000th step (and the last common one)


def plateau_step(
    curve: dict[int, float],
    *,
    evals: int = PLATEAU_EVALS,
    window: int = PLATEAU_WINDOW,
    gain: float = PLATEAU_GAIN,
) -> int | None:
    """The first step t of ``curve`` ({step: metric}) at which the mean of the ``evals``
    evaluations ending at t is less than ``gain`` (relative) above the mean of the ``evals``
    ending at t - ``window``; None if the curve never gets there."""
    steps = sorted(curve)
    for i in range(evals - 1, len(steps)):
        then = steps[i] - window
        if then not in curve:
            continue
        j = steps.index(then)
        if j < evals - 1:
            continue
        now_mean = statistics.fmean(curve[s] for s in steps[i - evals + 1 : i + 1])
        then_mean = statistics.fmean(curve[s] for s in steps[j - evals + 1 : j + 1])
        if now_mean < (1 + gain) * then_mean:
            return steps[i]
    return None


def at_common_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` as they stood at the last evaluated step all of them reached."""
    if not records:
        return []
    common = set.intersection(*({p["step"] for p in r["curve"]} for r in records))
    if not common:
        return []
    last = max(common)
    return [r if r["steps"] == last else prefix_record(r, last) for r in records]


def _seed_mean(records: list[dict[str, Any]], metric: str) -> dict[int, float]:
    """{step: mean over the records (seeds)} over the steps all of them evaluated."""
    curves = [{p["step"]: p[metric] for p in r["curve"] if metric in p} for r in records]
    steps = set.intersection(*(set(c) for c in curves)) if curves else set()
    return {s: statistics.fmean(c[s] for c in curves) for s in sorted(steps)}


def _by_rate(records: list[dict[str, Any]]) -> dict[float, list[dict[str, Any]]]:
    rates: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        rates[r["config"]["lr_bottom"]].append(r)
    return dict(rates)


def best_rate(records: list[dict[str, Any]], metric: str = "eval_accuracy") -> float | None:
    """The learning rate whose SplitFed runs (seed mean) score best at the last step all
    SplitFed runs reached: the paper tunes the rate for SplitFed and gives FedLite the same."""
    split = [r for r in records if r["config"]["method"] == "splitfed"]
    scores: defaultdict[float, list[float]] = defaultdict(list)
    for r in at_common_step(split):
        scores[r["config"]["lr_bottom"]].append(r["final"][metric])
    if not scores:
        return None
    return float(max(scores, key=lambda lr: statistics.fmean(scores[lr])))


def plateau(curve: dict[int, float]) -> dict[str, Any]:
    """Where ``curve`` ({step: seed-mean metric}) plateaus by ``plateau_step``: {"step": the
    plateau step or None, "last": its last step, "value": the metric at the plateau step, or
    at the last step where it has not plateaued}."""
    step, last = plateau_step(curve), max(curve)
    return {"step": step, "last": last, "value": curve[last if step is None else step]}


def verdict(drop: float, plateaus: dict[str, int | None], step: int, bar: float = PAPER_BAR) -> str:
    """The paper's claim (FedLite less than ``bar`` below SplitFed, relative) read off the
    ``drop`` at ``step``: reproduced or not, by how many points, where every method of
    ``plateaus`` ({name: plateau step or None}) had plateaued by ``step``; else not settled,
    saying which had not."""
    points = 100 * abs(drop - bar)
    side = "under" if drop < bar else "over"
    late = [
        f"{name} not plateaued" if at is None else f"{name} plateaus only at step {at}"
        for name, at in plateaus.items()
        if at is None or at > step
    ]
    if late:
        return (
            f"not settled at step {step}: {', '.join(late)} "
            f"({100 * drop:.1f} % there, {points:.1f} points {side} the bar)"
        )
    if drop < bar:
        return f"**reproduced**: {100 * drop:.1f} %, {points:.1f} points under the bar"
    return f"**not reproduced**: {100 * drop:.1f} %, {points:.1f} points over the bar"


def compare(runs: list[dict[str, Any]], metric: str) -> dict[str, Any] | None:
    """SplitFed against the FedLite point of ``runs`` (one rate) over the seeds that ran both:
    each method's ``plateau`` on its seed-mean curve, and the pair at every step all of them
    reached (``relative_drops``; "at" is the last); None without such a seed."""
    rows = relative_drops(runs, metric)
    if not rows:
        return None
    seeds = rows[0]["seeds"]
    plateaus = {}
    for method in METHODS:
        mine = [r for r in runs if r["config"]["method"] == method and r["config"]["seed"] in seeds]
        plateaus[method] = plateau(_seed_mean(mine, metric))
    return {"seeds": seeds, "rows": rows, "at": rows[-1], "plateau": plateaus}


def headline_long_table() -> None:
    """Per task and learning rate: each method's plateau and its metric there, the pair at
    the last step all runs reached, the relative drop with its per-seed drops, the paper's
    claim, and the verdict."""
    lines = [
        "| task | lr | seeds | FedLite point | SplitFed plateau: seed mean there "
        "| FedLite plateau: seed mean there | last common step | SplitFed there (mean ± sd) "
        "| FedLite there (mean ± sd) | relative drop of the means (per seed) | paper | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sweep, (metric, name, paper) in TASKS.items():
        if not (RESULTS / sweep).exists():
            continue
        task = f"{sweep.replace('_long', '')} ({name})"
        for lr, runs in sorted(_by_rate(records_of(sweep)).items(), reverse=True):
            *cells, judged = _headline_cells(runs, metric)
            lines.append("| " + " | ".join([task, f"{lr:.3g}", *cells, paper, judged]) + " |")
    if len(lines) == 2:
        lines = [f"No long runs of {', '.join(TASKS)} yet (experiments.gpu_batch)."]
    write_table("headline_long", lines)


def _headline_cells(runs: list[dict[str, Any]], metric: str) -> list[str]:
    """The row's cells from "seeds" to "relative drop", and the verdict (ending the row)."""
    found = compare(runs, metric)
    if found is None:  # SplitFed alone (a side check): its plateau only
        split = _seed_mean([r for r in runs if r["config"]["method"] == "splitfed"], metric)
        seeds = ", ".join(map(str, sorted({r["config"]["seed"] for r in runs})))
        return [seeds, "-", _plateau_text(plateau(split)), *["-"] * 6]
    at, fed = found["at"], next(r for r in runs if r["config"]["method"] == "fedlite")
    c = fed["config"]
    drops = ", ".join(f"{100 * d:.1f}" for d in at["drop_per_seed"])
    steps = {METHODS[m]: p["step"] for m, p in found["plateau"].items()}
    return [
        ", ".join(map(str, found["seeds"])),
        f"q={c['q']} L={c['L']} lambda={c['lam']:g} ({fed['paper_ratio']:.0f}x)",
        _plateau_text(found["plateau"]["splitfed"]),
        _plateau_text(found["plateau"]["fedlite"]),
        str(at["step"]),
        _mean_sd(at["splitfed"]),
        _mean_sd(at["fedlite"]),
        f"**{100 * at['drop']:.1f} %** ({drops} %)",
        verdict(at["drop"], steps, at["step"]),
    ]


def _plateau_text(reached: dict[str, Any]) -> str:
    if reached["step"] is None:
        return f"not by step {reached['last']} ({reached['value']:.4f} there)"
    return f"step {reached['step']}: {reached['value']:.4f}"


def _mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"


def femnist_long_records() -> list[dict[str, Any]]:
    return records_of(FEMNIST_LONG) if (RESULTS / FEMNIST_LONG).exists() else []


def femnist_long_table() -> None:
    """FEMNIST's pair (SplitFed; FedLite q = 1152, L = 2) per learning rate at every 1,000th
    step all runs reached (and the last), and its figure: the seed-mean curves with each
    method's plateau step marked, and the relative drop against the paper's bar."""
    records = femnist_long_records()
    if not records:
        raise SystemExit(f"{FEMNIST_LONG}: no records yet (experiments.gpu_batch)")
    lines = _detail_header()
    fig, (acc, drop) = plt.subplots(1, 2, figsize=(11, 4))
    for lr, runs in sorted(_by_rate(records).items(), reverse=True):
        found = compare(runs, "eval_accuracy")
        if found is None:
            continue
        lam = next(r["config"]["lam"] for r in runs if r["config"]["method"] == "fedlite")
        lines += _step_rows(lr, lam, found["rows"])
        for method, style in (("splitfed", "-"), ("fedlite", "--")):
            mine = [r for r in runs if r["config"]["method"] == method]
            curve = _seed_mean(mine, "eval_accuracy")
            name = "SplitFed" if method == "splitfed" else "FedLite 490x"
            (line,) = acc.plot(
                list(curve), list(curve.values()), style, label=f"{name} lr {lr:.3g}"
            )
            at = found["plateau"][method]["step"]
            if at is not None:
                acc.plot([at], [curve[at]], "o", color=line.get_color())
        rows = found["rows"]
        drop.plot([r["step"] for r in rows], [100 * r["drop"] for r in rows], label=f"lr {lr:.3g}")
    write_table("headline_femnist_long", lines)
    acc.set_xlabel("step")
    acc.set_ylabel("held-out accuracy (seed mean; dot: plateau)")
    acc.legend(fontsize=7)
    drop.axhline(100 * PAPER_BAR, color="grey", linestyle=":", label="paper's bar (5 %)")
    drop.set_xlabel("step")
    drop.set_ylabel("relative drop of the seed means (%)")
    drop.legend(fontsize=7)
    fig.suptitle("FEMNIST at length: SplitFed vs FedLite at q=1152, L=2, two learning rates")
    save_figure(fig, "headline_femnist_long")


def _detail_header() -> list[str]:
    return [
        "| lr | lambda | step | SplitFed (seed mean ± sd) | FedLite (seed mean ± sd) "
        "| relative drop of the means | per-seed drops |",
        "|---|---|---|---|---|---|---|",
    ]


def _step_rows(lr: float, lam: float, rows: list[dict[str, Any]]) -> list[str]:
    shown = [r for r in rows if r["step"] % TABLE_EVERY == 0]
    if not shown or shown[-1] is not rows[-1]:
        shown.append(rows[-1])
    out = []
    for row in shown:
        out.append(
            f"| {lr:.3g} | {lam:g} | {row['step']} | {_mean_sd(row['splitfed'])} | "
            f"{_mean_sd(row['fedlite'])} | **{100 * row['drop']:.1f} %** | "
            + ", ".join(f"{100 * d:.1f} %" for d in row["drop_per_seed"])
            + " |"
        )
    return out


def main() -> None:
    headline_long_table()
    if femnist_long_records():
        femnist_long_table()


if __name__ == "__main__":
    main()
