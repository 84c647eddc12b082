"""Run a named sweep: resumable, parallel across processes, one JSON record per run.

    python -m experiments.sweep femnist --jobs 2            # the sweep behind the FEMNIST figures
    python -m experiments.sweep femnist --smoke --out /tmp/x # a few steps of every kind of run
    python -m experiments.sweep femnist --http               # its HTTP spot check
    python -m experiments.sweep femnist --ray                # each run a Ray task (local Ray)
    python -m experiments.sweep femnist --ray-address auto   # ... on a running Ray cluster
    python -m experiments.sweep --list

Every run writes ``<out>/<sweep>/<key>.json`` (config, seeds, curve, final metrics, bits)
when it ends; a run whose file exists is skipped, so an interrupted sweep resumes by running
the same command again. ``<out>/<sweep>/summary.csv`` is rewritten from all records at the
end. Jobs run one torch thread each, ``--jobs`` at a time, in one of two ways:

* a pool of worker processes (the default): a run in progress holds ``<key>.lock`` (its
  pid), so several sweep commands on one machine share the work instead of repeating it;
* Ray tasks (``--ray``, ``experiments.ray_sweep``): on a local Ray instance, or on a cluster
  with ``--ray-address``; Ray schedules, the driver writes every record, no lock files.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from experiments.sweeps import SWEEPS, Job, run_job

__all__ = ["main", "run_sweep"]

RESULTS = Path(__file__).resolve().parent / "results"
SMOKE_RESULTS = RESULTS / "smoke"  # git-ignored: smoke records never mix with the real ones
# A run in progress (or cut short) keeps its record so far as <key>.partial.json: not a record
# (load_records skips it), the curve of a run that did not finish
PARTIAL = ".partial.json"


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    os.nice(0)  # inherit the caller's niceness; run the sweep under `nice -n 10`


def _is_sweep_worker(pid: int) -> bool:
    """Whether ``pid`` is a live Python process (a sweep worker). Checking the command line
    matters: a lock written inside a container or sandbox can hold a pid that is some other
    process here (pid 1 is always alive), and would block its run for ever."""
    if pid <= 1:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    return not cmdline.exists() or b"python" in cmdline.read_bytes()


def _claim(lock: Path) -> bool:
    """Create ``lock`` with our pid unless a live process holds it (a stale one is taken)."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                holder = int(lock.read_text() or "0")
            except FileNotFoundError:
                continue
            except ValueError:
                holder = 0
            if _is_sweep_worker(holder):
                return False  # another sweep command is running this job
            lock.unlink(missing_ok=True)  # its owner died: take it over
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return True
    return False


def _run_and_save(args: tuple[Job, str]) -> tuple[str, float, str | None]:
    """Run one job unless another sweep command holds it; write its record atomically."""
    job, directory = args
    path = Path(directory) / f"{job.key}.json"
    lock = path.with_suffix(".lock")
    if path.exists() or not _claim(lock):
        return job.key, 0.0, "skipped"
    started = time.perf_counter()
    partial = path.with_suffix(PARTIAL)
    try:
        try:
            record = run_job(job, Path(directory), progress=partial)
        except Exception:
            return job.key, time.perf_counter() - started, traceback.format_exc()
        save_record(path, record)
        partial.unlink(missing_ok=True)
    finally:
        lock.unlink(missing_ok=True)
    return job.key, time.perf_counter() - started, None


def save_record(path: Path, record: dict[str, Any]) -> None:
    """Write a run's record atomically: a killed sweep never leaves a half-written one."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=float))
    tmp.replace(path)


def run_sweep(
    name: str,
    *,
    out: Path,
    jobs: int,
    smoke: bool = False,
    http: bool = False,
    shard: tuple[int, int] = (0, 1),
    match: str | None = None,
    ray: bool = False,
    ray_address: str | None = None,
) -> list[str]:
    """Run every missing record of sweep ``name`` (of shard i of n: the runs whose index is
    i mod n, so that separate commands can share a sweep; only keys containing ``match`` when
    given); returns the keys that failed. ``ray``: as Ray tasks, on a local instance of
    ``jobs`` CPUs or on the cluster at ``ray_address`` (which implies ``ray``)."""
    sweep = SWEEPS[name]
    todo = sweep.http_check(smoke=smoke) if http else sweep.jobs(smoke=smoke)
    todo = todo[shard[0] :: shard[1]]
    if match is not None:
        todo = [job for job in todo if match in job.key]
    directory = out / (f"{name}-http" if http else name)
    directory.mkdir(parents=True, exist_ok=True)
    missing = [job for job in todo if not (directory / f"{job.key}.json").exists()]
    print(
        f"{name}: {len(todo)} runs, {len(todo) - len(missing)} done, {len(missing)} to run",
        flush=True,
    )
    failed = []
    started = time.perf_counter()
    work = [(job, str(directory)) for job in missing]
    if (ray or ray_address is not None) and missing:
        from experiments.ray_sweep import run_on_ray

        failed += run_on_ray(
            missing, directory, address=ray_address, cpus=jobs, save=save_record, report=_report
        )
    elif jobs <= 1 or len(work) <= 1:
        _init_worker()
        results = map(_run_and_save, work)
        for key, seconds, error in results:
            failed += _report(key, seconds, error)
    else:
        context = multiprocessing.get_context("spawn")
        with context.Pool(jobs, initializer=_init_worker, maxtasksperchild=1) as pool:
            for key, seconds, error in pool.imap_unordered(_run_and_save, work):
                failed += _report(key, seconds, error)
    write_summary(directory)
    if http:
        failed += _compare_http(directory)
    print(
        f"{name}: finished in {time.perf_counter() - started:.0f} s, {len(failed)} failed",
        flush=True,
    )
    return failed


def _compare_http(directory: Path) -> list[str]:
    """The in-process and HTTP records must agree on everything but wall time."""
    records = {r["config"]["transport"]: r for r in load_records(directory)}
    if set(records) != {"inprocess", "http"}:
        return ["http-check: a record is missing"]

    def numbers(record: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in record["curve"]]

    same = numbers(records["inprocess"]) == numbers(records["http"])
    same = same and records["inprocess"]["wire_bytes"] == records["http"]["wire_bytes"]
    verdict = {
        "identical": same,
        "final_inprocess": records["inprocess"]["final"],
        "final_http": records["http"]["final"],
        "seconds": {t: r["seconds"] for t, r in records.items()},
    }
    (directory / "http_check.txt").write_text(json.dumps(verdict, indent=1) + "\n")
    print(f"http check: {'identical' if same else 'DIFFERENT'} {verdict['final_http']}", flush=True)
    return [] if same else ["http-check: the HTTP run differs from the in-process run"]


def _report(key: str, seconds: float, error: str | None) -> list[str]:
    if error == "skipped":
        print(f"  skip {key} (another sweep command is running it)", flush=True)
        return []
    if error is None:
        print(f"  done {key} ({seconds:.0f} s)", flush=True)
        return []
    print(f"  FAILED {key} ({seconds:.0f} s)\n{error}", file=sys.stderr, flush=True)
    return [key]


def load_records(directory: Path, *, partial: bool = False) -> list[dict[str, Any]]:
    """The records of a sweep directory; with ``partial``, those of the runs that did not
    finish (``<key>.partial.json``) instead."""
    paths = sorted(directory.glob("*.json"))
    return [json.loads(p.read_text()) for p in paths if p.name.endswith(PARTIAL) == partial]


def write_summary(directory: Path) -> Path:
    """One CSV row per record: the config's fields, final metrics, ratios and wall time."""
    rows = []
    for record in load_records(directory):
        row: dict[str, Any] = {"key": record["key"]}
        row.update({k: v for k, v in record["config"].items() if not isinstance(v, dict)})
        row.update(record["final"])
        for k in ("paper_ratio", "wire_ratio", "rows_per_step", "seconds"):
            if k in record:
                row[k] = record[k]
        rows.append(row)
    path = directory / "summary.csv"
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.sweep", description=__doc__.split("\n")[0]
    )
    parser.add_argument("sweep", nargs="?", choices=sorted(SWEEPS))
    parser.add_argument(
        "--jobs", type=int, default=2, help="runs at a time (worker processes, or local Ray CPUs)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"results root (default {RESULTS}; with --smoke {SMOKE_RESULTS}, never the "
        "committed results)",
    )
    parser.add_argument("--smoke", action="store_true", help="a few steps of each kind of run")
    parser.add_argument(
        "--http", action="store_true", help="the sweep's HTTP spot check (with --smoke: tiny)"
    )
    parser.add_argument("--list", action="store_true", help="list sweeps and their runs")
    parser.add_argument("--shard", default="0/1", help="i/n: only runs i, i+n, i+2n, ...")
    parser.add_argument("--match", help="only the runs whose key contains this text")
    parser.add_argument(
        "--ray", action="store_true", help="run each job as a Ray task (a local Ray instance)"
    )
    parser.add_argument(
        "--ray-address", help="a running Ray cluster, e.g. auto or ray://head:10001 (implies --ray)"
    )
    args = parser.parse_args(argv)
    if args.list or args.sweep is None:
        for name, sweep in SWEEPS.items():
            print(f"{name}: {len(sweep.jobs(smoke=False))} runs; {sweep.description}")
        return 0
    i, n = (int(v) for v in args.shard.split("/"))
    out = args.out or (SMOKE_RESULTS if args.smoke else RESULTS)
    failed = run_sweep(
        args.sweep, out=out, jobs=args.jobs, smoke=args.smoke, http=args.http, shard=(i, n),
        match=args.match, ray=args.ray, ray_address=args.ray_address,
    )  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
