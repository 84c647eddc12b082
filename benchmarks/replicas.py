"""Party B's throughput with 1, 2 and 4 replicas behind HAProxy on one PostgreSQL, under
locust: steps/s, p50/p99 of a step, failures.

    python -m benchmarks.replicas [--replicas 1,2,4] [--users 8] [--window 40]

Each point is ``python -m loadtests.run --replicas N`` (``party_b.ops.stack``: a throwaway
PostgreSQL, N ``fedlite-b serve`` replicas with one torch thread each, HAProxy routing each
run to one replica), ``--users`` concurrent runs of the scenario; steps/s is the replicas'
own count of applied steps (``/metrics`` of each, summed) over a window after run creation
and alignment, p50/p99 and failures are locust's for the step requests. Every party B
process, PostgreSQL, HAProxy and locust share this machine's cores: on a machine with fewer
cores than replicas the figure says what replication costs, not what it gains. Writes
``benchmarks/results/replicas.json`` (rendered into docs/PERFORMANCE.md by
``benchmarks.report``).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, versions, write_result
from loadtests.scenarios import SCENARIOS


def point(scenario: str, replicas: int, users: int, warmup: float, window: float) -> dict[str, Any]:
    """One ``loadtests.run --replicas`` and its summary."""
    with tempfile.TemporaryDirectory(prefix="fedlite-replicas-") as tmp:
        out = Path(tmp) / "summary.json"
        code = subprocess.run(
            [
                sys.executable,
                "-m",
                "loadtests.run",
                "--replicas",
                str(replicas),
                "--scenarios",
                scenario,
                "--users",
                str(users),
                "--run-time",
                f"{warmup + window:.0f}s",
                "--warmup",
                str(warmup),
                "--max-fail-ratio",
                "0",
                "--max-p99-ms",
                "1000000",
                "--out",
                str(out),
            ],  # fmt: skip
            cwd=ROOT,
            check=False,
        ).returncode
        summary: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    steps = {k: v for k, v in summary.get("locust", {}).items() if "/steps" in k}
    step: dict[str, Any] = next(iter(steps.values()), {})
    return {
        "replicas": replicas,
        "users": users,
        "exit_code": code,
        "steps_per_s": summary.get("server_steps_per_s"),
        "window_s": summary.get("server_window_s"),
        "locust_steps": step.get("requests"),
        "failures": summary.get("locust", {}).get("Aggregated", {}).get("failures"),
        "p50_ms": step.get("p50_ms"),
        "p99_ms": step.get("p99_ms"),
    }


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
