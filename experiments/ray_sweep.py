"""A sweep's jobs as Ray tasks: ``python -m experiments.sweep NAME --ray [--ray-address ADDR]``.

Without ``--ray-address`` a local Ray instance is started with ``--jobs`` CPUs and stopped at
the end; with it the jobs go to that cluster (``ray://head:10001`` or ``auto``), each task
one CPU. The driver keeps the records, as the process pool does (``experiments.sweep``):

* it submits only the jobs whose record is missing, so a finished record is never run again
  and an interrupted sweep resumes by running the same command again;
* a task returns its record (and its artifacts, e.g. a trained bottom model) instead of
  writing them, and the driver writes each one atomically as its task ends. So the results
  land on the driver's disk whichever node trained, and a killed driver leaves no half
  record;
* a job that raises is reported FAILED with its traceback, like in the pool; a task whose
  worker died is retried by Ray (``max_retries``), then reported FAILED.

Ray's scheduler replaces the pool and the ``<key>.lock`` files: one driver hands each job to
one task. Two drivers on one sweep would repeat work; split a sweep between them with
``--shard`` instead. The code reaches the workers as it is on the driver: by ``PYTHONPATH``
on a local instance, as Ray's ``working_dir`` (uploaded) on a cluster. The data
(``../shared/data`` or ``$FEDLITE_DATA``) must be at the same path on every node of a cluster.

Ray is in the ``experiments`` extra only; the product never imports it.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.sweeps import Job
from experiments.tasks import data_dir

__all__ = ["run_on_ray"]

ROOT = Path(__file__).resolve().parents[1]
# what a cluster's working_dir upload leaves out: environments, results, caches
_NOT_UPLOADED = [
    ".git", ".venv", "experiments/results", "benchmarks/results", "**/__pycache__",
    ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
]  # fmt: skip

# key, seconds, record (None when it failed), artifacts {file name: bytes}, error
Outcome = tuple[str, float, dict[str, Any] | None, dict[str, bytes], str | None]


def run_job_task(job: Job) -> Outcome:
    """One job, on a Ray worker: its record and artifacts, or the traceback of its failure."""
    import torch

    from experiments.sweeps import run_job

    torch.set_num_threads(1)  # one CPU per task, as one per pool process
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedlite-ray-") as scratch:
        try:
            record = run_job(job, Path(scratch))
        except Exception:
            return job.key, time.perf_counter() - started, None, {}, traceback.format_exc()
        artifacts = {p.name: p.read_bytes() for p in Path(scratch).iterdir() if p.is_file()}
    return job.key, time.perf_counter() - started, record, artifacts, None


def run_on_ray(
    jobs: list[Job],
    directory: Path,
    *,
    address: str | None,
    cpus: int,
    save: Callable[[Path, dict[str, Any]], None],
    report: Callable[[str, float, str | None], list[str]],
) -> list[str]:
    """Run ``jobs`` as Ray tasks; ``save`` writes each record into ``directory`` as it
    arrives and ``report`` prints its outcome. Returns the keys that failed."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves this host
    if address is None:
        ray.init(
            num_cpus=max(1, cpus),
            include_dashboard=False,
            object_store_memory=256 * 2**20,  # records and bottom models: small
            runtime_env={"env_vars": _local_env()},
        )
    else:
        ray.init(
            address=address,
            runtime_env={"working_dir": str(ROOT), "excludes": _NOT_UPLOADED},
        )
    failed: list[str] = []
    try:
        task = ray.remote(num_cpus=1)(run_job_task)
        pending = {task.remote(job): job for job in jobs}
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ref)
            try:
                key, seconds, record, artifacts, error = ray.get(ref)
            except ray.exceptions.RayError as exc:  # the worker died, Ray's retries spent
                key, seconds, record, artifacts, error = job.key, 0.0, None, {}, repr(exc)
            if record is not None:
                for name, data in artifacts.items():
                    partial = directory / f".{name}.partial"
                    partial.write_bytes(data)
                    partial.replace(directory / name)
                save(directory / f"{key}.json", record)
            failed += report(key, seconds, error)
    finally:
        ray.shutdown()
    return failed


def _local_env() -> dict[str, str]:
    """The workers of a local instance import this checkout and read the same data."""
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "PYTHONPATH": os.pathsep.join(path),
        "FEDLITE_DATA": str(data_dir()),
        "OMP_NUM_THREADS": "1",
    }
