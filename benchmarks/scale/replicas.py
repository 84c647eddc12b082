"""Party B's throughput with 1, 2 and 4 replicas behind HAProxy on one PostgreSQL, under
locust: steps/s, p50/p99 of a step, failures.

    python -m benchmarks.scale.replicas [--replicas 1,2,4] [--users 8] [--window 40]

Each point is the load test of ``loadtests.run`` against ``serve_party_b(replicas=N)``
(``party_b.ops.stack``: a throwaway PostgreSQL, N ``fedlite-b serve`` replicas with one torch
thread each, HAProxy routing each run to one replica), ``--users`` concurrent runs of the
scenario; steps/s is the replicas' own count of applied steps (``/metrics`` of each, summed)
over a window after run creation and alignment, p50/p99 and failures are locust's for the
step requests. Every party B process, PostgreSQL, HAProxy and locust share this machine's
cores: on a machine with fewer cores than replicas the figure says what replication costs,
not what it gains. Writes ``benchmarks/results/replicas.json`` (rendered into
docs/PERFORMANCE.md by ``benchmarks.report``).
"""

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import versions, write_result
from loadtests.run import run_locust, serve_party_b, step_figures
from loadtests.scenarios import SCENARIOS, write_label_table


def point(scenario: str, replicas: int, users: int, warmup: float, window: float) -> dict[str, Any]:
    """The load test against ``replicas`` replicas of party B behind HAProxy: its figures."""
    with tempfile.TemporaryDirectory(prefix="fedlite-replicas-") as tmp:
        labels = write_label_table(Path(tmp) / "labels.csv")
        with serve_party_b(Path(tmp), labels, replicas=replicas) as (url, counted):
            summary = run_locust(
                [scenario],
                url,
                labels,
                users=users,
                run_time=warmup + window,
                warmup=warmup,
                metrics_from=counted,
            )
    return {"replicas": replicas, "users": users, **step_figures(summary)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="femnist-fedlite", choices=list(SCENARIOS))
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--users", type=int, default=8, help="concurrent runs")
    parser.add_argument("--window", type=float, default=40.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before it")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    for replicas in (int(n) for n in args.replicas.split(",")):
        rows.append(point(args.scenario, replicas, args.users, args.warmup, args.window))
        print(json.dumps(rows[-1]), flush=True)
    path = write_result(
        "replicas",
        {
            "versions": versions("torch", "locust", "sqlalchemy", "psycopg"),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "scenario": args.scenario,
            "haproxy": _haproxy_version(),
            "rows": rows,
        },
        args.out,
    )
    print(f"wrote {path}")


def _haproxy_version() -> str | None:
    try:
        done = subprocess.run(["haproxy", "-v"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return done.stdout.splitlines()[0] if done.stdout else None


if __name__ == "__main__":
    main()
