"""Render benchmarks/results/leakage.json into the generated section of docs/PRIVACY.md.

    python -m benchmarks.leakage.report     # rewrites the section, and the curve's figure

Only the part between ``<!-- BEGIN GENERATED -->`` and ``<!-- END GENERATED -->`` changes;
the prose around it is written by hand. tests/benchmarks/test_leakage.py checks that the section is
what this module renders from the JSON now, so the doc and the JSON cannot disagree.
"""

import json
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT

DOC = ROOT / "docs" / "PRIVACY.md"
FIGURE = ROOT / "docs" / "figures" / "privacy_utility.png"
BEGIN, END = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"
ATTACKS = ("norm", "direction", "principal")
TARGET_LEAK, TARGET_COST = 0.6, 0.01  # issue 16, on default_credit
FAMILIES = ("marvell", "noise")  # one-parameter defences drawn as curves


def load(path: Path = RESULTS / "leakage.json") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _by_run(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(task, downlink, defence) -> {attack: record}, in the JSON's order."""
    runs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in records:
        runs.setdefault((r["task"], r["downlink"], r["defence"]), {})[r["attack"]] = r
    return runs


def _pm(record: dict[str, Any], field: str, digits: int, sign: bool = False) -> str:
    """mean ± sample sd (the sd only over several seeds)."""
    mean = f"{record[field]:{'+' if sign else ''}.{digits}f}"
    if len(record["seeds"]) < 2:
        return mean
    return f"{mean} ± {record[field + '_sd']:.{digits}f}"


def table(doc: dict[str, Any]) -> list[str]:
    """One row per (task, downlink, defence): each attack's leak AUC, the best, the model."""
    lines = [
        "| task | downlink | defence (`FEDLITE_B_PRIVACY`) | seeds | "
        + " | ".join(f"{a}" for a in ATTACKS)
        + " | **leak AUC** (best) | model AUC | AUC cost | chance | reply shows |",
        "|---|---|---|---|" + "---|" * (len(ATTACKS) + 5),
    ]
    for (task, downlink, defence), attacks in _by_run(doc["records"]).items():
        best = attacks["best"]
        shown = ["loss"] if best["reply_loss_visible"] else []
        shown += [m for m in best["reply_metrics"] if m != "n"]
        name = f"`{defence}`" + (f" (`{best['policy']}`)" if defence == "recommended" else "")
        lines.append(
            f"| {task} | {downlink} | {name} | {len(best['seeds'])} | "
            + " | ".join(f"{attacks[a]['leak_auc']:.3f}" for a in ATTACKS)
            + f" | **{_pm(best, 'leak_auc', 3)}** | {_pm(best, 'model_auc', 4)} | "
            f"{_pm(best, 'auc_cost', 4, sign=True)} | {best['chance_auc']:.3f} | "
            f"{', '.join(shown) or '–'} |"
        )
    return lines


def verdict(doc: dict[str, Any]) -> list[str]:
    """The issue's target, checked on the recommended setting of every default_credit run."""
    lines = []
    for (task, downlink, defence), attacks in _by_run(doc["records"]).items():
        if task != "default_credit" or defence != "recommended":
            continue
        best = attacks["best"]
        met = best["leak_auc"] <= TARGET_LEAK and best["auc_cost"] <= TARGET_COST
        lines.append(
            f"- default_credit, {downlink} downlink, `recommended` (`{best['policy']}`), "
            f"{len(best['seeds'])} seeds of {best['steps']} steps: leak AUC "
            f"{_pm(best, 'leak_auc', 3)} (target ≤ {TARGET_LEAK}), model AUC cost "
            f"{_pm(best, 'auc_cost', 4, sign=True)} (target ≤ {TARGET_COST}): "
            f"**{'met' if met else 'not met'}** (on the means)."
        )
    return lines


def curve_points(doc: dict[str, Any], task: str, family: str) -> list[tuple[float, dict[str, Any]]]:
    """(scale, best record) of the float32 runs whose defence is ``family=<scale>`` alone,
    with the undefended run at scale 0."""
    points = []
    for (t, downlink, defence), attacks in _by_run(doc["records"]).items():
        if t != task or downlink != "float32":
            continue
        parts = dict(p.split("=", 1) for p in defence.split(",") if "=" in p)
        if defence == "off":
            points.append((0.0, attacks["best"]))
        elif list(parts) == [family]:
            points.append((float(parts[family]), attacks["best"]))
    return sorted(points, key=lambda p: p[0])


def curves(doc: dict[str, Any]) -> list[str]:
    lines = []
    for task in dict.fromkeys(r["task"] for r in doc["records"]):
        lines += [
            "",
            f"Privacy-utility curve, {task}, float32 downlink (scale 0 = undefended; "
            "`marvell`: budget s in units of ‖m₁ − m₀‖²; `noise`: in units of the batch's "
            "largest row norm):",
            "",
            "| defence | scale | seeds | leak AUC | model AUC | AUC cost |",
            "|---|---|---|---|---|---|",
        ]
        for family in FAMILIES:
            for scale, best in curve_points(doc, task, family):
                lines.append(
                    f"| {family} | {scale:g} | {len(best['seeds'])} | "
                    f"{_pm(best, 'leak_auc', 3)} | {_pm(best, 'model_auc', 4)} | "
                    f"{_pm(best, 'auc_cost', 4, sign=True)} |"
                )
    return lines


def learning_curves(doc: dict[str, Any]) -> list[str]:
    """Held-out AUC along the runs that recorded it, mean over seeds, one table per task."""
    rows: dict[str, list[tuple[str, list[int], list[float]]]] = {}
    for (task, downlink, defence), attacks in _by_run(doc["records"]).items():
        per_seed = [c for c in attacks["best"]["auc_curves"].values() if len(c) > 1]
        if per_seed:
            steps = [s for s, _ in per_seed[0]]
            means = [sum(c[i][1] for c in per_seed) / len(per_seed) for i in range(len(steps))]
            rows.setdefault(task, []).append((f"{downlink}, `{defence}`", steps, means))
    lines = []
    for task, runs in rows.items():
        steps = runs[0][1]
        lines += [
            "",
            f"Held-out model AUC along training, {task} (mean over seeds; the last column is "
            "the model AUC above):",
            "",
            "| run / step | " + " | ".join(map(str, steps)) + " |",
            "|---|" + "---|" * len(steps),
        ]
        lines += [f"| {name} | " + " | ".join(f"{m:.4f}" for m in means) + " |"
                  for name, _, means in runs]  # fmt: skip
    return lines


def render(doc: dict[str, Any]) -> str:
    runs = len({(r["task"], r["downlink"], r["defence"], r["seed"]) for r in doc["runs"]})
    lines = [
        f"*{runs} training runs on {doc['machine']['cpus']} shared CPUs, from "
        + "; ".join(
            f"`{i['command']}` ({i['when']}, {i['runs']} runs in {i['seconds'] / 60:.0f} min, "
            f"load average {i['loadavg_before'][0]:.1f} → {i['loadavg_after'][0]:.1f})"
            for i in doc["invocations"]
        )
        + "; rendered by `python -m benchmarks.leakage.report`. Mean ± sample standard "
        "deviation over seeds.*",
        "",
        *verdict(doc),
        "",
        *table(doc),
        *curves(doc),
        *learning_curves(doc),
    ]
    return "\n".join(lines)


def figure(doc: dict[str, Any]) -> None:
    """Leak AUC against model AUC cost, one line per noise family and task (docs/figures/)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in doc["records"]))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for family, marker in zip(FAMILIES, "os", strict=True):
            points = curve_points(doc, task, family)
            if len(points) > 1:
                ax.errorbar(
                    [p[1]["leak_auc"] for p in points],
                    [p[1]["auc_cost"] for p in points],
                    xerr=[p[1]["leak_auc_sd"] for p in points],
                    yerr=[p[1]["auc_cost_sd"] for p in points],
                    marker=marker,
                    capsize=2,
                    label=family,
                )
                for scale, best in points:
                    ax.annotate(f"{scale:g}", (best["leak_auc"], best["auc_cost"]), fontsize=7,
                                xytext=(3, 3), textcoords="offset points")  # fmt: skip
        rec = _by_run(doc["records"]).get((task, "float32", "recommended"))
        if rec is not None:
            best = rec["best"]
            ax.errorbar([best["leak_auc"]], [best["auc_cost"]], xerr=[best["leak_auc_sd"]],
                        yerr=[best["auc_cost_sd"]], marker="*", markersize=11, capsize=2,
                        linestyle="none", color="black",
                        label=f"recommended ({best['policy']})")  # fmt: skip
        ax.axvline(TARGET_LEAK, color="grey", linestyle=":", linewidth=1)
        ax.axhline(TARGET_COST, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("leak AUC (best attack, best sign per batch)")
        ax.set_ylabel("model AUC cost (vs undefended, same seed)")
        ax.set_title(f"{task}: privacy-utility, float32 downlink")
        ax.legend()
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=120)
    plt.close(fig)


def main() -> None:
    doc = load()
    text = DOC.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + render(doc) + "\n" + text[stop:])
    figure(doc)
    print(f"rewrote the generated section of {DOC} and {FIGURE}")


if __name__ == "__main__":
    main()
