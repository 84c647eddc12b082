"""Render benchmarks/results/leakage.json into the generated section of docs/PRIVACY.md.

    python -m benchmarks.leakage.report     # rewrites the section, and the curve's figure

Only the part between ``<!-- BEGIN GENERATED -->`` and ``<!-- END GENERATED -->`` changes;
the prose around it is written by hand. tests/test_leakage.py checks that the section is
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


def load(path: Path = RESULTS / "leakage.json") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _by_run(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(task, downlink, defence) -> {attack: record}, in the JSON's order."""
    runs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in records:
        runs.setdefault((r["task"], r["downlink"], r["defence"]), {})[r["attack"]] = r
    return runs


def _cost(best: dict[str, Any]) -> float:
    return float(best["model_auc_undefended"] - best["model_auc"])


def table(doc: dict[str, Any]) -> list[str]:
    """One row per (task, downlink, defence): each attack's leak AUC, the best, the model."""
    lines = [
        "| task | downlink | defence (`FEDLITE_B_PRIVACY`) | "
        + " | ".join(f"{a} AUC" for a in ATTACKS)
        + " | **leak AUC** (best) | model AUC | AUC cost | chance | step reply shows |",
        "|---|---|---|" + "---|" * (len(ATTACKS) + 5),
    ]
    for (task, downlink, defence), attacks in _by_run(doc["records"]).items():
        best = attacks["best"]
        shown = ["loss"] if best["reply_loss_visible"] else []
        shown += [m for m in best["reply_metrics"] if m != "n"]
        lines.append(
            f"| {task} | {downlink} | `{defence}` | "
            + " | ".join(f"{attacks[a]['leak_auc']:.3f}" for a in ATTACKS)
            + f" | **{best['leak_auc']:.3f}** | {best['model_auc']:.4f} | "
            f"{_cost(best):+.4f} | {best['chance_auc']:.3f} | {', '.join(shown) or '–'} |"
        )
    return lines


def verdict(doc: dict[str, Any]) -> list[str]:
    """The issue's target, checked on the recommended setting of every default_credit run."""
    lines = []
    for (task, downlink, defence), attacks in _by_run(doc["records"]).items():
        if task != "default_credit" or defence != "recommended":
            continue
        best = attacks["best"]
        met = best["leak_auc"] <= TARGET_LEAK and _cost(best) <= TARGET_COST
        lines.append(
            f"- default_credit, {downlink} downlink, `recommended`: leak AUC "
            f"{best['leak_auc']:.3f} (target ≤ {TARGET_LEAK}), model AUC cost "
            f"{_cost(best):+.4f} (target ≤ {TARGET_COST}): **{'met' if met else 'not met'}**."
        )
    return lines


def curve_points(doc: dict[str, Any], task: str, family: str) -> list[tuple[float, float, float]]:
    """(scale, leak AUC, model AUC) of the float32 runs whose defence is ``family=<scale>``
    alone (``noise`` or ``directional``), with the undefended run at scale 0."""
    points = []
    for (t, downlink, defence), attacks in _by_run(doc["records"]).items():
        if t != task or downlink != "float32":
            continue
        best = attacks["best"]
        if defence == "off":
            points.append((0.0, best["leak_auc"], best["model_auc"]))
        parts = dict(p.split("=", 1) for p in defence.split(",") if "=" in p)
        if list(parts) in ([family], [family, "directions"]):
            points.append((float(parts[family]), best["leak_auc"], best["model_auc"]))
    return sorted(points)


def render(doc: dict[str, Any]) -> str:
    runs = len(_by_run(doc["records"]))
    lines = [
        f"*{doc['when']}, {runs} training runs in {doc['seconds'] / 60:.0f} min on "
        f"{doc['machine']['cpus']} shared CPUs (load average {doc['loadavg_before'][0]:.1f} → "
        f"{doc['loadavg_after'][0]:.1f}); `{doc['command']}`; rendered by "
        "`python -m benchmarks.leakage.report`.*",
        "",
        *verdict(doc),
        "",
        *table(doc),
        "",
        "Privacy-utility curve, default_credit, float32 downlink (scale 0 = undefended):",
        "",
        "| defence | scale | leak AUC | model AUC |",
        "|---|---|---|---|",
    ]
    for family in ("noise", "directional"):
        for scale, leak, model in curve_points(doc, "default_credit", family):
            lines.append(f"| {family} | {scale:g} | {leak:.3f} | {model:.4f} |")
    return "\n".join(lines)


def figure(doc: dict[str, Any]) -> None:
    """Leak AUC against model AUC, one line per noise family (docs/figures/)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for family, marker in (("noise", "o"), ("directional", "s")):
        points = curve_points(doc, "default_credit", family)
        if points:
            ax.plot([p[1] for p in points], [p[2] for p in points], marker=marker, label=family)
            for scale, leak, model in points:
                ax.annotate(f"{scale:g}", (leak, model), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")  # fmt: skip
    ax.axvline(TARGET_LEAK, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("leak AUC (best attack, best sign per batch)")
    ax.set_ylabel("model AUC (held out)")
    ax.set_title("default_credit: privacy-utility, float32 downlink")
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
