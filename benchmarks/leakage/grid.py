"""The leakage benchmark's grid: which runs, and each run's records (see ``__main__``).

In its own module so that the worker processes (one per task, spawned) can import it.
"""

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.leakage.attacks import chance_auc, leak_auc, score_batches
from benchmarks.leakage.runs import LeakRun, Recorded, train_recorded

__all__ = ["BASE", "DOWNLINKS", "grid", "records_of", "task_records"]

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
