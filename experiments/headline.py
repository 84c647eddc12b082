"""The paper's FEMNIST headline, measured: SplitFed against FedLite at q = 1152, L = 2 (490x in
the paper's accounting) over the seeds of the ``femnist_headline`` sweep.

    python -m experiments.headline      # docs/figures/headline_femnist.{png,md}

The paper's bar is FedLite within 5 % (relative) of SplitFed's accuracy. The table gives, at
every evaluation step, each seed's pair and the relative drop of the seed-mean accuracies,
``1 - mean(FedLite) / mean(SplitFed)``, plus the spread over seeds of the per-seed drops, so
that a reader can tell a drop from seed noise.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.records import FIGURES, records_of, save_figure, write_table  # noqa: E402
from experiments.sweep import RESULTS  # noqa: E402

__all__ = ["downlink_table", "headline_curves", "lambda_column", "relative_drops"]

SWEEP = "femnist_headline"
LAMBDA_STEP = 1000  # the grid's length: the lambda column is compared at this step


def _curves(
    records: list[dict[str, Any]], metric: str = "eval_accuracy"
) -> dict[str, dict[int, dict[int, float]]]:
    """method -> seed -> {step: held-out ``metric``}."""
    curves: dict[str, dict[int, dict[int, float]]] = defaultdict(dict)
    for r in records:
        c = r["config"]
        curves[c["method"]][c["seed"]] = {p["step"]: p[metric] for p in r["curve"] if metric in p}
    return curves


def relative_drops(
    records: list[dict[str, Any]], metric: str = "eval_accuracy"
) -> list[dict[str, Any]]:
    """Per evaluation step both methods reached for every seed both ran: the seed means of
    ``metric``, the relative drop of the means, and each seed's own drop (FedLite seed s
    against SplitFed seed s: same data order and initialisation)."""
    curves = _curves(records, metric)
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
    records = records_of(SWEEP)
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
    write_table("headline_femnist", lines)

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
    save_figure(fig, "headline_femnist")
    print(f"figures in {FIGURES}")


def _at(record: dict[str, Any], step: int) -> float | None:
    return next(
        (p["eval_accuracy"] for p in record["curve"] if p["step"] == step and "eval_accuracy" in p),
        None,
    )


def lambda_column() -> None:
    """Accuracy at step 1,000 of q = 1152, L = 2 for every lambda that ran, seed 0, against
    SplitFed seed 0 at the same step. The grid's own runs (1,000 steps) come first: they ran
    with one code version; where the grid has none, the headline runs (2,000 steps, same
    configuration otherwise) give their step-1,000 evaluation, which is that run on their
    version: nothing in a run depends on its total length."""
    headline = records_of(SWEEP)
    grid = records_of("femnist") if (RESULTS / "femnist").exists() else []
    seed0 = [r for r in grid + headline if r["config"]["seed"] == 0]
    base = next(
        (a for r in seed0 if r["config"]["method"] == "splitfed" and (a := _at(r, LAMBDA_STEP))),
        None,
    )
    if base is None:
        raise SystemExit("no SplitFed seed-0 evaluation at step 1,000 yet")
    by_lam: dict[float, tuple[float, str]] = {}
    for r in seed0:
        c = r["config"]
        if c["method"] == "fedlite" and (c["q"], c["L"], c["R"]) == (1152, 2, 1):
            if (acc := _at(r, LAMBDA_STEP)) is not None:
                by_lam.setdefault(c["lam"], (acc, r["key"]))
    lines = [
        f"SplitFed seed 0 at step {LAMBDA_STEP}: {base:.4f}.",
        "",
        "| lambda (paper units) | accuracy at step 1,000 | relative drop | record |",
        "|---|---|---|---|",
    ]
    for lam, (acc, key) in sorted(by_lam.items()):
        lines.append(f"| {lam:g} | {acc:.4f} | {100 * (1 - acc / base):.1f} % | `{key}` |")
    write_table("lambda_femnist", lines)


# SplitFed's FEMNIST step both ways, measured on the wire by `python -m benchmarks.traffic`
# (its runs keep wire_bytes_received; the headline runs predate that count)
SPLITFED_TRAFFIC = (
    Path(__file__).resolve().parents[1]
    / "benchmarks/results/traffic-runs/femnist-splitfed-lr0.1-s0-T150.json"
)


def downlink_table() -> None:
    """The ``femnist_downlink`` runs (headline FedLite, seed 0, a compressed downlink) against
    SplitFed seed 0 of the headline pair: measured bytes per step both ways and accuracy."""
    runs = records_of("femnist_downlink") if (RESULTS / "femnist_downlink").exists() else []
    if not runs:
        raise SystemExit("no femnist_downlink records yet")
    headline = [r for r in records_of(SWEEP) if r["config"]["seed"] == 0]
    base = next(r for r in headline if r["config"]["method"] == "splitfed")
    plain = next(r for r in headline if r["config"]["method"] == "fedlite")
    sf = json.loads(SPLITFED_TRAFFIC.read_text())
    sf_total = (sf["wire_bytes"] + sf["wire_bytes_received"]) / sf["steps"]
    base_acc = base["final"]["eval_accuracy"]
    lines = [
        f"SplitFed seed 0 after {base['steps']} steps: {base_acc:.4f}; SplitFed's step both ways: "
        f"{sf_total:,.0f} B (measured over the {sf['steps']} steps of `benchmarks.traffic`).",
        "",
        "| downlink | uplink B/step | downlink B/step | less than SplitFed, both ways | accuracy "
        "| relative drop |",
        "|---|---|---|---|---|---|",
        f"| float32 (the paper's) | {plain['wire_bytes'] / plain['steps']:,.0f} | "
        f"not counted in that run | - | {plain['final']['eval_accuracy']:.4f} | "
        f"{100 * (1 - plain['final']['eval_accuracy'] / base_acc):.1f} % |",
    ]
    for r in runs:
        up, down = r["wire_bytes"] / r["steps"], r["wire_bytes_received"] / r["steps"]
        acc = r["final"]["eval_accuracy"]
        lines.append(
            f"| {r['config']['downlink']} | {up:,.0f} | {down:,.0f} | "
            f"**{sf_total / (up + down):.1f}×** | {acc:.4f} | {100 * (1 - acc / base_acc):.1f} % |"
        )
    write_table("downlink_femnist", lines)


if __name__ == "__main__":
    headline_curves()
    lambda_column()
    if (RESULTS / "femnist_downlink").exists():
        downlink_table()
