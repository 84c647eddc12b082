"""The long runs on one GPU machine, in one command with a wall-time budget, packed for the trip
back: as many runs as fit, most important first, in parallel processes sharing the card.

    python -m experiments.gpu_batch --budget-seconds 330 --out DIR [--data-dir gpu-data]
    python -m experiments.gpu_batch --smoke --budget-seconds 60 --out /tmp/x   # CPU, tiny

The runs are the sweeps of ``experiments.sweeps.GPU_SWEEPS`` (the FEMNIST headline pair at two
learning rates and three seeds; then next-token; then SO tags), each configured to 20,000 steps
and cut at the batch's deadline (``experiments.runner.run_split``): a run's record is the
record of the steps it reached, at its last evaluation, with ``cut_from`` naming the run as
configured. Runs start in priority order as worker processes free up (one run per process,
``--workers``, default one per CPU core), never later than ``--min-start-seconds`` before the
deadline. Every process trains both parties on the device (party B in process, as
``experiments.runner`` does), with ``cpu count / workers`` torch threads.

Everything lands under ``--work`` (default: a fresh temporary directory), one folder per sweep
as ``experiments/results/<sweep>/`` has them (records, the partial record of a run that was
killed, ``summary.csv``), and is packed into ``DIR/gpu-results.tar.gz`` with ``gpu-batch.json``
(what ran, how far, how long). Unpack it into ``experiments/results/`` and run
``python -m experiments.headline`` to regenerate the tables. Progress goes to stdout: a line
per run started and ended, and every 30 s each running run's last evaluated step.

Budget: the deadline is ``--budget-seconds`` after the start minus ``--pack-seconds`` (for
the last evaluations and the packing); a run still going ``--grace-seconds`` after the
deadline is killed (its partial record is kept).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import asdict
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from experiments.runner import RunConfig, run_split
from experiments.sweep import PARTIAL, load_records, write_summary
from experiments.sweeps import GPU_SWEEPS, SWEEPS, Job

__all__ = ["main", "plan"]

ARCHIVE = "gpu-results.tar.gz"
REPORT = "gpu-batch.json"


def plan(sweeps: tuple[str, ...], *, smoke: bool, device: str | None) -> list[tuple[str, Job]]:
    """(sweep, job) in priority order: the sweeps in the order given, each in its own order."""
    jobs: list[tuple[str, Job]] = []
    for name in sweeps:
        for job in SWEEPS[name].jobs(smoke=smoke):
            if device is not None and isinstance(job, RunConfig):
                job = RunConfig(**{**asdict(job), "device": device})
            jobs.append((name, job))
    return jobs


def _done(job: Job, directory: Path) -> bool:
    """A record of this run exists (as configured, or cut from it at an earlier deadline)."""
    if (directory / f"{job.key}.json").exists():
        return True
    return any(r.get("cut_from") == job.key for r in load_records(directory))


# ---------------------------------------------------------------------------------------------
# One run, in its own process
# ---------------------------------------------------------------------------------------------


def _child(job: RunConfig, directory: str, deadline: float, threads: int, status: str) -> None:
    """Run ``job`` until it ends or the deadline cuts it; write its record (under the key of
    the steps it reached) and a status file for the driver."""
    import torch

    torch.set_num_threads(threads)
    where = Path(directory)
    partial = where / f"{job.key}{PARTIAL}"
    started = time.time()
    outcome: dict[str, Any] = {"key": job.key}
    try:
        record = run_split(job, progress=partial, deadline=deadline)
        path = where / f"{record['key']}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1, default=float))
        tmp.replace(path)
        partial.unlink(missing_ok=True)
        outcome.update(state="cut" if "cut_from" in record else "finished", record=record["key"])
        outcome.update(steps=record["steps"], final=record["final"])
    except Exception:
        outcome.update(state="failed", error=traceback.format_exc())
    outcome["seconds"] = time.time() - started
    Path(status).write_text(json.dumps(outcome, default=float))
    line = {k: v for k, v in outcome.items() if k not in ("error", "final")}
    print(f"  ended {json.dumps(line, default=float)}", flush=True)
    if outcome["state"] == "failed":
        print(outcome["error"], file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------


class _Batch:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.started = time.time()
        self.deadline: float = self.started + args.budget_seconds - args.pack_seconds
        self.workers = max(1, args.workers)
        self.threads = max(1, (os.cpu_count() or 1) // self.workers)
        self.context = multiprocessing.get_context("spawn")
        self.running: dict[str, tuple[BaseProcess, str, Path, float]] = {}
        self.outcomes: list[dict[str, Any]] = []

    def run(self, jobs: list[tuple[str, Job]]) -> None:
        queue = list(jobs)
        beat = time.time()
        while queue or self.running:
            self._reap()
            while queue and len(self.running) < self.workers:
                sweep, job = queue[0]
                if time.time() > self.deadline - self.args.min_start_seconds:
                    for sweep, job in queue:
                        self.outcomes.append({"sweep": sweep, "key": job.key, "state": "not run"})
                    queue.clear()
                    break
                queue.pop(0)
                self._start(sweep, job)
            if time.time() > self.deadline + self.args.grace_seconds:
                self._kill_all()
                break
            if time.time() - beat >= 30:
                beat = time.time()
                self._heartbeat()
            time.sleep(0.5)

    def _start(self, sweep: str, job: Job) -> None:
        directory = self.work / sweep
        directory.mkdir(parents=True, exist_ok=True)
        if _done(job, directory):
            self.outcomes.append({"sweep": sweep, "key": job.key, "state": "had a record"})
            return
        if not isinstance(job, RunConfig):
            self.outcomes.append({"sweep": sweep, "key": job.key, "state": "not a split run"})
            return
        status = directory / f"{job.key}.status"
        status.unlink(missing_ok=True)
        process = self.context.Process(
            target=_child,
            args=(job, str(directory), self.deadline, self.threads, str(status)),
            name=job.key,
        )
        process.start()
        self.running[job.key] = (process, sweep, status, time.time())
        print(f"  start {job.key} ({sweep}, {self._left():.0f} s to the deadline)", flush=True)

    def _reap(self) -> None:
        for key, (process, sweep, status, started) in list(self.running.items()):
            if process.is_alive():
                continue
            process.join()
            outcome: dict[str, Any] = {
                "key": key,
                "state": "crashed",
                "exit_code": process.exitcode,
            }
            if status.exists():
                outcome = json.loads(status.read_text())
                status.unlink()
            outcome.update(sweep=sweep, wall_seconds=time.time() - started)
            self.outcomes.append(outcome)
            del self.running[key]

    def _kill_all(self) -> None:
        print("  grace period over: killing the runs still going", flush=True)
        for process, *_ in self.running.values():
            process.kill()
        for key, (process, sweep, _, started) in self.running.items():
            process.join()
            killed = {"sweep": sweep, "key": key, "state": "killed"}
            self.outcomes.append({**killed, "wall_seconds": time.time() - started})
        self.running.clear()

    def _heartbeat(self) -> None:
        parts = []
        for key, (_, sweep, _, _) in self.running.items():
            partial = self.work / sweep / f"{key}{PARTIAL}"
            step = "-"
            if partial.exists():
                try:
                    step = str(json.loads(partial.read_text())["steps"])
                except (ValueError, KeyError):
                    pass
            parts.append(f"{key.split('-T')[0]}@{step}")
        print(f"  [{time.time() - self.started:.0f} s] {'; '.join(parts)}", flush=True)

    def _left(self) -> float:
        return self.deadline - time.time()

    def pack(self, out: Path, sweeps: tuple[str, ...]) -> Path:
        """summary.csv per sweep, the report, and one tar.gz of it all into ``out``."""
        out.mkdir(parents=True, exist_ok=True)
        for name in sweeps:
            directory = self.work / name
            if directory.exists() and load_records(directory):
                write_summary(directory)
        report = {
            "budget_seconds": self.args.budget_seconds,
            "wall_seconds": time.time() - self.started,
            "workers": self.workers,
            "torch_threads_per_worker": self.threads,
            "cpu_count": os.cpu_count(),
            "runs": self.outcomes,
        }
        (self.work / REPORT).write_text(json.dumps(report, indent=1, default=float))
        (out / REPORT).write_text(json.dumps(report, indent=1, default=float))
        archive = out / ARCHIVE
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(self.work / REPORT, arcname=REPORT)
            for name in sweeps:
                directory = self.work / name
                for path in sorted(directory.glob("*")) if directory.exists() else []:
                    if path.suffix in (".json", ".csv"):
                        tar.add(path, arcname=f"{name}/{path.name}")
        return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.gpu_batch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="where the tar.gz goes")
    parser.add_argument("--budget-seconds", type=float, default=330.0)
    parser.add_argument("--pack-seconds", type=float, default=20.0)
    parser.add_argument("--grace-seconds", type=float, default=15.0)
    parser.add_argument("--min-start-seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--work", type=Path, help="results root (default: a temporary one)")
    parser.add_argument("--data-dir", type=Path, help="the data sets (default $FEDLITE_DATA)")
    parser.add_argument("--sweeps", default=",".join(GPU_SWEEPS), help="comma-separated")
    parser.add_argument(
        "--match", help="only the runs whose key holds this text (e.g. lr0.1- for one rate)"
    )
    parser.add_argument("--device", help="run every job on this device instead (cpu, auto)")
    parser.add_argument("--smoke", action="store_true", help="the sweeps' smoke runs (CPU)")
    args = parser.parse_args(argv)
    sweeps = tuple(s for s in args.sweeps.split(",") if s)
    unknown = [s for s in sweeps if s not in SWEEPS]
    if unknown:
        parser.error(f"unknown sweeps {unknown}; known: {sorted(SWEEPS)}")
    if args.data_dir is not None:
        os.environ["FEDLITE_DATA"] = str(args.data_dir.resolve())  # the workers inherit it
    work = args.work or Path(tempfile.mkdtemp(prefix="fedlite-gpu-batch-"))
    jobs = plan(sweeps, smoke=args.smoke, device=args.device)
    if args.match:
        jobs = [(sweep, job) for sweep, job in jobs if args.match in job.key]
    batch = _Batch(args, work)
    print(
        f"gpu batch: {len(jobs)} runs, {batch.workers} at a time ({batch.threads} torch threads "
        f"each), deadline in {batch._left():.0f} s, results in {work}",
        flush=True,
    )
    batch.run(jobs)
    archive = batch.pack(args.out, sweeps)
    states: dict[str, int] = {}
    for outcome in batch.outcomes:
        states[outcome["state"]] = states.get(outcome["state"], 0) + 1
    print(f"gpu batch: {states}; wrote {archive}", flush=True)
    return 1 if states.get("failed") or states.get("crashed") else 0


if __name__ == "__main__":
    sys.exit(main())
