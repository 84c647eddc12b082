"""One worker process of the floor benchmark: every task's floors and product steps, measured
in rounds in this process (``python -m benchmarks.floor --worker OUT`` runs it, in this
checkout or in a baseline tree)."""

import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from benchmarks.floor import measure as m
from benchmarks.floor.tasks import TASKS, http_party_b, http_session, in_process_session

__all__ = ["work"]


def work(tasks: list[str], rounds: int, block: int, warmup: int) -> dict[str, Any]:
    """One worker: every task's floors and product steps, in rounds (this process's code)."""
    parts = m.Parts()
    parts.install(m.A_PARTS + m.B_PARTS)
    cores = os.cpu_count() or 1
    threads = sorted({1, cores})
    out: dict[str, Any] = {
        "loadavg_before": os.getloadavg(),
        "torch_default_threads": torch.get_num_threads(),
        "missing_parts": parts.missing,
    }
    with tempfile.TemporaryDirectory(prefix="fedlite-floor-") as tmp, ExitStack() as stack:
        work_dir = Path(tmp)
        jobs: dict[str, list[tuple[str, Any]]] = {}
        samples: dict[str, dict[str, Any]] = {}
        for name in tasks:
            task = TASKS[name]
            served = stack.enter_context(http_party_b(name, work_dir))
            local, service = in_process_session(task, work_dir, parts.take)
            remote = http_session(task, served.url, work_dir, parts.take)
            stack.callback(local.close)
            stack.callback(remote.close)
            for session in (local, remote):
                session.block(warmup)
            top = m.bare_top(service, local.run_id)
            bottom = m.bare_bottom(local.trainer)
            commit = m.commit_floor(work_dir / f"commit-floor-{name}.sqlite")
            s: dict[str, Any] = {"bare_top": {}, "bare_bottom": {}, "commit": []}
            for n in threads:
                s["bare_top"][str(n)], s["bare_bottom"][str(n)] = [], []
            samples[name] = s
            jobs[name] = _jobs(s, threads, block, top, bottom, commit, local, remote)
            jobs[name] = [
                (kind, _with_server_cpu(s, job, served.pid, block + 1) if kind == "http" else job)
                for kind, job in jobs[name]
            ]
            for _kind, job in jobs[name]:
                job(record=False)  # warm every path once
        for r in range(rounds):
            for name in tasks:
                order = jobs[name][r % len(jobs[name]) :] + jobs[name][: r % len(jobs[name])]
                for _kind, job in order:
                    job(record=True)
    out["samples"] = samples
    out["loadavg_after"] = os.getloadavg()
    return out


def _with_server_cpu(s: dict[str, Any], job: Any, pid: int, steps: int) -> Any:
    """``job`` (the HTTP block of ``steps`` steps, its untimed first one included), also
    keeping what party B's process ``pid`` spent in CPU on them: ``s["http_cpu"]`` gets the
    block's steps and its threads' CPU seconds."""

    def timed_job(record: bool) -> None:
        before = m.thread_cpu(pid)
        job(record)
        after = m.thread_cpu(pid)
        if record and before is not None and after is not None:
            spent = {k: after[k] - before[k] for k in after}
            s.setdefault("http_cpu", []).append({"steps": steps, **spent})

    return timed_job


def _jobs(
    s: dict[str, Any], threads: list[int], block: int, top: Any, bottom: Any, commit: Any,
    local: Any, remote: Any,
) -> list[tuple[str, Any]]:  # fmt: skip
    """The measurement blocks of one task, each ``job(record=...)``, appending to ``s``."""

    def timed(fn: Any, n: int) -> list[float]:
        out = []
        for _ in range(n):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
        return out

    def top_job(n: int) -> Any:
        def job(record: bool) -> None:
            with m.fixed_threads(n):
                times = timed(top, block)
            if record:
                s["bare_top"][str(n)] += times

        return job

    def bottom_job(n: int) -> Any:
        def job(record: bool) -> None:
            with m.fixed_threads(n):
                steps = [bottom(t) for t in range(block)]
            if record:
                s["bare_bottom"][str(n)] += steps

        return job

    def commit_job(record: bool) -> None:
        times = timed(commit, block)
        if record:
            s["commit"] += times

    def session_job(key: str, session: Any) -> Any:
        def job(record: bool) -> None:
            got = session.block(block + 1)  # the block's first step is not timed
            if record:
                kept = s.setdefault(key, {"party_a": [], "round_trip": [], "parts": []})
                kept["party_a"] += got.party_a
                kept["round_trip"] += got.round_trip
                kept["parts"] += got.parts

        return job

    out: list[tuple[str, Any]] = []
    for n in threads:
        out += [(f"top{n}", top_job(n)), (f"bottom{n}", bottom_job(n))]
    out += [("commit", commit_job)]
    out += [("inprocess", session_job("inprocess", local)), ("http", session_job("http", remote))]
    return out
