"""Memory: party A's peak RSS while training FEMNIST, and party B's RSS over steps and runs.

Party A (a child process running the product's ``PartyATrainer`` over HTTP against a party
B started on 127.0.0.1, one FEMNIST writer's worth of images, B=20, FedLite q=1152 L=2):
its peak resident set (VmHWM) above that of an idle process that has only imported torch,
against what training needs, counted item by item: bottom parameters and gradients,
optimizer state, the feature table, one batch with the activations autograd saves for the
backward pass (counted with ``saved_tensors_hooks``), the quantizer's buffers and the step's
messages. Target: measured / needed <= 2.

Party B (``fedlite-b serve``): its RSS (VmRSS from /proc) after every 100 steps of one run,
then after each of a series of runs that are created, aligned, trained and finished. Target:
no growth with steps or finished runs (after the first few, which fill its caches).

Party B's bound on runs in memory (``--bounded-only``, ``benchmarks/results/memory-bounded.json``):
runs with a large top model (d=1024 -> 2048 -> 2048 -> 62, Adam: 6.4 M parameters, about
100 MB of weights, gradients and optimizer state each) are opened one after another and
left open (3 steps each, never finished), once on a party B without a bound (1000 runs) and
once with ``--max-live-runs 2``; RSS after each. Target: flat once the open runs pass the
bound.

    python -m benchmarks.scale.memory [--steps 300] [--runs 10]
    python -m benchmarks.scale.memory --bounded-only [--open-runs 10] [--cap 2]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import ROOT, SHARED_DATA, TOKEN, party_b_server, versions, write_result
from loadtests.scenarios import (
    SCENARIOS,
    Scenario,
    StepSchedule,
    hashed_ids,
    read_ids,
    write_label_table,
)

IMAGES = 400  # about two FEMNIST writers' worth: party A in the paper is one client


def _status_kib(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def idle_torch_kib() -> int:
    """Peak RSS of a process that has imported torch and nothing else."""
    code = "import torch, pathlib, re; print(re.search(r'VmHWM:\\s+(\\d+)', pathlib.Path('/proc/self/status').read_text()).group(1))"  # noqa: E501
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout)  # fmt: skip


# ------------------------------------------------------------------------------ party A

_FLOOR = """
import pathlib, re, torch
from shared.models import build_bottom
from shared.pq import GroupedProductQuantizer, PQConfig
bottom = build_bottom("femnist_cnn")
optimizer = torch.optim.SGD(bottom.parameters(), lr=0.01)
quantizer = GroupedProductQuantizer(9216, PQConfig(q=1152, L=2))
x = torch.rand(20, 1, 28, 28)
for step in range(20):
    z = bottom(x)
    quantizer.quantize(z.detach(), seed=step)
    optimizer.zero_grad()
    z.backward(torch.randn_like(z))
    optimizer.step()
status = pathlib.Path("/proc/self/status").read_text()
print(re.search(r"VmHWM:\\s+(\\d+)", status).group(1))
"""


def torch_floor_kib() -> int:
    """Peak RSS of bare torch doing the same bottom steps and quantization, nothing else."""
    done = subprocess.run(
        [sys.executable, "-c", _FLOOR], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip())


def party_a_child(url: str, features: Path, steps: int, state: Path) -> dict[str, Any]:
    """Runs in the child: train, then report peak RSS and the needed bytes, item by item."""
    import torch

    from party_a.config import load_config
    from party_a.features import load_features
    from party_a.store import LocalStore
    from party_a.trainer import PartyATrainer
    from party_a.transport.http import HttpTransport
    from shared.pq import GroupedProductQuantizer, PQConfig

    after_imports = _status_kib("self", "VmHWM")
    config = load_config(
        None,
        {
            "run.name": "memory",
            "run.model": "femnist_cnn",
            "run.steps": steps,
            "run.batch_size": 20,
            "run.seed": 0,
            "run.checkpoint_interval": 50,
            "run.eval_fraction": 0.2,
            "run.use_side_features": False,
            "quantizer.mode": "pq",
            "quantizer.q": 1152,
            "quantizer.L": 2,
            "quantizer.lambda": 1e-4,
            "optimizer.bottom": {"name": "sgd", "lr": 0.01},
            "optimizer.top": {"name": "sgd", "lr": 0.01},
            "data.standardize": False,
        },
    )
    table = load_features(features, id_column="id", feature_columns=None, standardize=False)
    trainer = PartyATrainer(
        config=config,
        features=table,
        transport=HttpTransport(url, TOKEN),
        store=LocalStore.in_directory(state),
        server=url,
    )
    trainer.prepare()
    trainer.train()
    peak = _status_kib("self", "VmHWM")

    # What training needs, counted on the same objects.
    bottom = trainer.bottom
    params = sum(p.numel() * p.element_size() for p in bottom.model.parameters())
    optimizer_state = sum(
        t.numel() * t.element_size()
        for s in bottom.optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t)
    )
    x = torch.from_numpy(table.x[:20]).float()
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        z = bottom.model(x.reshape(-1, 1, 28, 28))
    activations = sum(saved.values()) + z.numel() * z.element_size()
    rows, d, q = 20 * 1152, 9216, 1152
    s = d // q
    quantizer_buffers = (
        rows * s * 4  # points transposed (s, n)
        + 2 * rows * 4  # scores (L=2, n)
        + rows  # comparison mask
        + 2 * rows * 8  # two label buffers
        + 2 * rows * 4  # update weights (2, n)
        + 20 * d * 4  # z~ rebuilt for the correction
        + 1024 * s * 4 * 2  # k-means++ subsample and its distances
    )
    GroupedProductQuantizer(d, PQConfig(q=q, L=2))  # (the sizes above are its, at this shape)
    messages = 3_100 + 3 * 20 * d * 4  # request; response bytes, decoded and corrected grad
    needed = {
        "bottom_parameters": params,
        "bottom_gradients": params,
        "optimizer_state": optimizer_state,
        "feature_table": table.x.nbytes,
        "batch": x.numel() * 4,
        "saved_activations": activations,
        "quantizer_buffers": quantizer_buffers,
        "step_messages": messages,
    }
    trainer.close()
    return {
        "peak_kib": peak,
        "after_imports_kib": after_imports,
        "needed_bytes": needed,
        "steps": steps,
    }


def measure_party_a(url: str, work: Path, ids: list[str], images: np.ndarray, steps: int) -> Any:
    features = work / "features.npz"
    np.savez(features, ids=np.array(ids), x=images.reshape(len(images), -1))
    code = (
        "import json, sys; from pathlib import Path;"
        " from benchmarks.scale.memory import party_a_child;"
        f"print(json.dumps(party_a_child({url!r}, Path({str(features)!r}), {steps},"
        f" Path({str(work / 'a-state')!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    child = json.loads(done.stdout.strip().splitlines()[-1])
    idle = idle_torch_kib()
    floor = torch_floor_kib()
    needed = sum(child["needed_bytes"].values())
    above_idle = (child["peak_kib"] - idle) * 1024
    above_imports = (child["peak_kib"] - child["after_imports_kib"]) * 1024
    return {
        **child,
        "idle_torch_kib": idle,
        "bare_torch_steps_kib": floor,
        "peak_above_idle_torch_bytes": above_idle,
        "peak_above_own_imports_bytes": above_imports,
        "needed_total_bytes": needed,
        "ratio": above_idle / needed,
        "ratio_after_imports": above_imports / needed,
    }


# ------------------------------------------------------------------------------ party B


def party_b_pid(url: str) -> int:
    port = url.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True)
    return int(out.stdout.split("pid=")[1].split(",")[0])


def measure_party_b(url: str, labels: Path, steps: int, runs: int) -> dict[str, Any]:
    pid = party_b_pid(url)
    scenario = SCENARIOS["femnist-fedlite"]
    ids = read_ids(labels)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    client = httpx.Client(base_url=url, headers=headers, timeout=120)

    def start(name: str) -> tuple[str, StepSchedule]:
        spec = scenario.run_create(name, steps=1_000_000, seed=0)
        run = client.post("/v1/runs", json=spec.model_dump(mode="json")).json()
        body = {"hashed_ids": hashed_ids(run["alignment_key"], ids)}
        answer = client.post(f"/v1/runs/{run['id']}/alignment", json=body).json()
        return run["id"], StepSchedule(scenario, spec, answer["intersection"])

    def post_steps(run_id: str, schedule: StepSchedule, first: int, last: int) -> None:
        for t in range(first, last + 1):
            r = client.post(
                f"/v1/runs/{run_id}/steps",
                content=schedule.body(t),
                headers={"Content-Type": "application/msgpack"},
            )
            r.raise_for_status()

    by_steps = []
    run_id, schedule = start("memory-steps")
    for done in range(100, steps + 1, 100):
        post_steps(run_id, schedule, done - 99, done)
        by_steps.append({"steps": done, "rss_kib": _status_kib(pid, "VmRSS")})
    client.post(f"/v1/runs/{run_id}/finish")
    by_runs = []
    for i in range(1, runs + 1):
        run_id, schedule = start(f"memory-run-{i}")
        post_steps(run_id, schedule, 1, 60)
        client.post(f"/v1/runs/{run_id}/finish").raise_for_status()
        by_runs.append({"finished_runs": i + 1, "rss_kib": _status_kib(pid, "VmRSS")})
    client.close()
    steps_growth = by_steps[-1]["rss_kib"] - by_steps[len(by_steps) // 2]["rss_kib"]
    runs_growth = by_runs[-1]["rss_kib"] - by_runs[len(by_runs) // 2]["rss_kib"]
    return {
        "rss_by_steps": by_steps,
        "rss_by_finished_runs": by_runs,
        "growth_second_half_of_steps_kib": steps_growth,
        "growth_second_half_of_runs_kib": runs_growth,
        "peak_kib": _status_kib(pid, "VmHWM"),
    }


# a top model of the size that made party B grow by hundreds of MB per open run
BIG_TOP = Scenario(
    "big-top",
    "tabular_mlp",
    1024,
    20,
    {"mode": "pq", "q": 128, "L": 2, "R": 1},
    top={"hidden": [2048, 2048]},
    note="6.4 M top-model parameters",
)


def measure_open_runs(url: str, labels: Path, runs: int) -> list[dict[str, int]]:
    """Open ``runs`` runs of BIG_TOP one after another (3 steps each, none finished); party
    B's RSS after each."""
    pid = party_b_pid(url)
    ids = read_ids(labels)
    rss = []
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300
    ) as client:
        for i in range(1, runs + 1):
            spec = BIG_TOP.run_create(f"open-{i}", steps=1_000_000, seed=i)
            run = client.post("/v1/runs", json=spec.model_dump(mode="json")).json()
            body = {"hashed_ids": hashed_ids(run["alignment_key"], ids)}
            answer = client.post(f"/v1/runs/{run['id']}/alignment", json=body).json()
            schedule = StepSchedule(BIG_TOP, spec, answer["intersection"])
            for t in (1, 2, 3):
                client.post(
                    f"/v1/runs/{run['id']}/steps",
                    content=schedule.body(t),
                    headers={"Content-Type": "application/msgpack"},
                ).raise_for_status()
            rss.append({"open_runs": i, "rss_kib": _status_kib(pid, "VmRSS")})
            print("open runs", rss[-1], flush=True)
    return rss


def measure_bounded(work: Path, runs: int, cap: int, malloc_tuning: bool) -> dict[str, Any]:
    """RSS as open runs grow, without a bound and with ``--max-live-runs cap``."""
    labels = write_label_table(work / "b-bounded.csv", n=2000)
    curves: dict[str, Any] = {}
    for name, bound in (("unbounded", 1000), ("bounded", cap)):
        with party_b_server(
            work / f"b-{name}",
            labels,
            malloc_tuning=malloc_tuning,
            extra_args=("--max-live-runs", str(bound)),
        ) as url:
            curves[name] = measure_open_runs(url, labels, runs)
    after = curves["bounded"][cap:]  # from the first run past the bound
    unbounded = curves["unbounded"]
    return {
        "cap": cap,
        "top_parameters": 1024 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 62 + 62,
        "rss_unbounded": unbounded,
        "rss_bounded": curves["bounded"],
        "growth_per_run_unbounded_kib": (unbounded[-1]["rss_kib"] - unbounded[0]["rss_kib"])
        / max(len(unbounded) - 1, 1),
        "growth_past_cap_kib": after[-1]["rss_kib"] - after[0]["rss_kib"] if after else None,
        "max_past_cap_kib": max(r["rss_kib"] for r in after) if after else None,
    }


def femnist_images(n: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    path = SHARED_DATA / "femnist_leaf_subset" / "femnist_leaf_subset_uint8.npz"
    if path.exists():
        with np.load(path) as data:
            x = data["x_train"][:n].astype(np.float32) / 255.0
            y = data["y_train"][:n].astype(np.int64)
    else:
        rng = np.random.default_rng(0)
        x = rng.random((n, 28, 28), dtype=np.float32)
        y = rng.integers(0, 62, n)
    return [f"u{i:06d}" for i in range(n)], x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="party A steps; party B steps")
    parser.add_argument("--runs", type=int, default=10, help="finished runs at party B")
    parser.add_argument("--no-malloc-tuning", action="store_true", help="for party B")
    parser.add_argument("--party-a-only", action="store_true")
    parser.add_argument("--bounded-only", action="store_true", help="runs in memory, bounded")
    parser.add_argument("--open-runs", type=int, default=10, help="with --bounded-only")
    parser.add_argument("--cap", type=int, default=2, help="with --bounded-only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.bounded_only:
        main_bounded(args)
        return

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fedlite-mem-") as tmp:
        work = Path(tmp)
        ids, images, labels = femnist_images(IMAGES)
        a_labels = work / "a-labels.csv"
        a_labels.write_text(
            "id,y\n" + "".join(f"{i},{y}\n" for i, y in zip(ids, labels, strict=True))
        )
        with party_b_server(
            work / "b-for-a", a_labels, malloc_tuning=not args.no_malloc_tuning
        ) as url:
            party_a = measure_party_a(url, work, ids, images, args.steps)
        print("party A", json.dumps(party_a), flush=True)
        party_b_result: dict[str, Any] = {}
        if not args.party_a_only:
            b_labels = write_label_table(work / "b-labels.csv", n=2000)
            with party_b_server(
                work / "b", b_labels, malloc_tuning=not args.no_malloc_tuning
            ) as url:
                party_b_result = measure_party_b(url, b_labels, max(args.steps, 600), args.runs)
            print("party B", json.dumps(party_b_result), flush=True)
    path = write_result(
        "memory",
        {
            "versions": versions("torch", "numpy", "fastapi", "uvicorn"),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "party_b_malloc_tuning": not args.no_malloc_tuning,
            "party_a": party_a,
            "party_b": party_b_result,
        },
        args.out,
    )
    print(f"wrote {path}")


def main_bounded(args: argparse.Namespace) -> None:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fedlite-mem-") as tmp:
        result = measure_bounded(Path(tmp), args.open_runs, args.cap, not args.no_malloc_tuning)
    path = write_result(
        "memory-bounded",
        {
            "versions": versions("torch", "numpy", "fastapi", "uvicorn"),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "party_b_malloc_tuning": not args.no_malloc_tuning,
            **result,
        },
        args.out,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
