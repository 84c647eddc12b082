"""Run the load test headless against a party B this script starts on 127.0.0.1.

    python -m loadtests.run                                   # 4 users, 30 s, all scenarios
    python -m loadtests.run --scenarios femnist-fedlite --users 16 --run-time 60s \\
        --max-fail-ratio 0 --max-p99-ms 1500 --out benchmarks/results/locust-16.json

It writes a label table of 20,000 ids (``loadtests.scenarios.write_label_table``) into a
temporary directory, starts ``fedlite-b serve`` on a free port with it (and the glibc malloc
settings of docs/PERFORMANCE.md, unless ``--no-malloc-tuning``), runs locust headless with
``loadtests/locustfile.py``, stops party B and exits with locust's exit code, which the SLO
gate sets to 1 when the failure ratio or the step p99 exceed the thresholds. ``--host URL``
skips starting party B and targets a running one (then ``--labels-csv`` must be its table).
``--replicas N`` starts party B as N replicas on a throwaway PostgreSQL behind HAProxy
(``party_b.ops.stack``, docs/DEPLOY.md) and targets the load balancer.

Besides locust's own figures it reads party B's ``fedlite_b_steps`` counter from
``/metrics`` after ``--warmup`` seconds and at the end of the run, so the reported steps/s
is party B's own count over a window that excludes run creation and alignment.

The benchmarks that load party B (``benchmarks.scale.throughput``, ``benchmarks.scale.replicas``,
``benchmarks.floor.locust``) call ``run_locust`` (and ``serve_party_b``) of this module: one
driver, so that their figures and this command's are counted the same way.
"""

import argparse
import csv
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from loadtests.scenarios import DEFAULT_IDS, SCENARIOS, write_label_table
from party_b.ops.launch import MALLOC_TUNING, local_party_b
from party_b.ops.stack import LocalStack

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
TOKEN = "loadtest-token-0123456789"
# locustfile.py's user class of each scenario, by name: importing the locustfile would import
# locust, whose gevent monkey-patches this process
USER_CLASS_NAMES = {
    "femnist-fedlite": "FemnistFedLite",
    "femnist-splitfed": "FemnistSplitFed",
    "nwp-fedlite": "NwpFedLite",
    "credit-fedlite": "CreditFedLite",
}


@contextmanager
def serve_party_b(
    work: Path,
    labels: Path,
    *,
    replicas: int | None = None,
    torch_threads: int | None = None,
    malloc_tuning: bool = True,
) -> Iterator[tuple[str, list[str]]]:
    """Party B on 127.0.0.1 serving ``labels`` with TOKEN: one ``fedlite-b serve`` (with the
    glibc malloc settings of docs/PERFORMANCE.md unless ``malloc_tuning`` is off), or
    ``replicas`` of it behind HAProxy on a throwaway PostgreSQL (one torch thread each unless
    ``torch_threads``). Yields the URL to load and the URLs whose ``/metrics`` count its steps
    (each replica's: the load balancer has no counter of its own); stops it all at the end."""
    if replicas:
        with LocalStack(
            work / "stack",
            labels,
            f"loadtest:{TOKEN}",
            replicas=replicas,
            torch_threads=torch_threads or 1,
            restart_after=None,
        ) as stack:
            yield stack.url, [r.url for r in stack.members.values()]
        return
    extra = ["--torch-threads", str(torch_threads)] if torch_threads else []
    env = MALLOC_TUNING if malloc_tuning else {}
    with local_party_b(
        work / "party_b", labels, {"loadtest": TOKEN}, extra_args=extra, env=env
    ) as url:
        yield url, [url]


def applied_steps(*urls: str) -> float:
    """Party B's count of applied steps, from its Prometheus text (summed over replicas)."""
    total = 0.0
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10.0).text
        match = re.search(r'^fedlite_b_steps_total\{outcome="applied"\} (\S+)$', text, re.M)
        total += float(match.group(1)) if match else 0.0
    return total


def locust_stats(prefix: Path) -> dict[str, Any]:
    """Per-request-name figures from locust's ``<prefix>_stats.csv``."""
    rows: dict[str, Any] = {}
    with Path(f"{prefix}_stats.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            rows[row["Name"]] = {
                "requests": int(row["Request Count"]),
                "failures": int(row["Failure Count"]),
                "rps": float(row["Requests/s"]),
                "p50_ms": float(row["50%"]),
                "p99_ms": float(row["99%"]),
                "mean_ms": float(row["Average Response Time"]),
                "mean_bytes": float(row["Average Content Size"]),
            }
    return rows


def seconds(duration: str) -> float:
    """'30s', '2m', '90' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    if duration[-1] in units:
        return float(duration[:-1]) * units[duration[-1]]
    return float(duration)


def run_locust(
    scenarios: Sequence[str],
    url: str,
    labels: Path,
    *,
    users: int,
    run_time: float,
    warmup: float,
    max_fail_ratio: float = 0.0,
    max_p99_ms: float = math.inf,
    metrics_from: Sequence[str] = (),
) -> dict[str, Any]:
    """Locust, headless, against the party B at ``url`` whose label table is ``labels``:
    ``users`` concurrent runs of ``scenarios`` for ``run_time`` seconds (whole seconds, as
    locust counts them), each user's requests checked and the SLO gate at the thresholds
    (``max_p99_ms`` infinite: failures alone gate). Party B's applied steps are read from
    ``metrics_from`` (default: ``url``) after ``warmup`` seconds (at most a third of the run)
    and a second before the end, so its steps/s leaves out run creation and alignment.
    Returns the summary: locust's exit code, party B's steps/s over that window, locust's
    figures per request name."""
    counted = list(metrics_from) or [url]
    classes = {name: cls for name, cls in USER_CLASS_NAMES.items() if name in scenarios}
    total = float(round(run_time))  # locust's --run-time counts whole seconds
    with tempfile.TemporaryDirectory(prefix="fedlite-locust-") as tmp:
        prefix = Path(tmp) / "locust"
        cmd = [
            sys.executable, "-m", "locust",
            "-f", str(LOCUSTFILE),
            "--headless", "--only-summary",
            "--host", url,
            "--users", str(users),
            "--spawn-rate", str(users),
            "--run-time", f"{total:.0f}s",
            "--stop-timeout", "30",
            "--csv", str(prefix),
            "--labels-csv", str(labels),
            "--token", TOKEN,
            "--max-fail-ratio", str(max_fail_ratio),
            "--max-p99-ms", str(max_p99_ms),
            "--loglevel", "WARNING",
            *classes.values(),
        ]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT)
        window: dict[str, float] = {}
        end_at = started + total - 1.0
        time.sleep(min(warmup, total / 3))
        if proc.poll() is None:
            window = {"t0": time.monotonic(), "steps0": applied_steps(*counted)}
            time.sleep(max(0.0, end_at - time.monotonic()))
            if proc.poll() is None:
                window.update(t1=time.monotonic(), steps1=applied_steps(*counted))
        code = proc.wait()
        summary: dict[str, Any] = {
            "users": users,
            "replicas": len(counted),
            "scenarios": list(classes),
            "run_time_s": total,
            "exit_code": code,
            "thresholds": {"max_fail_ratio": max_fail_ratio, "max_p99_ms": max_p99_ms},
        }
        if "t1" in window:
            summary["server_window_s"] = window["t1"] - window["t0"]
            summary["server_steps_per_s"] = (window["steps1"] - window["steps0"]) / (
                window["t1"] - window["t0"]
            )
        if Path(f"{prefix}_stats.csv").exists():
            summary["locust"] = locust_stats(prefix)
    return summary


def step_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """What the benchmarks record of a ``run_locust`` summary: locust's exit code, party B's
    steps/s over the window, locust's count, p50 and p99 of the step requests and its
    failures over every request."""
    by_name = summary.get("locust", {})
    step: dict[str, Any] = next((v for k, v in by_name.items() if "/steps" in k), {})
    return {
        "exit_code": summary["exit_code"],
        "steps_per_s": summary.get("server_steps_per_s"),
        "window_s": summary.get("server_window_s"),
        "locust_steps": step.get("requests"),
        "failures": by_name.get("Aggregated", {}).get("failures"),
        "p50_ms": step.get("p50_ms"),
        "p99_ms": step.get("p99_ms"),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start party B (unless --host), run locust against it, return the summary."""
    with tempfile.TemporaryDirectory(prefix="fedlite-load-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        labels = args.labels_csv or write_label_table(work / "labels.csv", n=args.ids)
        if args.host:
            url, counted = args.host, [args.host]
        else:
            url, counted = stack.enter_context(
                serve_party_b(
                    work,
                    labels,
                    replicas=args.replicas,
                    torch_threads=args.torch_threads,
                    malloc_tuning=not args.no_malloc_tuning,
                )
            )
        return run_locust(
            args.scenarios,
            url,
            labels,
            users=args.users,
            run_time=seconds(args.run_time),
            warmup=args.warmup,
            max_fail_ratio=args.max_fail_ratio,
            max_p99_ms=args.max_p99_ms,
            metrics_from=counted,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        type=lambda s: [x for x in s.split(",") if x],
        help=f"comma-separated, from {', '.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument("--users", type=int, default=4, help="concurrent runs")
    parser.add_argument("--run-time", default="30s")
    parser.add_argument("--warmup", type=float, default=8.0, help="s before the server window")
    parser.add_argument("--max-fail-ratio", type=float, default=0.0)
    parser.add_argument("--max-p99-ms", type=float, default=2000.0)
    parser.add_argument(
        "--ids", type=int, default=DEFAULT_IDS, help="ids in the generated label table"
    )
    parser.add_argument("--host", help="target a running party B instead of starting one")
    parser.add_argument("--labels-csv", type=Path, help="the running party B's label table")
    parser.add_argument("--no-malloc-tuning", action="store_true")
    parser.add_argument("--torch-threads", type=int, help="party B's torch threads")
    parser.add_argument(
        "--replicas", type=int, help="party B as N replicas behind HAProxy on PostgreSQL"
    )
    parser.add_argument("--out", type=Path, help="write the summary as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        print(f"unknown scenarios {sorted(unknown)}; known: {list(SCENARIOS)}", file=sys.stderr)
        return 2
    # every step's batch must fit in the training split (80 % of the ids)
    needed = max(SCENARIOS[name].batch for name in args.scenarios) * 5 // 4 + 1
    if not args.labels_csv and args.ids < needed:
        print(f"--ids {args.ids} is too few for a batch of these scenarios: need {needed}")
        return 2
    if args.replicas is not None and (args.replicas < 1 or args.host):
        print("--replicas needs a count of at least 1, and no --host", file=sys.stderr)
        return 2
    if args.host and not args.labels_csv:
        print("--host needs --labels-csv (the running party B's label table)", file=sys.stderr)
        return 2
    summary = run(args)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return int(summary["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
