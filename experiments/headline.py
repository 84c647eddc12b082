"""The paper's FEMNIST headline, measured: SplitFed against FedLite at q = 1152, L = 2 (490x in
the paper's accounting) over the seeds of the ``femnist_headline`` sweep.

    python -m experiments.headline      # docs/figures/headline_femnist.{png,md}

The paper's bar is FedLite within 5 % (relative) of SplitFed's accuracy. The table gives, at
every evaluation step, each seed's pair and the relative drop of the seed-mean accuracies,
``1 - mean(FedLite) / mean(SplitFed)``, plus the spread over seeds of the per-seed drops, so
that a reader can tell a drop from seed noise.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.figures import FIGURES, _records, _save, _write_table  # noqa: E402

__all__ = ["headline_curves", "relative_drops"]

SWEEP = "femnist_headline"


def _curves(records: list[dict[str, Any]]) -> dict[str, dict[int, dict[int, float]]]:
    """method -> seed -> {step: eval accuracy}."""
    curves: dict[str, dict[int, dict[int, float]]] = defaultdict(dict)
    for r in records:
        c = r["config"]
        curves[c["method"]][c["seed"]] = {
            p["step"]: p["eval_accuracy"] for p in r["curve"] if "eval_accuracy" in p
        }
    return curves


def relative_drops(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per evaluation step both methods reached for every seed both ran: the seed means, the
    relative drop of the means, and each seed's own drop (FedLite seed s against SplitFed
    seed s: same data order and initialisation)."""
    curves = _curves(records)
    seeds = sorted(set(curves.get("splitfed", {})) & set(curves.get("fedlite", {})))
    if not seeds:
        return []
    steps = sorted(
        set.intersection(*(set(curves[m][s]) for m in ("splitfed", "fedlite") for s in seeds))
    )
    rows = []
    for step in steps:
        split = [curves["splitfed"][s][step] for s in seeds]
        fed = [curves["fedlite"][s][step] for s in seeds]
        per_seed = [1 - f / b for f, b in zip(fed, split, strict=True)]
        rows.append(
            {
                "step": step,
                "seeds": seeds,
                "splitfed": split,
                "fedlite": fed,
                "drop": 1 - statistics.fmean(fed) / statistics.fmean(split),
                "drop_per_seed": per_seed,
            }
        )
    return rows


def headline_curves() -> None:
    records = _records(SWEEP)
    rows = relative_drops(records)
    if not rows:
        raise SystemExit(f"{SWEEP}: no seed with both a SplitFed and a FedLite record yet")
    lam = next(r["config"]["lam"] for r in records if r["config"]["method"] == "fedlite")
    seeds = rows[0]["seeds"]
    lines = [
        f"Seeds {', '.join(map(str, seeds))}; FedLite q=1152 L=2 R=1, lambda={lam:g} "
        "(paper units); accuracy on the held-out 10 %, quantized as trained.",
        "",
        "| step | SplitFed (per seed) | FedLite (per seed) | relative drop of the means "
        "| per-seed drops |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        fmt = ", ".join
        lines.append(
            f"| {row['step']} | {fmt(f'{v:.4f}' for v in row['splitfed'])} | "
            f"{fmt(f'{v:.4f}' for v in row['fedlite'])} | **{100 * row['drop']:.1f} %** | "
            f"{fmt(f'{100 * d:.1f} %' for d in row['drop_per_seed'])} |"
        )
    _write_table("headline_femnist", lines)

    fig, (acc, drop) = plt.subplots(1, 2, figsize=(10, 3.8))
    curves = _curves(records)
    for method, style in (("splitfed", "-"), ("fedlite", "--")):
        for seed, curve in sorted(curves[method].items()):
            steps = sorted(curve)
            label = f"{'SplitFed' if method == 'splitfed' else 'FedLite 490x'} seed {seed}"
            acc.plot(steps, [curve[s] for s in steps], style, label=label)
    acc.set_xlabel("step")
    acc.set_ylabel("held-out accuracy")
    acc.legend(fontsize=7)
    drop.plot([r["step"] for r in rows], [100 * r["drop"] for r in rows], "o-", label="means")
    drop.axhline(5, color="grey", linestyle=":", label="paper's bar (5 %)")
    drop.set_xlabel("step")
    drop.set_ylabel("relative accuracy drop (%)")
    drop.legend(fontsize=7)
    fig.suptitle("FEMNIST headline: SplitFed vs FedLite at q=1152, L=2")
    _save(fig, "headline_femnist")
    print(f"figures in {FIGURES}")


if __name__ == "__main__":
    headline_curves()
