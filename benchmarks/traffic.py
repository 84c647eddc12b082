"""Bytes both ways per training step, and what they cost in accuracy, for every representation.

    python -m benchmarks.traffic                     # every task (long: run it under nice)
    python -m benchmarks.traffic --tasks default_credit --steps 100
    python -m benchmarks.traffic --steps femnist=150 default_credit=200 --cached-only
    python -m benchmarks.traffic --smoke             # 3 steps of tiny runs (tests)
    python -m benchmarks.traffic --tasks breast default_credit --seeds 0 1 2

Each method is one real run of ``experiments.runner.run_split`` through party B's service in
process (``party_b.inprocess``): the bytes are ``len()`` of the encoded step requests party A
sent and of the step responses it got back, counted by party A's trainer, divided by the
steps. Every method of a task trains for the same steps as the task's SplitFed run (raw
float32 activations up, float32 gradients down) of the same seed, which gives
``splitfed_*``; ``--seeds`` repeats every method with each seed (split, initialisation and
batches all follow the seed), one record per seed. Writes
``benchmarks/results/traffic.json`` with one record per run; each finished run is also kept
under ``benchmarks/results/traffic-runs/`` so an interrupted benchmark resumes where it was.
"""

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from api_schemas import default_downlink
from benchmarks.common import RESULTS, write_result
from experiments.runner import RunConfig, run_split

__all__ = ["TASKS", "Method", "main", "records"]


@dataclass(frozen=True)
class Method:
    """One uplink + downlink pair; ``uplink`` "raw" is SplitFed's float32 activations."""

    # "raw", "pq:q=..,L=.." (float32 codebook, bit-packed codewords), plus ",cb=f2" (float16
    # codebook) and/or ",cw=ans" (codewords rANS-coded where smaller, PROTOCOL.md 3.1)
    uplink: str
    downlink: str  # a shared.wire.downlink spec string

    @property
    def name(self) -> str:
        return f"up {self.uplink} / down {self.downlink}"


@dataclass(frozen=True)
class Task:
    base: RunConfig  # the SplitFed run of the task; methods replace what they change
    metric: str  # the eval_* metric compared
    q: int  # uplink PQ of the FedLite methods
    L: int
    lam: float
    methods: tuple[str, ...]  # downlinks tried with the FedLite uplink
    d: int  # the cut width (what the default downlink of a new run depends on)


FEMNIST = Task(
    # the paper's point: 10 writers x 20 images per step, SGD 0.1, q = 1152, L = 2, R = 1,
    # lambda = 2e-4 (docs/RESULTS.md); the steps are set by --steps (CPU-bound here)
    base=RunConfig(
        task="femnist",
        method="splitfed",
        steps=300,
        batch_size=20,
        clients_per_step=10,
        lr_bottom=0.1,
        lr_top=0.1,
        optimizer="sgd",
        eval_every=10**9,
    ),
    metric="accuracy",
    q=1152,
    L=2,
    lam=2e-4,
    methods=("float32", "int2", "int1", "topk:k=256", "pq:q=1152,L=2"),
    d=9216,
)
# The downlinks measured at a small cut layer (d = 32): how the default for new runs was
# chosen below d = 256 (docs/PERFORMANCE.md, "Traffic"); top-k keeps d/4, d/8 and d/36 (the
# fraction FEMNIST's top-256 keeps of d = 9216) of each row.
SMALL_D_DOWNLINKS = (
    "float32",
    "float16",
    "int8",
    "int4",
    "int2",
    "int1",
    "topk:k=8",
    "topk:k=4",
    "topk:k=1",
)
BREAST = Task(
    # the demo (examples/breast.toml): 100 steps of 32 rows, Adam 0.003, d = 32, q = 8, L = 4
    base=RunConfig(
        task="breast",
        method="splitfed",
        steps=100,
        batch_size=32,
        lr_bottom=0.003,
        lr_top=0.003,
        optimizer="adam",
        eval_fraction=0.2,
        eval_every=10**9,
    ),
    metric="auc",
    q=8,
    L=4,
    lam=1e-3,
    methods=SMALL_D_DOWNLINKS,
    d=32,
)
DEFAULT_CREDIT = Task(
    base=RunConfig(
        task="default_credit",
        method="splitfed",
        steps=300,
        batch_size=256,
        lr_bottom=0.003,
        lr_top=0.003,
        optimizer="adam",
        eval_fraction=0.2,
        eval_every=10**9,
    ),
    metric="auc",
    q=8,
    L=16,
    lam=0.0,
    methods=(*SMALL_D_DOWNLINKS, "pq:q=8,L=16"),
    d=32,
)
SHAKESPEARE = Task(
    base=RunConfig(
        task="shakespeare",
        method="splitfed",
        steps=150,
        batch_size=16,
        clients_per_step=8,
        lr_bottom=0.01,
        lr_top=0.01,
        optimizer="adam",
        eval_fraction=0.05,
        eval_every=10**9,
    ),
    metric="accuracy",
    q=12,
    L=30,
    lam=1e-3,
    methods=(
        "float32",
        "int8",
        "int4",
        "int2",
        "int1",
        "topk:k=24",
        "topk:k=12",
        "topk:k=3",
        "pq:q=12,L=30",
    ),
    d=96,
)
TASKS = {
    "femnist": FEMNIST,
    "breast": BREAST,
    "default_credit": DEFAULT_CREDIT,
    "shakespeare": SHAKESPEARE,
}
SMOKE_OPTIONS = {
    "femnist": {"max_clients": 6},
    "shakespeare": {"max_clients": 6, "vocab_words": 200, "hidden": 32},
}


def methods_of(
    task: Task,
    downlinks: list[str] | None = None,
    *,
    f16_codebook: bool = False,
    entropy_uplink: bool = False,
) -> list[Method]:
    """SplitFed, then FedLite with each downlink (default: the task's list, in order);
    ``f16_codebook``: float16 uplink codebooks with the last downlink; ``entropy_uplink``:
    rANS-coded codewords (with float32, and with float16 codebooks) with the default
    downlink of a new run at the task's d."""
    pq = f"pq:q={task.q},L={task.L}"
    chosen = list(task.methods) if downlinks is None else downlinks
    out = [Method("raw", "float32")]
    out += [Method(pq, downlink) for downlink in chosen]
    if f16_codebook:
        out.append(Method(pq + ",cb=f2", chosen[-1]))
    if entropy_uplink:
        down = default_downlink(task.d)
        out += [Method(pq + ",cw=ans", down), Method(pq + ",cb=f2,cw=ans", down)]
    return out


def run_config(task: Task, method: Method, steps: int, smoke: bool, seed: int = 0) -> RunConfig:
    base = replace(task.base, steps=steps, eval_every=steps, seed=seed)
    if smoke:
        clients = 2 if base.clients_per_step else None
        base = replace(
            base, clients_per_step=clients, task_options=SMOKE_OPTIONS.get(base.task, {})
        )
    downlink = None if method.downlink == "float32" and method.uplink == "raw" else method.downlink
    if method.uplink == "raw":
        return replace(base, downlink=downlink)
    return replace(
        base,
        method="fedlite",
        q=task.q,
        L=task.L,
        lam=task.lam,
        downlink=downlink,
        codebook_dtype="float16" if ",cb=f2" in method.uplink else "float32",
        codewords="ans" if ",cw=ans" in method.uplink else "packed",
    )


def _run(config: RunConfig, cache: Path, cached_only: bool) -> dict[str, Any] | None:
    path = cache / f"{config.key}.json"
    if path.exists():
        cached: dict[str, Any] = json.loads(path.read_text())
        return cached
    if cached_only:
        return None
    record = run_split(config)
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def records(
    tasks: list[str],
    steps: dict[str, int],
    *,
    smoke: bool,
    cache: Path,
    downlinks: list[str] | None = None,
    f16_codebook: bool = False,
    entropy_uplink: bool = False,
    cached_only: bool = False,
    seeds: tuple[int, ...] = (0,),
) -> list[dict[str, Any]]:
    """One record per (task, seed, method): measured bytes per step both ways and the metric.

    ``cached_only``: the runs already kept under ``cache`` only (a task and seed without its
    SplitFed run is left out)."""
    out = []
    for name in tasks:
        chosen = methods_of(
            TASKS[name], downlinks, f16_codebook=f16_codebook, entropy_uplink=entropy_uplink
        )
        for seed in seeds:
            out += _task_records(name, chosen, steps[name], smoke, cache, cached_only, seed)
    return out


def _task_records(
    name: str,
    methods: list[Method],
    steps: int,
    smoke: bool,
    cache: Path,
    cached_only: bool,
    seed: int,
) -> list[dict[str, Any]]:
    """The records of one task at one seed (none when its SplitFed run is missing)."""
    task = TASKS[name]
    found = {
        method: _run(run_config(task, method, steps, smoke, seed), cache, cached_only)
        for method in methods
    }
    runs = {method: record for method, record in found.items() if record is not None}
    splitfed = runs.get(Method("raw", "float32"))
    if splitfed is None:
        return []
    sf_up, sf_down = _per_step(splitfed)
    out = []
    for method, record in runs.items():
        up, down = _per_step(record)
        out.append(
            {
                "task": name,
                "seed": seed,
                "method": method.name,
                "steps": record["steps"],
                "uplink_bytes_per_step": up,
                "downlink_bytes_per_step": down,
                "splitfed_bytes_per_step": sf_up + sf_down,
                "total_ratio": (sf_up + sf_down) / (up + down),
                "metric": task.metric,
                "value": record["final"][f"eval_{task.metric}"],
                "splitfed_value": splitfed["final"][f"eval_{task.metric}"],
            }
        )
    return out


def _per_step(record: dict[str, Any]) -> tuple[float, float]:
    steps = record["steps"]
    return record["wire_bytes"] / steps, record["wire_bytes_received"] / steps


def _steps(given: list[str], task: str) -> int:
    """The steps of ``task`` from ``--steps`` values "N" or "task=N" (last one wins)."""
    steps = TASKS[task].base.steps
    for item in given:
        name, _, value = item.rpartition("=")
        if name in ("", task):
            steps = int(value)
    return steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument(
        "--steps", nargs="+", default=[], help="N for every task, or TASK=N (default: per task)"
    )
    parser.add_argument("--smoke", action="store_true", help="3 steps of tiny runs")
    parser.add_argument("--downlinks", nargs="+", help="downlinks to try (default: per task)")
    parser.add_argument(
        "--cached-only", action="store_true", help="report the runs kept so far, train nothing"
    )
    parser.add_argument(
        "--f16-codebook", action="store_true", help="also the last downlink, float16 codebooks"
    )
    parser.add_argument(
        "--entropy-uplink",
        action="store_true",
        help="also codewords rANS-coded (float32 and float16 codebooks), default downlink",
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=[0], help="run every method with each seed"
    )
    parser.add_argument("--out", type=Path, help="the JSON file (default: results/traffic.json)")
    args = parser.parse_args(argv)
    steps = {name: 3 if args.smoke else _steps(args.steps, name) for name in args.tasks}
    out = args.out or RESULTS / "traffic.json"
    cache = out.parent / f"{out.stem}-runs"
    rows = records(
        args.tasks,
        steps,
        smoke=args.smoke,
        cache=cache,
        downlinks=args.downlinks,
        f16_codebook=args.f16_codebook,
        entropy_uplink=args.entropy_uplink,
        cached_only=args.cached_only,
        seeds=tuple(args.seeds),
    )
    path = write_result("traffic", {"records": rows}, out)
    for row in rows:
        print(
            f"{row['task']:15} s{row['seed']} {row['method']:45} "
            f"up {row['uplink_bytes_per_step']:>11,.0f} B "
            f"down {row['downlink_bytes_per_step']:>11,.0f} B  x{row['total_ratio']:7.1f}  "
            f"{row['metric']} {row['value']:.4f} (SplitFed {row['splitfed_value']:.4f})"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
