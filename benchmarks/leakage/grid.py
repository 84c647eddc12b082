"""The leakage benchmark's grid: which runs, each run's records, and the records over seeds.

In its own module so that the worker processes (one per (task, seed), spawned) can import it.
Every setting runs twice per seed: an honest party A (the model, its cost, the passive
attacks) and an active one that probes the top model on every second step (the same passive
attacks on its honest steps, plus ``probe``); a setting's best attack is the best of both.
"""

import math
import re
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.leakage.attacks import (
    AttackResult,
    attack_run,
    chance_auc,
    drawn_auc,
    predict_auc,
)
from benchmarks.leakage.runs import LeakRun, Recorded, train_recorded
from party_b.privacy import DEFAULT_PRESET, parse_policy
from party_b.privacy.label_dp import auc_bound

__all__ = [
    "BASE",
    "DEFAULT",
    "GRID",
    "METRICS",
    "SEEDS",
    "aggregate",
    "at_epsilon",
    "grid",
    "order",
    "records_of",
    "seed_records",
]

# The product's settings per task: the breast demo at the example's 100 steps
# (examples/breast.toml) and the FATE default_credit setting of the vertical sweep (600
# steps: its held-out AUC has settled by then, see the learning curves of docs/PRIVACY.md).
# Canaries: enough for an AUC over them (about 1,200 of default_credit's 24,000 training
# rows, 90 of breast's 455).
BASE = {
    "breast": LeakRun(task="breast", steps=100, batch_size=32, q=8, L=4, canary_fraction=0.2),
    "default_credit": LeakRun(
        task="default_credit", steps=600, batch_size=256, q=8, L=16, canary_fraction=0.05
    ),
}
SEEDS = (0, 1, 2, 3, 4)  # party A's seed (model, batches, canaries); party B has its secret
DEFAULT = DEFAULT_PRESET  # what a party B started without FEDLITE_B_PRIVACY gives new runs
# the frontier: label DP at these epsilons (the default's among them: its own name), each
# with the default's forward-corrected loss, and at PLAIN_EPSILONS with the plain loss of
# the release before (what the correction moves); RRWithPrior's held-aside share at
# PRIOR_EPSILONS (party_b.privacy.prior: a prior_fraction turns forward_loss off)
EPSILONS = (0.2, 0.4, 1.0, 1.5, 2.0, 4.0)
PLAIN_EPSILONS = (0.4, 1.0, 2.0)
PRIOR, PRIOR_EPSILONS = 0.3, (0.4, 1.0, 2.0)


def at_epsilon(epsilon: float, extra: str = "") -> str:
    """The switch of the default policy at ``epsilon``, with ``extra`` overrides."""
    default = parse_policy(DEFAULT).label_epsilon
    return DEFAULT + ("" if epsilon == default else f",label_epsilon={epsilon:g}") + extra


GRID: tuple[str, ...] = (
    "off",
    "recommended",  # Marvell, the empirical defence label DP replaced as the default
    *(at_epsilon(e) for e in EPSILONS),
    *(at_epsilon(e, ",forward_loss=false") for e in PLAIN_EPSILONS),
    *(at_epsilon(e, f",prior_fraction={PRIOR:g}") for e in PRIOR_EPSILONS),
)
CURVE_POINTS = 6  # held-out evaluations along the honest off and default runs
# per attack, per run: the AUCs an attack gets (attacks.AttackResult), by sign rule
METRICS = ("leak_auc", "leak_auc_signed", "canary_auc", "canary_auc_signed", "batch_auc")


def order(record: dict[str, Any]) -> tuple[int, int, int, str]:
    """Sort key of a run's record: task, its place in the grid, seed, attack."""
    where = GRID.index(record["defence"]) if record["defence"] in GRID else len(GRID)
    return (list(BASE).index(record["task"]), where, record["seed"], record["attack"])


def _fields(result: AttackResult) -> dict[str, float | None]:
    return {
        "leak_auc": result.leak_auc["oracle"],
        "leak_auc_signed": result.leak_auc["predict"],
        "canary_auc": result.canary_auc["oracle"],
        "canary_auc_signed": result.canary_auc["predict"],
        "batch_auc": result.batch_auc,
    }


def _best(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each metric's maximum over the attacks, and which attack reached it."""
    best: dict[str, Any] = {"attack": "best"}
    for metric in METRICS:
        scored = [(r[metric], r["attack"]) for r in results if _finite(r[metric])]
        best[metric] = max(scored)[0] if scored else None
        best[f"{metric}_by"] = max(scored)[1] if scored else None
    return best


def _finite(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def records_of(
    run: LeakRun, honest: Recorded, active: Recorded | None, undefended_auc: float
) -> list[dict[str, Any]]:
    """One setting's records for one seed: one per attack (the active run's prefixed
    ``active:``) and one for the best of them."""
    policy = parse_policy(run.privacy)
    attacks = [{"attack": r.attack, **_fields(r)} for r in attack_run(honest)]
    if active is not None:
        attacks += [{"attack": f"active:{r.attack}", **_fields(r)} for r in attack_run(active)]
    predicted = predict_auc(honest)
    chance = chance_auc(honest)
    common = {
        "task": run.task,
        "downlink": run.downlink,
        "defence": run.privacy,
        "policy": policy.describe(),
        "default": run.privacy == DEFAULT,
        "epsilon": policy.epsilon,
        "auc_bound": auc_bound(policy.epsilon) if policy.epsilon is not None else None,
        "seed": run.seed,
        "model_auc": honest.model_auc,
        "model_auc_undefended": undefended_auc,
        "predict_auc": predicted["ordinary"],
        "predict_canary_auc": predicted["canary"],
        "predict_ids": honest.predict_ids,
        "chance_auc": chance["ordinary"],
        "chance_canary_auc": chance["canary"],
        # the randomized labels themselves as a score of the canaries' labels: what this
        # seed's draw gives away on its canaries, the bound as realised on them
        "drawn_canary_auc": drawn_auc(honest),
        "rows": len(honest.train_positions),
        "canaries": int(honest.canary.sum()),
        "downlink_bytes_per_step": honest.downlink_bytes / max(len(honest.grads), 1),
        "reply_loss_visible": any(l == l for l in honest.losses),  # noqa: E741 (NaN != NaN)
        "reply_metrics": sorted({k for m in honest.metrics for k in m}),
        "auc_curve": honest.auc_curve,
        "settings": asdict(run),
    }
    return [{**common, **a} for a in [*attacks, _best(attacks)]]


def grid(task: str, seed: int, smoke: bool, only: str | None) -> list[LeakRun]:
    """The task's honest runs for one seed, ``off`` first (the others' reference); ``only``:
    a regular expression over "task/defence" (``off`` still runs as the reference)."""
    base = replace(BASE[task], seed=seed)
    if smoke:
        base = replace(base, steps=10)
        return [base, replace(base, privacy=DEFAULT)]
    chosen = [d for d in GRID if only is None or re.search(only, f"{task}/{d}") is not None]
    runs = []
    for defence in GRID:
        if defence in chosen or (defence == "off" and chosen):
            curve = base.steps // CURVE_POINTS if defence in ("off", DEFAULT) else 0
            runs.append(replace(base, privacy=defence, eval_every=curve))
    return runs


def seed_records(
    task: str,
    seed: int,
    smoke: bool,
    only: str | None,
    workdir: Path,
    known: float | None = None,
) -> list[dict[str, Any]]:
    """Every setting of one task and seed, honest and active (one process each: they share
    no state). ``known``: the held-out AUC of this task and seed's undefended run, measured
    before (``--merge``): it is not run again unless ``only`` picks it (an undefended run has
    no random draws beyond the seed's: it gives the same model)."""
    torch.set_num_threads(1)  # tiny models on a shared machine: more threads only contend
    records: list[dict[str, Any]] = []
    undefended = known
    for run in grid(task, seed, smoke, only):
        # an off run that ``only`` did not pick is the others' reference, nothing more
        reference = run.privacy == "off" and only is not None and not re.search(only, f"{task}/off")
        if reference and undefended is not None:
            continue
        t0 = time.perf_counter()
        where = workdir / f"{task}-s{seed}"
        honest = train_recorded(run, where)
        if run.privacy == "off":
            undefended = honest.model_auc
        if reference:
            continue
        assert undefended is not None
        active = train_recorded(replace(run, active=True, eval_every=0), where)
        new = records_of(run, honest, active, undefended)
        records += new
        best = new[-1]
        print(
            f"{task:15s} s{seed} {run.privacy:34s} leak {best['leak_auc']:.3f} canary "
            f"{best['canary_auc']:.3f} model {honest.model_auc:.4f} "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return records


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (task, defence, attack) over its seeds: for each AUC its mean, sample
    standard deviation and per-seed values; ``auc_cost`` pairs each seed with the undefended
    run of the same seed (same model initialisation, batches and canaries).

    And one ``best`` record per (task, defence): for each measure, the attack whose mean over
    the seeds is highest (``<measure>_by`` names it). The best attack is chosen once for all
    seeds, as an attacker picks a method: a maximum per seed over a dozen attacks would add
    the largest of a dozen sampling errors (on breast's 90 canaries, several hundredths).
    """
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        if r["attack"] != "best":
            groups.setdefault((r["task"], r["downlink"], r["defence"], r["attack"]), []).append(r)
    out: list[dict[str, Any]] = []
    settings: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for key, members in groups.items():
        record = _over_seeds(key[3], sorted(members, key=lambda r: r["seed"]))
        settings.setdefault(key[:3], []).append(record)
        out.append(record)
    for attacks in settings.values():
        best = {k: v for k, v in attacks[0].items() if not k.startswith(METRICS)}
        best["attack"] = "best"
        for metric in METRICS:
            scored = [a for a in attacks if a[metric] is not None]
            top = max(scored, key=lambda a: a[metric]) if scored else None
            for suffix in ("", "_sd", "_seeds"):
                best[metric + suffix] = top[metric + suffix] if top is not None else None
            best[f"{metric}_by"] = top["attack"] if top is not None else None
        out.append(best)
    return out


def _over_seeds(attack: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    first = members[0]
    record: dict[str, Any] = {
        "task": first["task"],
        "downlink": first["downlink"],
        "defence": first["defence"],
        "attack": attack,
        "policy": first["policy"],
        "default": first["default"],
        "epsilon": first["epsilon"],
        "auc_bound": first["auc_bound"],
        "seeds": [r["seed"] for r in members],
        "steps": first["settings"]["steps"],
        "rows": first["rows"],
        "canaries": [r["canaries"] for r in members],
    }
    numbers = {
        **{m: [r[m] for r in members] for m in METRICS},
        "model_auc": [r["model_auc"] for r in members],
        "auc_cost": [r["model_auc_undefended"] - r["model_auc"] for r in members],
        "predict_auc": [r["predict_auc"] for r in members],
        "predict_canary_auc": [r["predict_canary_auc"] for r in members],
        "chance_auc": [r["chance_auc"] for r in members],
        "chance_canary_auc": [r["chance_canary_auc"] for r in members],
        "drawn_canary_auc": [r.get("drawn_canary_auc", math.nan) for r in members],
    }
    for name, values in numbers.items():
        record[f"{name}_seeds"] = values
        if all(_finite(v) for v in values):
            record[name], record[f"{name}_sd"] = _mean_sd(values)
        else:
            record[name] = record[f"{name}_sd"] = None
    record.update(
        model_auc_undefended_seeds=[r["model_auc_undefended"] for r in members],
        predict_ids=first["predict_ids"],
        reply_loss_visible=first["reply_loss_visible"],
        reply_metrics=first["reply_metrics"],
        auc_curves={str(r["seed"]): r["auc_curve"] for r in members},
    )
    return record
