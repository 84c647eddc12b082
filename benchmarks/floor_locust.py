"""Party B's steps/s under locust on small steps, before and after (issue 27's last target).

    python -m benchmarks.floor_locust --baseline f352584 [--candidate REV] [--pairs 3]

Each version's ``fedlite-b serve`` (its own tree: ``git archive``, as ``benchmarks.floor``
does) serves a 20,000-id label table on 127.0.0.1 with the product's defaults, and this
checkout's load test (``python -m loadtests.run --host ...``, the ``credit-fedlite``
scenario: B=256, d=32, q=8, L=16) drives it; steps/s is party B's own count of applied steps
over the run minus its warm-up (``loadtests.run``). Versions alternate, ``--pairs`` runs of
each. Writes ``benchmarks/results/floor-locust.json``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, write_result
from benchmarks.floor import baseline_tree
from loadtests.run import TOKEN
from loadtests.scenarios import write_label_table
from party_b.ops.launch import child_process, free_port, wait_until_healthy

__all__ = ["main"]


def one_run(tree: Path, labels: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Serve from ``tree``, load it with locust for ``--run-time``; the summary's figures."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "party_b.ops.cli", "serve", "--port", str(port),
        "--data-dir", str(work / "party_b"), "--labels", str(labels),
        "--tokens", f"loadtest:{TOKEN}", "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = work / "summary.json"
    load = [os.getloadavg()[0]]
    with child_process(cmd, work / "party_b.log", env=env, cwd=tree) as proc:
        wait_until_healthy(url, proc, log_path=work / "party_b.log", timeout=120)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "loadtests.run",
                "--host",
                url,
                "--labels-csv",
                str(labels),
                "--scenarios",
                args.scenario,
                "--users",
                str(args.users),
                "--run-time",
                f"{args.run_time:.0f}s",
                "--warmup",
                str(args.warmup),
                "--max-fail-ratio",
                "0",
                "--max-p99-ms",
                "1000000",
                "--out",
                str(out),
            ],  # fmt: skip
            cwd=ROOT,
            check=False,
        )
    load.append(os.getloadavg()[0])
    summary: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    steps = summary.get("locust", {})
    step: dict[str, Any] = next((v for k, v in steps.items() if "/steps" in k), {})
    return {
        "steps_per_s": summary.get("server_steps_per_s"),
        "p50_ms": step.get("p50_ms"),
        "p99_ms": step.get("p99_ms"),
        "failures": summary.get("locust", {}).get("Aggregated", {}).get("failures"),
        "loadavg": load,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="the commit before")
    parser.add_argument("--candidate", help="the commit after (default: this checkout)")
    parser.add_argument("--scenario", default="credit-fedlite")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--run-time", type=float, default=45.0)
    parser.add_argument("--warmup", type=float, default=12.0)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="fedlite-floor-locust-") as tmp:
        trees = {
            "before": baseline_tree(args.baseline, Path(tmp) / "before"),
            "after": baseline_tree(args.candidate, Path(tmp) / "after") if args.candidate else ROOT,
        }
        labels = write_label_table(Path(tmp) / "labels.csv")
        for pair in range(args.pairs):
            for code in ("before", "after") if pair % 2 == 0 else ("after", "before"):
                work = Path(tmp) / f"{code}-{pair}"
                work.mkdir()
                runs[code].append(one_run(trees[code], labels, work, args))
                print(code, pair, runs[code][-1], flush=True)
    medians = {
        code: statistics.median(r["steps_per_s"] or 0.0 for r in rs) for code, rs in runs.items()
    }
    path = write_result(
        "floor-locust",
        {
            "baseline": args.baseline,
            "candidate": args.candidate,
            "scenario": args.scenario,
            "users": args.users,
            "run_time_s": args.run_time,
            "loads": [x for rs in runs.values() for r in rs for x in r["loadavg"]],
            "runs": runs,
            "median_steps_per_s": medians,
            "gain": medians["after"] / medians["before"] if medians["before"] else None,
        },
        args.out,
    )
    print(medians, f"wrote {path}")


if __name__ == "__main__":
    main()
