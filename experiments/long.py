"""The runs at the paper's length (the ``*_long`` sweeps, trained on a GPU by
``experiments.gpu_batch``): when SplitFed plateaus, and FedLite against it there.

    python -m experiments.long      # docs/figures/headline_femnist_long.{png,md}, long_runs.md

Each long run is cut at the GPU batch's deadline, so runs reach different steps; every
comparison here is made at the last evaluation all compared runs reached (their prefixes,
``records.prefix_record``: nothing in a run depends on its length).

**Plateau** (``plateau_step``): SplitFed has plateaued at step t when the mean of its
seed-mean held-out metric over the ``PLATEAU_EVALS`` evaluations ending at t is less than
``PLATEAU_GAIN`` (relative) above the same mean ``PLATEAU_WINDOW`` steps earlier; the plateau
step is the first such t (experiments.sweeps states the numbers: 5 evaluations, 1,000 steps,
0.5 %). The paper's bar is FedLite within 5 % (relative) of SplitFed; it is read at the last
common step, with the plateau step beside it to say whether SplitFed had stopped improving.
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
    "femnist_long_table",
    "long_runs_table",
    "plateau_step",
]

FEMNIST_LONG = "femnist_long"
OTHERS = {
    "so_tag_long": ("eval_recall_at_5", "Recall@5", 247),
    "so_tag_long_paper_rate": ("eval_recall_at_5", "Recall@5", 247),
    "shakespeare_long": ("eval_accuracy", "accuracy", 51),
}
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


def femnist_long_records() -> list[dict[str, Any]]:
    return records_of(FEMNIST_LONG) if (RESULTS / FEMNIST_LONG).exists() else []


def femnist_long_table() -> None:
    """Per learning rate: the plateau of SplitFed, and SplitFed against FedLite (q = 1152,
    L = 2) at every 1,000th step both reached for every seed, as in the headline table."""
    records = femnist_long_records()
    if not records:
        raise SystemExit(f"{FEMNIST_LONG}: no records yet (experiments.gpu_batch)")
    lines = [_summary_header()]
    detail: list[str] = []
    fig, (acc, drop) = plt.subplots(1, 2, figsize=(11, 4))
    for lr, runs in sorted(_by_rate(records).items(), reverse=True):
        rows = relative_drops(runs)
        if not rows:
            continue
        split = _seed_mean(
            [r for r in runs if r["config"]["method"] == "splitfed"], "eval_accuracy"
        )
        plateau = plateau_step(split)
        last = rows[-1]
        lam = next(r["config"]["lam"] for r in runs if r["config"]["method"] == "fedlite")
        lines.append(
            f"| {lr:.3g} | {', '.join(map(str, last['seeds']))} | {last['step']} | "
            f"{_plateau_text(plateau, max(split))} | {statistics.fmean(last['splitfed']):.4f} | "
            f"{statistics.fmean(last['fedlite']):.4f} | **{100 * last['drop']:.1f} %** | "
            f"{'yes' if last['drop'] <= 0.05 else 'no'} |"
        )
        detail += _step_rows(lr, lam, rows)
        acc.plot(list(split), list(split.values()), label=f"SplitFed lr {lr:.3g}")
        fed = _seed_mean([r for r in runs if r["config"]["method"] == "fedlite"], "eval_accuracy")
        acc.plot(list(fed), list(fed.values()), "--", label=f"FedLite 490x lr {lr:.3g}")
        drop.plot([r["step"] for r in rows], [100 * r["drop"] for r in rows], label=f"lr {lr:.3g}")
    lines += ["", *_detail_header(), *detail]
    write_table("headline_femnist_long", lines)
    acc.set_xlabel("step")
    acc.set_ylabel("held-out accuracy (seed mean)")
    acc.legend(fontsize=7)
    drop.axhline(5, color="grey", linestyle=":", label="paper's bar (5 %)")
    drop.set_xlabel("step")
    drop.set_ylabel("relative drop of the seed means (%)")
    drop.legend(fontsize=7)
    fig.suptitle("FEMNIST at length: SplitFed vs FedLite at q=1152, L=2, two learning rates")
    save_figure(fig, "headline_femnist_long")


def _summary_header() -> str:
    return (
        "| lr | seeds | last step all reached | SplitFed plateau (rule: experiments/long.py) "
        "| SplitFed | FedLite q=1152 L=2 | relative drop | within 5 %? |\n"
        "|---|---|---|---|---|---|---|---|"
    )


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


def _mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4f} ± {sd:.4f}"


def _plateau_text(plateau: int | None, last_step: int) -> str:
    return f"step {plateau}" if plateau is not None else f"not by step {last_step}"


def long_runs_table() -> None:
    """SO tags and next-token at length: SplitFed's plateau, and the FedLite point against
    SplitFed (same rate) at the last step both reached, beside the paper's claim."""
    lines = [
        "| task | run | last step both reached | SplitFed plateau | SplitFed | FedLite point "
        "| its metric | relative drop | paper |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for sweep, (metric, name, paper) in OTHERS.items():
        if not (RESULTS / sweep).exists():
            continue
        records = records_of(sweep)
        for lr, runs in sorted(_by_rate(records).items(), reverse=True):
            split = [r for r in runs if r["config"]["method"] == "splitfed"]
            fed = [r for r in runs if r["config"]["method"] == "fedlite"]
            if not split:
                continue
            curve = _seed_mean(split, metric)
            plateau = _plateau_text(plateau_step(curve), max(curve))
            points: list[dict[str, Any] | None] = [*fed] or [None]
            for point in points:
                pair = at_common_step([*split, *([point] if point else [])])
                base = statistics.fmean(r["final"][metric] for r in pair[: len(split)])
                row = f"| {sweep.removesuffix('_long')} ({name}) | lr {lr:.3g} | "
                row += f"{pair[0]['steps']} | {plateau} | {base:.4f} | "
                if point is None:
                    lines.append(row + "- | - | - | - |")
                    continue
                c, value = point["config"], pair[-1]["final"][metric]
                lines.append(
                    row + f"q={c['q']} L={c['L']} lambda={c['lam']:g} "
                    f"({point['paper_ratio']:.0f}x) | {value:.4f} | "
                    f"**{100 * (1 - value / base):.1f} %** | {paper}x |"
                )
    if len(lines) == 2:
        lines = [f"No long runs of {', '.join(OTHERS)} yet (experiments.gpu_batch)."]
    write_table("long_runs", lines)


def main() -> None:
    if femnist_long_records():
        femnist_long_table()
    long_runs_table()


if __name__ == "__main__":
    main()
