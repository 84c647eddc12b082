"""Quantization error against compression ratio on real FEMNIST cut-layer activations
(the paper's Fig. 2), and the real activations the quantizer benchmark reads.

    python -m experiments.quant_error     # after the femnist and shakespeare sweeps' SplitFed runs

The activations come from the bottom model the SplitFed run of the ``femnist`` sweep trained
(``experiments/results/femnist/<key>.bottom.pt``), in eval mode, on one training batch of 20
images of each of ``--clients`` writers: the batches FedLite quantizes. For every quantizer
setting the relative error ||Z - Z~||^2 / ||Z||^2 is averaged over those writers' batches.

It also writes ``benchmarks/data/activations.npz`` with ``femnist`` (20, 9216) and ``nwp``
(3840, 96): one real batch of each shape for ``benchmarks/quantizer.py --activations``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.sweep import RESULTS
from experiments.sweeps import FEMNIST, SHAKESPEARE
from experiments.tasks import load_task
from shared.accounting import compression_report
from shared.models import build_bottom
from shared.pq import GroupedProductQuantizer, PQConfig, relative_error

__all__ = ["SETTINGS", "main"]

D = 9216
B = 20
BENCH_DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "activations.npz"

# (family, q, R, L values): the paper's Fig. 2 families
SETTINGS: list[tuple[str, int, int, list[int]]] = [
    ("k-means (q=1)", 1, 1, [2, 4, 8, 16]),
    *[(f"vanilla PQ (R=q={q})", q, q, [2, 4, 8, 16]) for q in (288, 1152, 4608)],
    *[(f"grouped PQ (q=4608, R={r})", 4608, r, [2, 4, 8, 16, 32]) for r in (2304, 1152, 384, 1)],
    # the R = 1 quantizers the training sweep uses (its q grid)
    *[(f"grouped PQ (q={q}, R=1)", q, 1, [2, 4, 8, 16, 32]) for q in (1152, 288)],
]


def _bottom(task: str, key: str, **kwargs: Any) -> torch.nn.Module:
    path = RESULTS / task / f"{key}.bottom.pt"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run `python -m experiments.sweep {task}` first")
    model = build_bottom(load_task(task).model, **kwargs)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


def femnist_batches(clients: int) -> list[torch.Tensor]:
    """One batch of 20 training images of each of ``clients`` writers, through the trained
    bottom: a list of (20, 9216) activations."""
    task = load_task("femnist")
    model = _bottom("femnist", FEMNIST.key)
    groups = np.asarray(task.features.groups)
    rng = np.random.default_rng(0)
    writers = [w for w in np.unique(groups) if (groups == w).sum() >= B]
    out = []
    for writer in rng.choice(writers, size=clients, replace=False):
        rows = rng.choice(np.flatnonzero(groups == writer), size=B, replace=False)
        with torch.no_grad():
            out.append(model(torch.from_numpy(task.features.x[rows])))
    return out


def nwp_batch() -> torch.Tensor:
    """128 sequences x 30 tokens of the largest speaking role: (3840, 96)."""
    task = load_task("shakespeare")
    model = _bottom("shakespeare", SHAKESPEARE.key, **task.bottom)
    groups = np.asarray(task.features.groups)
    names, counts = np.unique(groups, return_counts=True)
    rows = np.flatnonzero(groups == names[counts.argmax()])[:128]
    with torch.no_grad():
        out: torch.Tensor = model(torch.from_numpy(task.features.x[rows]).long())
    return out


def measure(batches: list[torch.Tensor]) -> list[dict[str, Any]]:
    rows = []
    for family, q, r, ls in SETTINGS:
        for L in ls:
            quantizer = GroupedProductQuantizer(D, PQConfig(q=q, L=L, R=r))
            started = time.perf_counter()
            errors = [
                relative_error(z, quantizer.quantize(z, seed=i)[1]) for i, z in enumerate(batches)
            ]
            report = compression_report(d=D, batch=B, q=q, L=L, R=r)
            rows.append(
                {
                    "family": family,
                    "q": q,
                    "R": r,
                    "L": L,
                    "relative_error": float(np.mean(errors)),
                    "relative_error_std": float(np.std(errors)),
                    "paper_ratio": report["paper_ratio"],
                    "wire_ratio": report["wire_ratio"],
                    "ms_per_batch": 1000 * (time.perf_counter() - started) / len(batches),
                }
            )
            error, ratio = rows[-1]["relative_error"], report["paper_ratio"]
            print(f"{family:28s} L={L:3d} error {error:.4f} ratio {ratio:.0f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.quant_error")
    parser.add_argument("--clients", type=int, default=10, help="writers' batches to average over")
    parser.add_argument("--out", type=Path, default=RESULTS / "quant_error" / "quant_error.json")
    parser.add_argument(
        "--no-activations", action="store_true", help=f"do not (re)write {BENCH_DATA.name}"
    )
    parser.add_argument(
        "--activations-only", action="store_true", help=f"only (re)write {BENCH_DATA.name}"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    batches = femnist_batches(args.clients)
    if not args.activations_only:
        rows = measure(batches)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        summary = {"clients": args.clients, "batch": B, "d": D, "rows": rows}
        args.out.write_text(json.dumps(summary, indent=1))
        print(f"wrote {args.out}")
    if args.no_activations:
        return 0
    BENCH_DATA.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(BENCH_DATA, femnist=batches[0].numpy(), nwp=nwp_batch().numpy())
    print(f"wrote {BENCH_DATA} ({BENCH_DATA.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
