"""Party B throughput: steps/s and p50/p99 under locust with 1, 4 and 16 concurrent runs, and
its own in-process throughput with the same concurrency (the 80 % target).

Over HTTP: ``loadtests.run``'s ``serve_party_b`` starts ``fedlite-b serve`` on 127.0.0.1
and its ``run_locust`` runs locust headless; steps/s is party B's own count of applied steps
(``/metrics``) over a window that starts after run creation and alignment, p50/p99 and
failures are locust's for the step requests. In process: the same ``Service`` in this
process, one thread per run, each doing what a locust user does per step (build the request
with the product's schedule and codec, call ``Service.step``, decode the gradient and check
its shape), counted over the same kind of window. Both sides therefore spend the same client
work; the difference is HTTP.

    python -m benchmarks.scale.throughput [--scenario femnist-fedlite] [--users 1,4,16]
"""

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import versions, write_result
from loadtests.run import run_locust, serve_party_b, step_figures
from loadtests.scenarios import SCENARIOS, StepSchedule, hashed_ids, read_ids, write_label_table
from party_b.inprocess import in_process_party_b
from party_b.labels import load_label_table
from party_b.service.meetings import now
from shared import codec


def in_process(scenario_name: str, users: int, warmup: float, window: float) -> dict[str, Any]:
    """Steps/s of an in-process Service driven by ``users`` threads, one run each."""
    scenario = SCENARIOS[scenario_name]
    with tempfile.TemporaryDirectory(prefix="fedlite-tp-") as tmp:
        table = write_label_table(Path(tmp) / "labels.csv")
        labels = load_label_table(table, id_column="id", label_column="y", feature_columns=None)
        service, caller = in_process_party_b(labels, Path(tmp) / "b.sqlite")
        ids = read_ids(table)
        _ = scenario.chunk
        schedules = []
        for i in range(users):
            spec = scenario.run_create(f"inproc-{i}", steps=1_000_000, seed=0)
            run = service.runs.create(caller, spec)
            hashed = hashed_ids(run.alignment_key, ids)
            answer = now(service.alignment.align(caller, run.id, hashed))
            schedules.append((run.id, StepSchedule(scenario, spec, answer.intersection)))
        counts = [0] * users
        latencies: list[list[float]] = [[] for _ in range(users)]
        stop = threading.Event()
        counting = threading.Event()

        def drive(i: int) -> None:
            run_id, schedule = schedules[i]
            step = 0
            while not stop.is_set():
                step += 1
                started = time.perf_counter()
                answer = codec.decode_step_response(
                    service.steps.step(caller, run_id, schedule.body(step))
                )
                if answer.grad.shape != (scenario.batch, scenario.cut_dim):
                    raise AssertionError(f"gradient of shape {answer.grad.shape}")
                if counting.is_set():
                    counts[i] += 1
                    latencies[i].append(time.perf_counter() - started)

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(users)]
        for t in threads:
            t.start()
        time.sleep(warmup)
        counting.set()
        t0 = time.perf_counter()
        time.sleep(window)
        counting.clear()
        elapsed = time.perf_counter() - t0
        stop.set()
        for t in threads:
            t.join()
    merged = sorted(x for per in latencies for x in per)
    return {
        "users": users,
        "steps": sum(counts),
        "window_s": elapsed,
        "steps_per_s": sum(counts) / elapsed,
        "p50_ms": 1000 * statistics.median(merged) if merged else None,
        "p99_ms": 1000 * merged[int(0.99 * (len(merged) - 1))] if merged else None,
    }


def over_http(
    scenario: str, users: int, run_time: float, warmup: float, torch_threads: int | None
) -> dict[str, Any]:
    """The load test (``loadtests.run``) against a ``fedlite-b serve`` it starts: the figures
    of its summary."""
    with tempfile.TemporaryDirectory(prefix="fedlite-tp-") as tmp:
        labels = write_label_table(Path(tmp) / "labels.csv")
        with serve_party_b(Path(tmp), labels, torch_threads=torch_threads) as (url, counted):
            summary = run_locust(
                [scenario],
                url,
                labels,
                users=users,
                run_time=run_time,
                warmup=warmup,
                metrics_from=counted,
            )
    return {"users": users, **step_figures(summary)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="femnist-fedlite", choices=list(SCENARIOS))
    parser.add_argument("--users", default="1,4,16")
    parser.add_argument("--window", type=float, default=30.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before it")
    parser.add_argument("--torch-threads", type=int, help="party B's (and in process: ours)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)

    load_before = os.getloadavg()
    counts = [int(u) for u in args.users.split(",")]
    rows = []
    for users in counts:
        http = over_http(
            args.scenario, users, args.warmup + args.window + 2, args.warmup, args.torch_threads
        )
        local = in_process(args.scenario, users, min(args.warmup, 8.0), args.window)
        ratio = (http["steps_per_s"] or 0.0) / local["steps_per_s"]
        rows.append({"users": users, "http": http, "in_process": local, "http_ratio": ratio})
        print(users, "users: http", http, "in-process", local, f"ratio {ratio:.2f}", flush=True)
    suffix = f"-{args.torch_threads}thread" if args.torch_threads else ""
    path = write_result(
        f"throughput-{args.scenario}{suffix}",
        {
            "versions": versions("torch", "fastapi", "uvicorn", "locust"),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "scenario": args.scenario,
            "party_b_torch_threads": args.torch_threads,
            "rows": rows,
        },
        args.out,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
