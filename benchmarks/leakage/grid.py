"""The leakage benchmark's grid: which runs, each run's records, and the records over seeds.

In its own module so that the worker processes (one per (task, seed), spawned) can import it.
"""

import re
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.leakage.attacks import chance_auc, leak_auc, score_batches
from benchmarks.leakage.runs import LeakRun, Recorded, train_recorded
from party_b.privacy import parse_policy

__all__ = ["BASE", "GRID", "SEEDS", "aggregate", "grid", "order", "records_of", "seed_records"]

# The product's settings per task: the breast demo (examples/breast.toml) and the FATE
# default_credit setting of the vertical sweep (600 steps: its held-out AUC has settled by
# then, see the learning curves of docs/PRIVACY.md; breast's by step 150).
BASE = {
    "breast": LeakRun(task="breast", steps=200, batch_size=32, q=8, L=4),
    "default_credit": LeakRun(task="default_credit", steps=600, batch_size=256, q=8, L=16),
}
SEEDS = (0, 1, 2)  # party A's seed (model, batches); party B's noise has its own secret
HEADLINE_SEEDS = (0, 1, 2, 3, 4, 5)  # the recommended setting and its reference: the verdict
CURVE_POINTS = 6  # held-out evaluations along the off and recommended runs
MARVELL_CURVE = (2.0, 4.0, 8.0, 16.0, 32.0)
PREVIOUS = "metrics=loss,max_norm=true,directional=1.5,directions=2"  # recommended until now


@dataclass(frozen=True)
class Entry:
    """One setting of the grid: a downlink representation, a defence, the seeds it runs."""

    downlink: str
    defence: str
    seeds: tuple[int, ...] = SEEDS


GRID: tuple[Entry, ...] = (
    Entry("float32", "off", HEADLINE_SEEDS),
    Entry("float32", "max_norm=true"),
    Entry("float32", "noise=4"),
    Entry("float32", PREVIOUS),
    *(Entry("float32", f"marvell={s:g}") for s in MARVELL_CURVE),
    Entry("float32", "label_epsilon=1", (0,)),
    Entry("float32", "recommended", HEADLINE_SEEDS),
    # Does compressing the downlink hide labels by itself? (branch downlink's
    # representations, undefended, one seed)
    *(Entry(downlink, "off", (0,)) for downlink in ("float16", "int2", "topk:k=4", "pq:q=8,L=4")),
)


def order(record: dict[str, Any]) -> tuple[int, int, int, str]:
    """Sort key of a run's record: task, its place in the grid, seed, attack."""
    place = {(e.downlink, e.defence): i for i, e in enumerate(GRID)}
    where = place.get((record["downlink"], record["defence"]), len(GRID))
    return (list(BASE).index(record["task"]), where, record["seed"], record["attack"])


def records_of(run: LeakRun, got: Recorded, undefended_auc: float) -> list[dict[str, Any]]:
    """One run's records: one per attack and one for the best of them."""
    scores = score_batches(got.grads)
    aucs = {name: leak_auc(s, got.labels) for name, s in scores.items()}
    aucs["best"] = max(aucs.values())
    common = {
        "task": run.task,
        "downlink": run.downlink,
        "defence": run.privacy,
        "policy": parse_policy(run.privacy).describe(),
        "seed": run.seed,
        "model_auc": got.model_auc,
        "model_auc_undefended": undefended_auc,
        "chance_auc": chance_auc(got.labels),
        "downlink_bytes_per_step": got.downlink_bytes / max(len(got.grads), 1),
        "reply_loss_visible": any(l == l for l in got.losses),  # noqa: E741 (NaN != NaN)
        "reply_metrics": sorted({k for m in got.metrics for k in m}),
        "auc_curve": got.auc_curve,
        "settings": asdict(run),
    }
    return [{**common, "attack": name, "leak_auc": auc} for name, auc in aucs.items()]


def grid(task: str, seed: int, smoke: bool, only: str | None) -> list[LeakRun]:
    """The task's runs for one seed, each downlink's "off" first (the others' reference);
    ``only``: a regular expression over "task/downlink/defence" (the references still run)."""
    base = replace(BASE[task], seed=seed)
    if smoke:
        base = replace(base, steps=10)
        return [base, replace(base, privacy="recommended")]
    chosen = [
        e
        for e in GRID
        if seed in e.seeds
        and (only is None or re.search(only, f"{task}/{e.downlink}/{e.defence}") is not None)
    ]
    needed = {e.downlink for e in chosen}
    runs = []
    for e in GRID:
        if seed in e.seeds and (e in chosen or (e.defence == "off" and e.downlink in needed)):
            curve = base.steps // CURVE_POINTS if e.defence in ("off", "recommended") else 0
            runs.append(replace(base, downlink=e.downlink, privacy=e.defence, eval_every=curve))
    return runs


def seed_records(
    task: str,
    seed: int,
    smoke: bool,
    only: str | None,
    workdir: Path,
    known: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Every run of one task and seed, in order (one process each: they share no state).
    ``known``: downlink -> held-out AUC of this task and seed's undefended run, measured
    before (``--merge``): such a reference is not run again unless ``only`` picks it (an
    undefended run has no random draws beyond the seed's: it gives the same model)."""
    torch.set_num_threads(1)  # tiny models on a shared machine: more threads only contend
    records: list[dict[str, Any]] = []
    undefended: dict[str, float] = dict(known or {})
    for run in grid(task, seed, smoke, only):
        picked = only is not None and re.search(only, f"{task}/{run.downlink}/off") is not None
        if run.privacy == "off" and run.downlink in undefended and not picked:
            continue
        t0 = time.perf_counter()
        got = train_recorded(run, workdir / f"{task}-s{seed}")
        if run.privacy == "off":
            undefended[run.downlink] = got.model_auc
        new = records_of(run, got, undefended[run.downlink])
        records += new
        print(
            f"{task:15s} s{seed} {run.downlink:11s} {run.privacy:40s} leak "
            f"{new[-1]['leak_auc']:.3f} model {got.model_auc:.4f} "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return records


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (task, downlink, defence, attack) over its seeds: means, sample standard
    deviations and the per-seed values; ``auc_cost`` pairs each seed with the undefended run
    of the same seed and downlink (same model initialisation and batches)."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["task"], r["downlink"], r["defence"], r["attack"]), []).append(r)
    out = []
    for (task, downlink, defence, attack), members in groups.items():
        members = sorted(members, key=lambda r: r["seed"])
        leak, leak_sd = _mean_sd([r["leak_auc"] for r in members])
        model, model_sd = _mean_sd([r["model_auc"] for r in members])
        costs = [r["model_auc_undefended"] - r["model_auc"] for r in members]
        cost, cost_sd = _mean_sd(costs)
        first = members[0]
        out.append(
            {
                "task": task,
                "downlink": downlink,
                "defence": defence,
                "attack": attack,
                "policy": first["policy"],
                "seeds": [r["seed"] for r in members],
                "steps": first["settings"]["steps"],
                "leak_auc": leak,
                "leak_auc_sd": leak_sd,
                "leak_auc_seeds": [r["leak_auc"] for r in members],
                "model_auc": model,
                "model_auc_sd": model_sd,
                "model_auc_seeds": [r["model_auc"] for r in members],
                "model_auc_undefended": statistics.fmean(
                    r["model_auc_undefended"] for r in members
                ),
                "model_auc_undefended_seeds": [r["model_auc_undefended"] for r in members],
                "auc_cost": cost,
                "auc_cost_sd": cost_sd,
                "chance_auc": statistics.fmean(r["chance_auc"] for r in members),
                "downlink_bytes_per_step": first["downlink_bytes_per_step"],
                "reply_loss_visible": first["reply_loss_visible"],
                "reply_metrics": first["reply_metrics"],
                "auc_curves": {str(r["seed"]): r["auc_curve"] for r in members},
            }
        )
    return out
