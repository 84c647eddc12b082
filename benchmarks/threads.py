"""The thread default against every fixed thread count, quiet and under load (issue 27).

    python -m benchmarks.threads [--load 0 2] [--rounds 8] [--block 8]

For each task's two halves (breast, default_credit, FEMNIST; the models and batch shapes of
``benchmarks.floor``, synthetic inputs), a bare training step (the top: forward, backward to
d loss / d z~, Adam or SGD; the bottom: forward, the product's quantizer, backward, optimizer)
is timed at 1, 2, 4, ... up to all cores, in rounds where the thread counts take turns, with
``--load N`` extra processes spinning on the CPUs at normal priority (0: as the machine is).
Each row gives the default count (``shared.threads.choose``) and its time against the best
fixed count of the same row: the target is <= 1.10. Writes ``benchmarks/results/threads.json``
(``--out`` to keep a second machine's apart).
"""

import argparse
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import versions, write_result
from shared import threads
from shared.models import build_bottom, build_top, output_kwarg
from shared.pq import GroupedProductQuantizer, PQConfig
from shared.training import make_optimizer

__all__ = ["main"]

# task: (model, bottom kwargs, input width, top kwargs, batch, d, q, L, optimizer)
SHAPES: dict[str, tuple[str, dict[str, Any], int, dict[str, Any], int, int, int, int, str]] = {
    "breast": ("tabular_mlp", {"hidden": [64], "cut_dim": 32}, 20,
               {"hidden": [32], "side_features": 10, "num_classes": 2}, 32, 32, 8, 4, "adam"),
    "default_credit": ("tabular_mlp", {"hidden": [64], "cut_dim": 32}, 13,
                       {"hidden": [32], "side_features": 10, "num_classes": 2}, 256, 32, 8, 16,
                       "adam"),
    "femnist": ("femnist_cnn", {}, 784, {"num_classes": 62}, 20, 9216, 1152, 2, "sgd"),
}  # fmt: skip


def steps(task: str) -> dict[str, tuple[Callable[[int], None], int]]:
    """The task's bare top and bottom steps (each called with a step number) and the
    multiply-adds of each, as ``shared.threads`` counts them."""
    model, bottom_kw, width, top_kw, batch, d, q, L, opt = SHAPES[task]
    if model == "tabular_mlp":
        bottom_kw = {**bottom_kw, "in_features": width}
    top_kw = {k: v for k, v in top_kw.items() if k != "num_classes"}
    top_kw[output_kwarg(model)] = SHAPES[task][3]["num_classes"]
    torch.manual_seed(0)
    top, bottom = build_top(model, cut_dim=d, **top_kw), build_bottom(model, **bottom_kw)
    spec = {"name": opt, "lr": 0.003 if opt == "adam" else 0.01}
    top_opt, bottom_opt = (
        make_optimizer(top.parameters(), spec),
        make_optimizer(bottom.parameters(), spec),
    )
    z0 = torch.randn(batch, d)
    side = torch.randn(batch, top_kw["side_features"]) if "side_features" in top_kw else None
    y = torch.randint(0, SHAPES[task][3]["num_classes"], (batch,))
    x = torch.rand(batch, width)
    pq = GroupedProductQuantizer(d, PQConfig(q=q, L=L, R=1))
    g = 1e-3 * torch.randn(batch, d)

    def top_step(_t: int) -> None:
        z = z0.detach().requires_grad_(True)
        top_opt.zero_grad(set_to_none=True)
        torch.autograd.backward(torch.nn.functional.cross_entropy(top(z, side), y))
        top_opt.step()

    def bottom_step(t: int) -> None:
        z = bottom(x)
        z_tilde = pq.decode(pq.encode(z.detach(), seed=t))
        bottom_opt.zero_grad(set_to_none=True)
        torch.autograd.backward(z, g + 1e-3 * (z.detach() - z_tilde))
        bottom_opt.step()

    top_macs = threads.macs_per_sample(top, z0[:1], None if side is None else side[:1]) * batch
    bottom_macs = threads.macs_per_sample(bottom, x[:1]) * batch
    return {"top": (top_step, top_macs), "bottom": (bottom_step, bottom_macs)}


def _spin() -> None:
    while True:
        pass


def measure(counts: list[int], rounds: int, block: int) -> list[dict[str, Any]]:
    """Every task half at every thread count, the counts taking turns round by round."""
    rows = []
    for task in SHAPES:
        for side, (step, macs) in steps(task).items():
            times: dict[int, list[float]] = {n: [] for n in counts}
            for r in range(rounds + 1):
                for n in counts[r % len(counts) :] + counts[: r % len(counts)]:
                    torch.set_num_threads(n)
                    for t in range(block):
                        start = time.perf_counter()
                        step(t)
                        if r:  # round 0 warms every count up
                            times[n].append(time.perf_counter() - start)
            medians = {n: 1000 * statistics.median(v) for n, v in times.items()}
            best = min(medians, key=lambda n: medians[n])
            default = threads.choose(macs)
            at_default = medians.get(default)
            rows.append(
                {
                    "task": task,
                    "side": side,
                    "macs_per_step": macs,
                    "median_ms": {str(n): m for n, m in medians.items()},
                    "quartiles_ms": {
                        str(n): statistics.quantiles([1000 * s for s in v], n=4)
                        for n, v in times.items()
                    },
                    "best": best,
                    "default": default,
                    "default_over_best": None if at_default is None else at_default / medians[best],
                }
            )
            print(rows[-1]["task"], side, {n: round(m, 2) for n, m in medians.items()},
                  "default", default, flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", type=int, nargs="+", default=[0], help="spinning processes")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    counts = sorted({1, cores, *(2**i for i in range(1, 8) if 2**i < cores)})
    runs = []
    for load in args.load:
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(load)]
        for p in spinners:
            p.start()
        before = os.getloadavg()
        try:
            rows = measure(counts, args.rounds, args.block)
        finally:
            for p in spinners:
                p.terminate()
                p.join()
        runs.append(
            {
                "spinners": load,
                "loadavg_before": before,
                "loadavg_after": os.getloadavg(),
                "rows": rows,
            }
        )
    path = write_result(
        "threads",
        {"versions": versions("torch", "numpy"), "thread_counts": counts, "runs": runs},
        args.out,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
