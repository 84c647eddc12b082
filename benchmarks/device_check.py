"""The GPU path, checked on a machine that has one: both parties on the card, determinism,
checkpoints across devices, the torch k-means against the CPU kernels, and speed.

    make device-check                                     # = the line below, ~3 min on an H100
    python -m benchmarks.device_check --out DIR [--data-dir gpu-data]
    python -m benchmarks.device_check --cpu-smoke --out /tmp/x   # the same checks, tiny, CPU

Writes ``DIR/device_check.json`` (``benchmarks/results/`` by default; ``python -m
benchmarks.report`` renders it into docs/PERFORMANCE.md) and exits 1 if a check failed:

* ``breast``: FATE breast, FedLite (q = 8, L = 4), 100 steps, both parties on the device.
* ``femnist_resume``: a small FEMNIST FedLite run (q = 1152, L = 2, 10 writers a step,
  checkpoints every 20 steps) killed with SIGKILL at step 33 in a child process and resumed
  in another: its final bottom and top models and held-out metrics must be bit-identical to
  an uninterrupted run's on the same device.
* ``across_devices``: the killed run's GPU-written checkpoints resumed on the CPU, killed again
  after a CPU-written checkpoint, and finished on the GPU: it must run to the end (the
  numbers are not expected to match: other kernels round differently).
* ``kmeans``: FEMNIST activations (the trained bottom, 10 chunks of 20 images) quantized by
  the torch backend on the device and by the numba kernels on the CPU: codeword agreement,
  codebook differences, relative errors, run-to-run bits, time per chunk.
* ``speed``: steps/s of FEMNIST and next-token (SplitFed and FedLite) with both parties on
  the device against both on the CPU (all cores).

``--cpu-smoke`` runs every check on the CPU at toy sizes (the kill and resume in child
processes included): what CI and a machine without a GPU can verify of this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import RESULTS, versions, write_result
from experiments.runner import EXPERIMENT_LIMITS, RunConfig, run_split
from experiments.sweeps import FEMNIST, HEADLINE_LAMBDA, SHAKESPEARE
from experiments.tasks import load_task
from party_a.config import load_config
from party_a.errors import problem_from_body
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_b.device import use_device
from party_b.inprocess import InProcessTransport, in_process_party_b
from shared.devices import describe, resolve_device
from shared.pq import GroupedProductQuantizer, PQConfig, relative_error
from shared.training import state_sha256

__all__ = ["main"]


@dataclass(frozen=True)
class Sizes:
    """How big each check is: the real check, or the CPU smoke."""

    breast_steps: int
    femnist: RunConfig  # the resume check's run (its steps, clients per step, writers)
    checkpoint_interval: int
    kill_at: int  # SIGKILL after this step (between checkpoints)
    kill_again_at: int  # ...and on the CPU, after a CPU-written checkpoint
    kmeans_shapes: tuple[tuple[int, int, int], ...]  # (q, R, L)
    kmeans_chunks: int
    speed_warmup: int
    speed_steps: int  # timed steps on the device
    cpu_speed_steps: int
    speed_options: dict[str, dict[str, Any]]  # task -> RunConfig fields (smaller runs)


FULL = Sizes(
    breast_steps=100,
    femnist=replace(
        FEMNIST, method="fedlite", q=1152, L=2, lam=HEADLINE_LAMBDA, steps=60, save_bottom=False
    ),
    checkpoint_interval=20,
    kill_at=33,
    kill_again_at=47,
    kmeans_shapes=((1152, 1, 2), (4608, 1, 2), (288, 1, 16), (144, 1, 32), (4608, 1152, 4)),
    kmeans_chunks=10,
    speed_warmup=10,
    speed_steps=50,
    cpu_speed_steps=8,
    speed_options={"femnist": {}, "shakespeare": {}},
)
SMOKE = Sizes(
    breast_steps=6,
    femnist=replace(FULL.femnist, steps=8, clients_per_step=2, task_options={"max_clients": 6}),
    checkpoint_interval=2,
    kill_at=3,
    kill_again_at=5,
    kmeans_shapes=((1152, 1, 2), (288, 1, 16)),
    kmeans_chunks=2,
    speed_warmup=1,
    speed_steps=2,
    cpu_speed_steps=2,
    speed_options={
        "femnist": {"clients_per_step": 2, "task_options": {"max_clients": 6}},
        "shakespeare": {
            "clients_per_step": 2,
            "eval_fraction": 0.2,
            "task_options": {"max_clients": 6, "vocab_words": 200, "hidden": 32},
        },
    },
)


# ---------------------------------------------------------------------------------------------
# A resumable run: both parties in this process, on one working directory
# ---------------------------------------------------------------------------------------------


def train(
    config: RunConfig, workdir: Path, *, checkpoint_interval: int, kill_at: int | None = None
) -> dict[str, Any]:
    """Train (or resume) ``config`` with party A's and party B's state in ``workdir``; with
    ``kill_at``, SIGKILL this process right after that step. Returns the final models'
    checksums and held-out metrics."""
    task = load_task(config.task, **config.task_options)
    party_a = load_config(
        None, {**config.party_a_config(task), "run.checkpoint_interval": checkpoint_interval}
    )
    use_device(config.device)
    workdir.mkdir(parents=True, exist_ok=True)
    service, caller = in_process_party_b(
        task.labels, workdir / "party_b.sqlite", limits=EXPERIMENT_LIMITS
    )
    transport = InProcessTransport(service, caller, problem=problem_from_body)
    trainer = PartyATrainer(
        config=party_a,
        features=task.features,
        transport=transport,
        store=LocalStore.in_directory(workdir / "party_a"),
        server="in-process",
    )

    def die(result: Any, _summary: Any) -> None:
        if result.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no flush: a crash

    trainer.on_step = die
    try:
        trainer.prepare()
        started = trainer.step
        summary = trainer.train()
        answer = trainer.evaluate()
        remote = transport.get_run(trainer.run_id)
        return {
            "resumed_from": started,
            "steps": summary.last_step,
            "rollbacks": summary.rollbacks,
            "bottom_sha256": state_sha256(trainer.bottom.model.state_dict()),
            "top_sha256": remote.model_sha256,
            "eval": {"loss": answer.loss, **answer.metrics},
        }
    finally:
        trainer.close()


def _child(config: RunConfig, workdir: Path, interval: int, kill_at: int | None) -> dict[str, Any]:
    """``train`` in a fresh process (``--child``); {"exit_code": -9} when it was killed."""
    spec = workdir.parent / f"{workdir.name}-{time.monotonic_ns()}.json"
    spec.write_text(
        json.dumps({"config": asdict(config), "workdir": str(workdir), "interval": interval,
                    "kill_at": kill_at})
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.device_check", "--child", str(spec)],
        capture_output=True,
        text=True,
        env=_with_repo_on_path(),
    )
    result_path = spec.with_suffix(".result.json")
    if result_path.exists():
        return dict(json.loads(result_path.read_text()), exit_code=done.returncode)
    return {"exit_code": done.returncode, "stderr": done.stderr[-3000:]}


def _run_child(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(
            RunConfig(**spec["config"]),
            Path(spec["workdir"]),
            checkpoint_interval=spec["interval"],
            kill_at=spec["kill_at"],
        )
    result["warnings"] = sorted({str(w.message)[:300] for w in caught})
    spec_path.with_suffix(".result.json").write_text(json.dumps(result, default=float))
    return 0


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------


def check_breast(device: str, sizes: Sizes) -> dict[str, Any]:
    config = RunConfig(
        task="breast", method="fedlite", steps=sizes.breast_steps, batch_size=32,
        lr_bottom=0.003, lr_top=0.003, optimizer="adam", q=8, L=4, lam=1e-3,
        eval_fraction=0.2, eval_every=sizes.breast_steps, device=device,
    )  # fmt: skip
    record = run_split(config)
    final = record["final"]
    return {"ok": bool(np.isfinite(final["eval_auc"])), "final": final, **_timing(record)}


def check_resume(device: str, sizes: Sizes, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Uninterrupted against killed-and-resumed on one device; then across devices."""
    config = replace(sizes.femnist, device=device)
    interval = sizes.checkpoint_interval
    whole = train(config, work / "whole", checkpoint_interval=interval)
    killed = _child(config, work / "killed", interval, sizes.kill_at)
    shutil.copytree(work / "killed", work / "across")
    resumed = _child(config, work / "killed", interval, None)
    same = {k: whole.get(k) == resumed.get(k) for k in ("bottom_sha256", "top_sha256", "eval")}
    resume = {
        "ok": killed["exit_code"] == -signal.SIGKILL and all(same.values()),
        "killed_at": sizes.kill_at,
        "killed_exit_code": killed["exit_code"],
        "resumed_from": resumed.get("resumed_from"),
        "bit_identical": same,
        "uninterrupted": whole,
        "resumed": resumed,
    }
    # GPU-written checkpoints resumed on the CPU, killed after a CPU-written one, finished on
    # the device again
    on_cpu = replace(config, device="cpu")
    cpu_part = _child(on_cpu, work / "across", interval, sizes.kill_again_at)
    finished = _child(config, work / "across", interval, None)
    across = {
        "ok": cpu_part["exit_code"] == -signal.SIGKILL
        and finished.get("steps") == config.steps
        and finished.get("resumed_from", 0) >= sizes.kill_again_at // interval * interval,
        "device_to_cpu_exit_code": cpu_part["exit_code"],
        "cpu_to_device": finished,
        "same_as_uninterrupted": finished.get("eval") == whole["eval"],
    }
    return resume, across


def check_kmeans(device: str, sizes: Sizes) -> dict[str, Any]:
    """The torch backend on ``device`` against the numba kernels on the CPU, on activations of
    a FEMNIST bottom (Haiku init) for real images, one chunk of 20 images per writer."""
    task = load_task("femnist", **FEMNIST.task_options)
    from shared.models import build_bottom, build_seeded

    bottom = build_seeded(lambda: build_bottom(task.model, **task.bottom), 0).eval()
    groups = np.array(task.features.groups)
    chunks = []
    for writer in sorted(set(groups.tolist()))[: sizes.kmeans_chunks]:
        rows = np.flatnonzero(groups == writer)[:20]
        with torch.no_grad():
            chunks.append(bottom(torch.from_numpy(task.features.x[rows])))
    on = resolve_device(device)
    shapes = [_compare_kmeans(chunks, on, *shape) for shape in sizes.kmeans_shapes]
    ok = all(
        row["device_run_to_run_identical"]
        and row["relative_error_device"] <= 1.02 * row["relative_error_cpu"] + 1e-6
        for row in shapes
    )
    return {"ok": ok, "cpu_backend": _cpu_backend(), "shapes": shapes}


def _compare_kmeans(
    chunks: list[torch.Tensor], on: torch.device, q: int, r: int, num: int
) -> dict[str, Any]:
    """One (q, R, L): the numba kernels on the CPU, the torch backend on ``on``."""
    seeds = list(range(len(chunks)))
    kernels = GroupedProductQuantizer(9216, PQConfig(q=q, R=r, L=num, backend="numba"))
    quantizer = GroupedProductQuantizer(9216, PQConfig(q=q, R=r, L=num, backend="torch"))
    on_device = [c.to(on) for c in chunks]
    cpu, cpu_s = _timed(lambda: kernels.encode_many(chunks, seeds=seeds), on, repeats=1)
    codes, dev_s = _timed(lambda: quantizer.encode_many(on_device, seeds=seeds), on, repeats=3)
    codes = [_cpu(c) for c in codes]
    again = [_cpu(c) for c in quantizer.encode_many(on_device, seeds=seeds)]
    pairs = list(zip(cpu, codes, strict=True))
    agree = [float((a.codewords == b.codewords).float().mean()) for a, b in pairs]
    return {
        "q": q,
        "R": r,
        "L": num,
        "codeword_agreement_min": min(agree),
        "codeword_agreement_mean": float(np.mean(agree)),
        "codebook_max_abs_diff": max(
            float((a.codebook - b.codebook).abs().max()) for a, b in pairs
        ),
        "relative_error_cpu": _mean_error(quantizer, chunks, cpu),
        "relative_error_device": _mean_error(quantizer, chunks, codes),
        "device_run_to_run_identical": all(
            torch.equal(a.codebook, b.codebook) and torch.equal(a.codewords, b.codewords)
            for a, b in zip(codes, again, strict=True)
        ),
        "cpu_ms_per_chunk": 1000 * cpu_s / len(chunks),
        "device_ms_per_chunk": 1000 * dev_s / len(chunks),
    }


def _mean_error(
    quantizer: GroupedProductQuantizer, chunks: list[torch.Tensor], codes: list[Any]
) -> float:
    return float(
        np.mean(
            [relative_error(z, quantizer.decode(c)) for z, c in zip(chunks, codes, strict=True)]
        )
    )


def check_speed(device: str, sizes: Sizes, work: Path) -> dict[str, Any]:
    """steps/s, both parties on ``device``, then both on the CPU with every core; one working
    directory for all, so that only the first run of a task runs the PSI."""
    femnist = replace(FEMNIST, **sizes.speed_options["femnist"])
    shakespeare = replace(SHAKESPEARE, **sizes.speed_options["shakespeare"])
    configs = [
        ("femnist", femnist),
        ("femnist", replace(femnist, method="fedlite", q=1152, L=2, lam=HEADLINE_LAMBDA)),
        ("shakespeare", shakespeare),
        ("shakespeare", replace(shakespeare, method="fedlite", q=12, L=30, lam=1e-3)),
    ]
    rows = []
    for side, where, timed_steps, threads in (
        ("device", device, sizes.speed_steps, torch.get_num_threads()),
        ("cpu", "cpu", sizes.cpu_speed_steps, os.cpu_count() or 1),
    ):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for task, base in configs:
                folder = work / f"speed-{side}"
                try:
                    row = _steps_per_second(
                        task, base, where, sizes.speed_warmup, timed_steps, folder
                    )
                except Exception as exc:  # e.g. the CPU's FedLite without numba: the others
                    row = {"task": task, "device": where, "error": f"{type(exc).__name__}: {exc}"}
                rows.append({"side": side, **row})
        finally:
            torch.set_num_threads(before)
    return {"ok": all(r.get("steps_per_second", 0) > 0 for r in rows), "rows": rows}


def _steps_per_second(
    task: str, base: RunConfig, device: str, warmup: int, steps: int, folder: Path
) -> dict[str, Any]:
    """One run's steps/s over ``steps`` steps after ``warmup``; ``folder`` holds both parties'
    state (one per device: a run's name leaves the device out, so it must not meet a run of
    the same name trained on the other)."""
    config = replace(
        base, steps=warmup + steps, eval_every=warmup + steps, save_bottom=False, device=device
    )
    marks: dict[int, float] = {}

    def mark(step: int) -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        marks[step] = time.perf_counter()

    run_split(config, workdir=folder, on_step=mark)
    seconds = marks[warmup + steps] - marks[warmup]
    return {
        "task": task,
        "method": base.method if base.method == "splitfed" else f"fedlite q={base.q} L={base.L}",
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "timed_steps": steps,
        "steps_per_second": steps / seconds,
    }


# ---------------------------------------------------------------------------------------------


def _timed(fn: Any, device: torch.device, repeats: int) -> tuple[Any, float]:
    """fn's result and its best wall time (seconds) over ``repeats`` calls after one warm-up."""
    out = fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return out, best


def _with_repo_on_path() -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH (and whatever was there after
    it: packages carried to a GPU machine)."""
    root = str(Path(__file__).resolve().parents[1])
    rest = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{root}:{rest}" if rest else root}


def _cpu(code: Any) -> Any:
    return type(code)(code.codebook.cpu(), code.codewords.cpu())


def _cpu_backend() -> str:
    from shared.pq import kmeans

    return "torch (numba missing)" if kmeans._NUMBA_MISSING is not None else "numba"


def _timing(record: dict[str, Any]) -> dict[str, Any]:
    return {"steps": record["steps"], "seconds": record["seconds"]}


def _warm_numba() -> subprocess.Popen[bytes] | None:
    """Compile the CPU k-means kernels in a background process (numba caches them on disk),
    while the device checks run: the CPU parts of this script then load them in a second."""
    code = (
        "import torch; from shared.pq import GroupedProductQuantizer, PQConfig\n"
        "z = torch.rand(20, 9216)\n"
        "for q, L in ((1152, 2), (288, 16), (144, 32), (4608, 4)):\n"
        "    GroupedProductQuantizer(9216, PQConfig(q=q, L=L)).encode(z, seed=0)\n"
        "GroupedProductQuantizer(96, PQConfig(q=12, L=30)).encode(torch.rand(480, 96), seed=0)\n"
    )
    try:
        return subprocess.Popen([sys.executable, "-c", code], env=_with_repo_on_path())
    except OSError:
        return None


def run_checks(device: str, sizes: Sizes, work: Path, out: Path, mode: str) -> dict[str, Any]:
    """Every check in turn; the record so far is written to ``out`` after each one, so that a
    run stopped by a time limit still leaves what it measured."""
    warm = _warm_numba()
    result: dict[str, Any] = {
        "mode": mode,
        "device": describe(resolve_device(device)),
        "versions": versions("numpy", "numba", "llvmlite", "msgpack", "sqlalchemy"),
        "checks": {},
    }
    checks = result["checks"]
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, check in (
            ("breast", lambda: check_breast(device, sizes)),
            ("femnist_resume", lambda: check_resume(device, sizes, work)),
            ("kmeans", lambda: check_kmeans(device, sizes)),
            ("speed", lambda: check_speed(device, sizes, work)),
        ):
            if name == "kmeans" and warm is not None:
                warm.wait(timeout=300)  # the CPU kernels, compiled by now
            t = time.perf_counter()
            try:
                outcome = check()
            except Exception as exc:  # a broken check is a result, not the end of the others
                outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            if name == "femnist_resume" and isinstance(outcome, tuple):
                checks["femnist_resume"], checks["across_devices"] = outcome
            else:
                checks[name] = outcome
            print(f"  {name}: {'ok' if _ok(checks, name) else 'FAILED'} "
                  f"({time.perf_counter() - t:.0f} s)", flush=True)  # fmt: skip
            result["warnings"] = sorted({str(w.message)[:300] for w in caught})
            result["seconds"] = time.perf_counter() - started
            write_result("device_check", result, out)
    return result


def _ok(checks: dict[str, Any], name: str) -> bool:
    names = ("femnist_resume", "across_devices") if name == "femnist_resume" else (name,)
    return all(bool(checks.get(n, {}).get("ok")) for n in names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.device_check")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of device_check.json")
    parser.add_argument("--device", default="cuda", help="the device to check (default cuda)")
    parser.add_argument("--data-dir", type=Path, help="the data sets (default $FEDLITE_DATA)")
    parser.add_argument("--cpu-smoke", action="store_true", help="every check, tiny, on the CPU")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return _run_child(args.child)
    if args.data_dir is not None:
        os.environ["FEDLITE_DATA"] = str(args.data_dir.resolve())
    device, sizes = ("cpu", SMOKE) if args.cpu_smoke else (args.device, FULL)
    resolve_device(device)  # DeviceUnavailable (one line) before anything runs
    print(f"device check on {describe(resolve_device(device))}", flush=True)
    path = args.out / "device_check.json"
    mode = "cpu-smoke" if args.cpu_smoke else "full"
    with tempfile.TemporaryDirectory(prefix="fedlite-device-check-") as work:
        result = run_checks(device, sizes, Path(work), path, mode)
    failed = [name for name in result["checks"] if not result["checks"][name].get("ok")]
    print(f"wrote {path}; {'all checks passed' if not failed else f'FAILED: {failed}'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
