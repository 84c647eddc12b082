"""The multi-run averaging attack: one token makes k runs over the same ids and votes.

    python -m benchmarks.leakage.multirun            # every task, into leakage.json.gz
    python -m benchmarks.leakage.multirun --smoke    # three 10-step runs of breast

Each run is real training through the product (``runs.train_recorded``: an honest party A,
one token, one party B database per task, so that every run is on the same label table);
the attack is the outside audit's: the cross-step attack (``attacks.cross_step_scores``: each
step's top singular direction, its sign carried across steps, pooled per row) on every run,
signed by the oracle (an upper bound), standardised, and summed over the first k runs; its
AUC against the true labels of every training row any of them visited (no canaries: they
would differ between seeds). Two ways of drawing the randomized labels:

- ``table``: the product's (``party_b.privacy.draws``), one draw for all the runs;
- ``run``: a new draw before every run (an operator's ``fedlite-b privacy redraw``), which
  is what each run drawing from its own secret did before: the ledger counts every draw.

Records go to the ``multirun`` part of leakage.json.gz (the grid's runs and records are
kept), one per (task, policy, draws, k); ``python -m benchmarks.leakage.report`` renders
them into docs/PRIVACY.md.
"""

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from benchmarks.common import machine
from benchmarks.leakage import report
from benchmarks.leakage.attacks import Scores, cross_step_scores
from benchmarks.leakage.grid import BASE, DEFAULT, EPSILONS, at_epsilon
from benchmarks.leakage.runs import train_recorded
from party_b import store
from party_b.privacy import parse_policy
from party_b.privacy.label_dp import auc_bound

__all__ = ["PLAN", "measure", "voted_auc"]

# (task, policy, draws, runs): the default's curve up to the audit's 40 runs on breast (8 on
# default_credit, 20 s a run), both ways of drawing; each other epsilon of the frontier with
# 8 runs on one draw
PLAN: tuple[tuple[str, str, str, int], ...] = (
    ("breast", DEFAULT, "table", 40),
    ("breast", DEFAULT, "run", 40),
    *(("breast", at_epsilon(e), "table", 8) for e in EPSILONS if at_epsilon(e) != DEFAULT),
    ("default_credit", DEFAULT, "table", 8),
    ("default_credit", DEFAULT, "run", 8),
)
SHOWN = (1, 2, 4, 8, 16, 40)  # the k a record is kept for (those up to the runs made)


def voted_auc(labels: np.ndarray, scores: list[Scores]) -> float:
    """AUC against ``labels`` of the runs' scores summed (an unvisited row adds nothing),
    over the rows some run visited."""
    stacked = np.stack(scores)
    seen = np.isfinite(stacked).any(axis=0)
    votes = np.nansum(stacked, axis=0)
    return float(roc_auc_score(labels[seen], votes[seen]))


def _redraw(workdir: Path) -> None:
    """The operator's ``fedlite-b privacy redraw`` on the task's database."""
    engine = store.make_engine(f"sqlite:///{workdir / 'party_b.sqlite'}")
    try:
        with store.make_session_factory(engine)() as session:
            store.retire_draws(session)
            session.commit()
    finally:
        engine.dispose()


def measure(
    task: str, privacy: str, draws: str, runs: int, workdir: Path, smoke: bool
) -> list[dict[str, Any]]:
    """``runs`` runs of ``task`` under ``privacy`` (seeds 0, 1, ...), the attack on each,
    and a record per k in SHOWN: the vote of the first k runs."""
    base = replace(BASE[task], privacy=privacy, canary_fraction=0.0)
    if smoke:
        base = replace(base, steps=10)
    where = workdir / f"{task}-{draws}-{privacy}"
    scores, labels, started = [], np.zeros(0, np.int64), time.perf_counter()
    for seed in range(runs):
        if draws == "run":
            where.mkdir(parents=True, exist_ok=True)
            if (where / "party_b.sqlite").exists():
                _redraw(where)
        rec = train_recorded(replace(base, seed=seed), where)
        scores.append(cross_step_scores(rec))
        labels = rec.labels
    policy = parse_policy(privacy)
    epsilon = policy.epsilon
    out = []
    for k in [k for k in SHOWN if k <= runs]:
        out.append(
            {
                "task": task,
                "defence": privacy,
                "policy": policy.describe(),
                "default": privacy == DEFAULT,
                "epsilon": epsilon,
                "auc_bound": auc_bound(epsilon) if epsilon is not None else None,
                "draws": draws,
                "runs": k,
                "leak_auc": voted_auc(labels, scores[:k]),
                "steps": base.steps,
            }
        )
    print(
        f"{task:15s} {privacy:34s} {draws:5s} "
        + " ".join(f"k={r['runs']}:{r['leak_auc']:.3f}" for r in out)
        + f" ({time.perf_counter() - started:.0f} s)",
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="three 10-step runs of breast")
    parser.add_argument("--out", type=Path, default=report.RESULT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started, load_before = time.time(), list(os.getloadavg())
    plan = [("breast", DEFAULT, "table", 3)] if args.smoke else list(PLAN)
    workdir = Path(tempfile.mkdtemp(prefix="fedlite-multirun-"))
    try:
        records = [r for item in plan for r in measure(*item, workdir, args.smoke)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    doc = report.load(args.out) if args.out.exists() else {"machine": machine()}
    doc["multirun"] = {
        "invocation": {
            "command": "python -m benchmarks.leakage.multirun" + (" --smoke" if args.smoke else ""),
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "seconds": time.time() - started,
            "runs": sum(item[3] for item in plan),
            "loadavg_before": load_before,
            "loadavg_after": list(os.getloadavg()),
        },
        "records": records,
    }
    from benchmarks.leakage.__main__ import dump

    report.save(args.out, dump(doc))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
