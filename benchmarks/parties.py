"""Several feature parties against one party holding every feature (issue 24).

    python -m benchmarks.parties                       # default_credit and FEMNIST
    python -m benchmarks.parties --tasks default_credit --seeds 0 1 2 --steps default_credit=600

For each task it trains, through the product over real HTTP (``fedlite-b serve`` in a child
process, feature parties as ``PartyATrainer`` threads of this process):

* **N = 1**: one feature party holding every party A column (a run without ``parties``, as
  runs have always been);
* **N = 2**: the same columns split between two feature parties, each with its own bottom
  model, quantizer and token (``parties``, fusion ``concat``): FATE's default_credit host
  columns halved (5 + 5), FEMNIST's images cut into their left and right 14 columns;

each with FedLite (PQ activations) and SplitFed (raw float32 activations), both with float32
gradients back (the paper's methods, so that the uplink's compression is what differs). The
N = 2 parties' widths, subvector widths and codewords add up to the N = 1 party's: the fused
top model reads a matrix as wide as the single party's, and every row costs the same bits.

Each record has the held-out metric party B computes (AUC for default_credit, accuracy for
FEMNIST), the wire bytes per step of every party both ways, and their total. The target of
issue 24: with FedLite on default_credit, N = 2 within 0.01 AUC of N = 1 (mean over seeds).
Results go to ``benchmarks/results/parties.json``; ``python -m benchmarks.report`` renders
the table of docs/PERFORMANCE.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import RESULTS, TOKEN, versions, write_result
from experiments.tasks import TASK_ENV, TaskData, load_task
from party_a.config import PartyAConfig, load_config
from party_a.features import FeatureTable
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer, TrainSummary
from party_a.transport.http import HttpTransport
from party_a.transport.parties import PartyTransport
from party_b.ops.launch import child_process, free_port, wait_until_healthy
from shared.models import cut_dim

OUT = RESULTS / "parties.json"
TARGET_AUC_GAP = 0.01


@dataclass(frozen=True)
class Setting:
    """A task's training setting and how its columns split between two feature parties."""

    metric: str
    steps: int
    options: dict[str, Any]  # experiments.tasks loader options
    run: dict[str, Any]  # [run] overrides shared by every party
    optimizer: dict[str, Any]
    one: dict[str, Any]  # the single party's bottom and quantizer
    halves: Callable[[TaskData], list[FeatureTable]]  # the two parties' tables
    half: dict[str, Any]  # each of the two parties' bottom and quantizer
    lam: float


def _columns(features: FeatureTable, keep: np.ndarray) -> FeatureTable:
    return replace(features, x=np.ascontiguousarray(features.x[:, keep]),
                   columns=[features.columns[i] for i in keep])  # fmt: skip


def _credit_halves(task: TaskData) -> list[FeatureTable]:
    width = task.features.x.shape[1]
    return [_columns(task.features, np.arange(0, width // 2)),
            _columns(task.features, np.arange(width // 2, width))]  # fmt: skip


def _image_halves(task: TaskData) -> list[FeatureTable]:
    """The left and right 14 columns of every 28x28 image, row-major (28 x 14 each)."""
    pixel = np.arange(784).reshape(28, 28)
    return [_columns(task.features, pixel[:, :14].ravel()),
            _columns(task.features, pixel[:, 14:].ravel())]  # fmt: skip


SETTINGS = {
    # docs/PRIVACY.md's default_credit setting: 600 steps of 256, Adam 0.003, q = 8, L = 16
    # at d = 32 (subvectors of 4); two parties: d = 16 each, q = 4, L = 16 (subvectors of 4)
    "default_credit": Setting(
        metric="auc",
        steps=600,
        options={},
        run={"batch_size": 256, "eval_fraction": 0.2},
        optimizer={"name": "adam", "lr": 0.003},
        one={"bottom": {"hidden": [64], "cut_dim": 32}, "q": 8, "L": 16},
        halves=_credit_halves,
        half={"bottom": {"hidden": [32], "cut_dim": 16}, "q": 4, "L": 16},
        lam=0.001,
    ),
    # the paper's FEMNIST setting (10 writers x 20 images a step, SGD 0.1, q = 1152, L = 2 at
    # d = 9216: subvectors of 8), on the first 40 writers; halves: d = 3840, q = 480, L = 2
    "femnist": Setting(
        metric="accuracy",
        steps=300,
        options={"max_clients": 40},
        run={
            "batch_size": 20,
            "schedule": {"kind": "clients", "clients_per_step": 10},
            "eval_fraction": 0.2,
        },
        optimizer={"name": "sgd", "lr": 0.1},
        one={"bottom": {}, "q": 1152, "L": 2},
        halves=_image_halves,
        half={"bottom": {"width": 14}, "q": 480, "L": 2},
        lam=2e-4,
    ),
}


@contextmanager
def _party_b(task: str, options: dict[str, Any], workdir: Path) -> Iterator[str]:
    """``fedlite-b serve`` on the task's labels (the experiments' factory); its URL."""
    port = free_port()
    env = {
        **os.environ,
        TASK_ENV: json.dumps({"task": task, "options": options}),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "FEDLITE_B_LIMIT_MAX_BATCH": str(1 << 20),
        "FEDLITE_B_LIMIT_MAX_ALIGNED_IDS": str(1 << 24),
        "FEDLITE_B_LIMIT_MAX_BODY_BYTES": str(1 << 30),  # a raw evaluation of FEMNIST
    }
    cmd = [
        sys.executable, "-m", "party_b.ops.cli", "serve", "--port", str(port),
        "--data-dir", str(workdir / "party_b"),
        "--label-source", "experiments.tasks:label_source_from_env",
        "--tokens", f"benchmark:{TOKEN}", "--log-level", "warning",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with child_process(cmd, workdir / "party_b.log", env=env) as proc:
        wait_until_healthy(url, proc, log_path=workdir / "party_b.log", timeout=180)
        yield url


def _config(task: TaskData, setting: Setting, name: str, seed: int, method: str,
            part: dict[str, Any], party: str | None) -> PartyAConfig:  # fmt: skip
    overrides: dict[str, Any] = {
        "run.name": name,
        "run.model": task.model,
        "run.steps": setting.steps,
        "run.seed": seed,
        "run.checkpoint_interval": setting.steps,
        "run.downlink": "float32",  # the paper's methods: what differs is the uplink
        "model.bottom": part["bottom"],
        "model.top": task.top,
        "optimizer.bottom": setting.optimizer,
        "optimizer.top": setting.optimizer,
        "data.standardize": False,  # the task's tables are prepared already
        **{f"run.{k}": v for k, v in setting.run.items()},
    }
    if party is not None:
        overrides["run.party"] = party
    if method == "fedlite":
        overrides |= {"quantizer.mode": "pq", "quantizer.q": part["q"],
                      "quantizer.L": part["L"], "quantizer.lambda": setting.lam}  # fmt: skip
    return load_config(None, overrides)


def _trainer(config: PartyAConfig, features: FeatureTable, transport: HttpTransport,
             url: str, state: Path) -> PartyATrainer:  # fmt: skip
    return PartyATrainer(config=config, features=features, transport=transport,
                         store=LocalStore.in_directory(state), server=url)  # fmt: skip


def _parties_spec(configs: list[tuple[str, PartyAConfig, FeatureTable]]) -> dict[str, Any]:
    """The RunCreate of a run with these parties (what party B's operator would create)."""
    first = configs[0][1]
    spec = first.run_create(cut_dim(first.run.model, **_with_width(first, configs[0][2])))
    created = spec.model_dump(mode="json", exclude={"cut_dim", "quantizer", "downlink"})
    created["grad_dtype"] = "float32"
    created["parties"] = [
        {
            "name": name,
            "cut_dim": cut_dim(config.run.model, **_with_width(config, table)),
            "quantizer": config.quantizer.spec().model_dump(),
            "downlink": "float32",
        }
        for name, config, table in configs
    ]
    return created


def _with_width(config: PartyAConfig, table: FeatureTable) -> dict[str, Any]:
    """The bottom kwargs as the trainer completes them (in_features from its table)."""
    kwargs = dict(config.model.bottom)
    if config.run.model == "tabular_mlp":
        kwargs.setdefault("in_features", table.x.shape[1])
    return kwargs


def _in_threads(calls: list[Callable[[], Any]]) -> list[Any]:
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _session(trainer: PartyATrainer, metric: str) -> tuple[TrainSummary, float]:
    """Prepare (PSI, alignment), train, evaluate: one party's whole run."""
    trainer.prepare()
    summary = trainer.train()
    answer = trainer.evaluate()
    return summary, float(answer.metrics[metric])


def run_case(
    task_name: str, n: int, method: str, seed: int, url: str, work: Path
) -> dict[str, Any]:
    """One run; its record."""
    setting = SETTINGS[task_name]
    task = load_task(task_name, **setting.options)
    name = f"{task_name}-n{n}-{method}-s{seed}"
    started = time.perf_counter()
    if n == 1:
        config = _config(task, setting, name, seed, method, setting.one, None)
        transport = HttpTransport(url, TOKEN, retry_for=600)
        trainers = [_trainer(config, task.features, transport, url, work / name)]
        names = ["all"]
    else:
        names = ["left", "right"]
        tables = setting.halves(task)
        configs = [(p, _config(task, setting, name, seed, method, setting.half, p), t)
                   for p, t in zip(names, tables, strict=True)]  # fmt: skip
        tokens = _create_party_run(url, work, _parties_spec(configs))
        trainers = [
            _trainer(config, table, PartyTransport(url, tokens[p], party=p, retry_for=600),
                     url, work / f"{name}-{p}")
            for p, config, table in configs
        ]  # fmt: skip
    try:
        outcomes = _in_threads([partial(_session, t, setting.metric) for t in trainers])
    finally:
        for trainer in trainers:
            trainer.close()
    values = {outcome[1] for outcome in outcomes}
    assert len(values) == 1, f"the parties got different evaluations: {values}"
    steps = setting.steps
    parties = {
        p: {"up_per_step": s.bytes_sent / steps, "down_per_step": s.bytes_received / steps}
        for p, (s, _v) in zip(names, outcomes, strict=True)
    }
    return {
        "task": task_name,
        "parties": n,
        "method": method,
        "seed": seed,
        "steps": steps,
        "metric": setting.metric,
        "value": values.pop(),
        "bytes_per_step": parties,
        "up_per_step": sum(p["up_per_step"] for p in parties.values()),
        "down_per_step": sum(p["down_per_step"] for p in parties.values()),
        "seconds": time.perf_counter() - started,
    }


def _create_party_run(url: str, work: Path, spec: dict[str, Any]) -> dict[str, str]:
    """The owner creates the run; party B's operator issues its party tokens (the CLI)."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as owner:
        created = owner.post("/v1/runs", json=spec)
    created.raise_for_status()
    issued = subprocess.run(
        [sys.executable, "-m", "party_b.ops.cli", "parties", "tokens",
         "--run", created.json()["id"], "--data-dir", str(work / "party_b")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    tokens: dict[str, str] = json.loads(issued.stdout)["tokens"]
    return tokens


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread over seeds of each (task, N, method), and N = 2's gap to N = 1."""
    out = []
    keys = sorted({(r["task"], r["parties"], r["method"]) for r in records})
    for task, n, method in keys:
        group = [r for r in records if (r["task"], r["parties"], r["method"]) == (task, n, method)]
        values = [r["value"] for r in group]
        out.append(
            {
                "task": task,
                "parties": n,
                "method": method,
                "seeds": len(group),
                "mean": statistics.fmean(values),
                "std": statistics.stdev(values) if len(values) > 1 else None,
                "up_per_step": statistics.fmean(r["up_per_step"] for r in group),
                "down_per_step": statistics.fmean(r["down_per_step"] for r in group),
                "bytes_per_step": group[0]["bytes_per_step"],
            }
        )
    for row in out:
        one = next((o for o in out if (o["task"], o["method"], o["parties"]) ==
                    (row["task"], row["method"], 1)), None)  # fmt: skip
        row["gap_to_one_party"] = row["mean"] - one["mean"] if one else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--femnist-seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", nargs="*", default=[], help="task=steps overrides")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    for item in args.steps:
        task, _, steps = item.partition("=")
        SETTINGS[task] = replace(SETTINGS[task], steps=int(steps))
    records = []
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="parties-bench-") as tmp:
        for task in args.tasks:
            work = Path(tmp) / task
            work.mkdir()
            seeds = args.femnist_seeds if task == "femnist" else args.seeds
            with _party_b(task, SETTINGS[task].options, work) as url:
                for seed in seeds:
                    for method in ("fedlite", "splitfed"):
                        for n in (1, 2):
                            record = run_case(task, n, method, seed, url, work)
                            print(json.dumps(record), flush=True)
                            records.append(record)
    summary = summarize(records)
    credit = {(s["method"], s["parties"]): s for s in summary if s["task"] == "default_credit"}
    gap = credit[("fedlite", 2)]["gap_to_one_party"] if ("fedlite", 2) in credit else None
    doc = {
        "versions": versions("torch", "numpy"),
        "loadavg_before": before,
        "loadavg_after": os.getloadavg(),
        "settings": {
            t: {
                "steps": s.steps,
                "options": s.options,
                "run": s.run,
                "optimizer": s.optimizer,
                "one": s.one,
                "half": s.half,
                "lambda": s.lam,
            }
            for t, s in SETTINGS.items()
            if t in args.tasks
        },  # fmt: skip
        "target": {
            "what": "default_credit, FedLite: N = 2 at most 0.01 AUC below one party holding all "
            "features (mean over seeds)",
            "gap": gap,
            "met": gap is not None and gap >= -TARGET_AUC_GAP,
        },
        "summary": summary,
        "records": records,
    }
    print(f"wrote {write_result('parties', doc, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
