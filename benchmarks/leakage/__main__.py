"""How much of party B's labels party A can read from training, per defence: leakage.json.

    python -m benchmarks.leakage              # the grid below, one process per task
    python -m benchmarks.leakage --smoke      # two 10-step runs per task, to check the pipeline
    python -m benchmarks.leakage.report       # renders the tables into docs/PRIVACY.md

Every run is real training through the product (``benchmarks.leakage.runs``); the attacks
(``benchmarks.leakage.attacks``) read the gradients party A decoded from the step replies.
One record per (task, downlink representation, defence, attack), attack "best" being the
maximum over the three: ``leak_auc`` (the attacker's AUC, best sign per batch), ``model_auc``
(held-out AUC of the trained model, computed by party B), ``model_auc_undefended`` (the same
task and downlink with privacy ``off``), and ``chance_auc`` (the leak AUC of scores that know
nothing, the floor the best-sign rule gives for free on these batch sizes).
"""

import argparse
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import RESULTS, machine
from benchmarks.leakage.attacks import chance_auc, leak_auc, score_batches
from benchmarks.leakage.runs import LeakRun, Recorded, train_recorded

# The product's settings per task: the breast demo (examples/breast.toml) and the FATE
# default_credit setting of the vertical sweep, shortened to keep CPU use small.
BASE = {
    "breast": LeakRun(task="breast", steps=100, batch_size=32, q=8, L=4),
    "default_credit": LeakRun(task="default_credit", steps=200, batch_size=256, q=8, L=16),
}
NOISE_CURVE = (1.0, 2.0, 4.0)  # isotropic Gaussian noise alone: the privacy-utility curve
DEFENCES_FLOAT32 = (
    "off",
    "max_norm=true",
    *(f"noise={s:g}" for s in NOISE_CURVE),
    "directional=1.5,directions=2",
    "label_epsilon=0.5",
    "recommended",
)
# Does compressing the downlink hide labels by itself? Branch downlink's representations,
# undefended (float16 also under the recommended setting).
DOWNLINKS = {
    "float32": DEFENCES_FLOAT32,
    "float16": ("off", "recommended"),
    "int2": ("off",),
    "topk:k=4": ("off",),
    "pq:q=8,L=4": ("off",),
}


def records_of(run: LeakRun, got: Recorded, undefended_auc: float) -> list[dict[str, Any]]:
    """One record per attack and one for the best of them."""
    scores = score_batches(got.grads)
    aucs = {name: leak_auc(s, got.labels) for name, s in scores.items()}
    aucs["best"] = max(aucs.values())
    common = {
        "task": run.task,
        "downlink": run.downlink,
        "defence": run.privacy,
        "model_auc": got.model_auc,
        "model_auc_undefended": undefended_auc,
        "chance_auc": chance_auc(got.labels),
        "downlink_bytes_per_step": got.downlink_bytes / max(len(got.grads), 1),
        "reply_loss_visible": any(l == l for l in got.losses),  # noqa: E741 (NaN != NaN)
        "reply_metrics": sorted({k for m in got.metrics for k in m}),
        "settings": asdict(run),
    }
    return [{**common, "attack": name, "leak_auc": auc} for name, auc in aucs.items()]


def grid(task: str, smoke: bool) -> list[LeakRun]:
    """The task's runs, "off" first for each downlink (its AUC is the others' reference)."""
    if smoke:
        base = replace(BASE[task], steps=10)
        return [base, replace(base, privacy="recommended")]
    return [
        replace(BASE[task], downlink=downlink, privacy=defence)
        for downlink, defences in DOWNLINKS.items()
        for defence in defences
    ]


def task_records(task: str, smoke: bool, workdir: Path) -> list[dict[str, Any]]:
    """Every run of one task, in order (one process per task: they share no state)."""
    torch.set_num_threads(1)  # tiny models on a shared machine: more threads only contend
    records: list[dict[str, Any]] = []
    undefended: dict[str, float] = {}
    for run in grid(task, smoke):
        t0 = time.perf_counter()
        got = train_recorded(run, workdir / task)
        if run.privacy == "off":
            undefended[run.downlink] = got.model_auc
        new = records_of(run, got, undefended[run.downlink])
        records += new
        print(
            f"{task:15s} {run.downlink:11s} {run.privacy:30s} leak {new[-1]['leak_auc']:.3f} "
            f"model {got.model_auc:.4f} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two 10-step runs per task")
    parser.add_argument("--tasks", nargs="+", default=list(BASE), choices=list(BASE))
    parser.add_argument("--out", default=str(RESULTS / "leakage.json"))
    args = parser.parse_args()
    started = time.time()
    load_before = list(os.getloadavg())
    workdir = Path(tempfile.mkdtemp(prefix="fedlite-leakage-"))
    try:
        with multiprocessing.get_context("spawn").Pool(len(args.tasks)) as pool:
            jobs = [pool.apply_async(task_records, (t, args.smoke, workdir)) for t in args.tasks]
            records = [r for job in jobs for r in job.get()]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    doc = {
        "command": "python -m benchmarks.leakage" + (" --smoke" if args.smoke else ""),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": time.time() - started,
        "machine": machine(),
        "loadavg_before": load_before,
        "loadavg_after": list(os.getloadavg()),
        "records": records,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
