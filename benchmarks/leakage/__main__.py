"""How much of party B's labels party A can read from training, per defence: leakage.json.

    python -m benchmarks.leakage              # the grid below (~10 min on 2 busy cores)
    python -m benchmarks.leakage --smoke      # two short runs, to check the pipeline
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
NOISE_CURVE = (0.25, 0.5, 1.0, 2.0, 4.0)  # the privacy-utility curve, Gaussian noise alone
DEFENCES_FLOAT32 = (
    "off",
    "metrics=loss",
    "max_norm=true",
    *(f"noise={s:g}" for s in NOISE_CURVE),
    *(f"max_norm=true,noise={s:g}" for s in (0.5, 2.0)),
    "label_epsilon=1",
    "label_epsilon=3",
    "recommended",
)
DOWNLINKS = {"float32": DEFENCES_FLOAT32, "float16": ("off", "recommended")}


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


def grid(smoke: bool) -> list[LeakRun]:
    if smoke:
        base = replace(BASE["breast"], steps=10)
        return [base, replace(base, privacy="recommended")]
    return [
        replace(BASE[task], downlink=downlink, privacy=defence)
        for task in BASE
        for downlink, defences in DOWNLINKS.items()
        for defence in defences
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two 10-step breast runs")
    parser.add_argument("--out", default=str(RESULTS / "leakage.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny models on a shared machine: more threads only contend
    workdir = Path(tempfile.mkdtemp(prefix="fedlite-leakage-"))
    started = time.time()
    load_before = list(os.getloadavg())
    records: list[dict[str, Any]] = []
    undefended: dict[tuple[str, str], float] = {}
    for run in grid(args.smoke):  # "off" comes first for each (task, downlink)
        t0 = time.perf_counter()
        got = train_recorded(run, workdir / run.task)
        if run.privacy == "off":
            undefended[run.task, run.downlink] = got.model_auc
        new = records_of(run, got, undefended[run.task, run.downlink])
        records += new
        best = new[-1]
        print(
            f"{run.task:15s} {run.downlink:8s} {run.privacy:28s} leak {best['leak_auc']:.3f} "
            f"model {got.model_auc:.4f} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    doc = {
        "command": "python -m benchmarks.leakage" + (" --smoke" if args.smoke else ""),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": time.time() - started,
        "machine": machine(),
        "loadavg_before": load_before,
        "loadavg_after": list(os.getloadavg()),
        "records": records,
    }
    shutil.rmtree(workdir, ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
