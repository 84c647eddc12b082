"""The per-step floor of each party, against the product's step, side by side (issue 27).

    python -m benchmarks.floor                            # breast, default_credit, femnist
    python -m benchmarks.floor --baseline f352584         # and that commit's product, A/B
    python -m benchmarks.floor --tasks breast --rounds 4 --block 10
    python -m benchmarks.floor.locust --baseline f352584  # small steps under locust, A/B

Party B, per task: (a) bare torch's forward + backward + optimizer step of the run's own top
model, (b) one durable commit of one step-log row through ``sqlite3`` alone in party B's
database mode, (c) party B's step in process (``Service.steps.step``), (d) the same over
loopback HTTP (``fedlite-b serve``, the product's defaults; the round trip as party A's
``HttpTransport`` sees it). Target: (d) <= 3 x ((a) + (b)).

Party A, per task: the bare bottom forward + quantizer + backward + optimizer step (at the
best of 1 and all cores' threads), against the product's step (``party_a.loop.run_steps``
driving ``PartyATrainer``, from one applied step to the next) minus its round trip.
Target: <= 3 x the floor.

Everything of one task is measured in one process, in rounds whose blocks (each floor at
each thread count, the in-process run, the HTTP run) take turns in a rotating order, so
that they share the noise of a shared machine. ``--baseline REV`` runs the product of commit
REV the same way (``git archive`` into a temporary directory, with this checkout's floor
package), in worker processes alternating with this checkout's, ``--pairs`` of each, so
before and after share the noise too. Writes ``benchmarks/results/floor.json`` (one record
per task and party, ``before`` nested) and prints a summary; the table is
``python -m benchmarks.report``'s.

The package: ``tasks`` (the runs measured), ``measure`` (the bare floors, and where the
product's step spends its time), ``worker`` (one process's rounds), ``records`` (from samples
to records), ``trees`` (the other versions), ``report`` (the tables), and ``locust`` (party
B's steps/s under locust, before and after).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT, versions, write_result
from benchmarks.floor.records import records
from benchmarks.floor.trees import baseline_tree, revision
from benchmarks.floor.worker import work

__all__ = ["main"]


def run_worker(tree: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``python -m benchmarks.floor --worker`` with ``tree``'s product; its samples."""
    cmd = [
        sys.executable, "-m", "benchmarks.floor", "--worker", str(out),
        "--tasks", *args.tasks, "--rounds", str(args.rounds), "--block", str(args.block),
        "--warmup", str(args.warmup),
    ]  # fmt: skip
    # the data sets stay where this checkout finds them (../shared/data), wherever tree is
    data = os.environ.get("FEDLITE_DATA") or str(ROOT.parent / "shared" / "data")
    env = {**os.environ, "PYTHONPATH": str(tree), "FEDLITE_DATA": data}
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def merge(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The samples of several workers of one version, concatenated."""

    def join(a: Any, b: Any) -> Any:
        if isinstance(a, dict):
            return {k: join(a[k], b[k]) if k in b else a[k] for k in a}
        return a + b

    merged: dict[str, Any] = workers[0]["samples"]
    for w in workers[1:]:
        merged = join(merged, w["samples"])
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.floor", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", nargs="+", default=["breast", "default_credit", "femnist"])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per worker")
    parser.add_argument("--block", type=int, default=15, help="steps (or calls) per block")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per run first")
    parser.add_argument("--baseline", help="a commit to compare with (before)")
    parser.add_argument(
        "--candidate", help="a commit to measure as 'after' (default: this checkout as it is)"
    )
    parser.add_argument("--pairs", type=int, default=2, help="worker processes per version")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--keep-other-tasks",
        action="store_true",
        help="keep the records of other tasks already in the output file (a task measured "
        "in a run of its own, e.g. FEMNIST with fewer rounds)",
    )
    parser.add_argument(
        "--from-workers",
        type=Path,
        help="write the result from the worker files (after-N.json, before-N.json) an "
        "interrupted run left in this directory",
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        result = work(args.tasks, args.rounds, args.block, args.warmup)
        args.worker.write_text(json.dumps(result))
        return

    if args.from_workers is not None:
        found_runs = {
            code: [
                json.loads(p.read_text()) for p in sorted(args.from_workers.glob(f"{code}-*.json"))
            ]
            for code in ("after", "before")
        }
        finish({code: ws for code, ws in found_runs.items() if ws}, args)
        return
    with tempfile.TemporaryDirectory(prefix="fedlite-floor-run-") as tmp:
        trees = {"after": ROOT}
        if args.candidate:
            trees["after"] = baseline_tree(args.candidate, Path(tmp) / "after")
        if args.baseline:
            trees["before"] = baseline_tree(args.baseline, Path(tmp) / "before")
        runs: dict[str, list[dict[str, Any]]] = {code: [] for code in trees}
        for pair in range(args.pairs if args.baseline else 1):
            order = list(trees) if pair % 2 == 0 else list(reversed(trees))
            for code in order:
                out = Path(tmp) / f"{code}-{pair}.json"
                runs[code].append(run_worker(trees[code], args, out))
                print(f"worker {code} #{pair} done", flush=True)
    finish(runs, args)


def finish(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    """The records of every version's workers, written to floor.json and printed."""
    found = {code: records(merge(ws), ws) for code, ws in runs.items()}
    final = found["after"]
    earlier = {(r["task"], r["party"]): r for r in found.get("before", [])}
    for rec in final:
        if (rec["task"], rec["party"]) in earlier:
            rec["before"] = earlier[rec["task"], rec["party"]]
    runs_meta = [{"command": " ".join(sys.argv), "tasks": args.tasks, "rounds": args.rounds}]
    target = args.out or RESULTS / "floor.json"
    if args.keep_other_tasks and target.exists():
        kept = json.loads(target.read_text())
        final = [r for r in kept["records"] if r["task"] not in args.tasks] + final
        runs_meta = kept.get("runs", []) + runs_meta
        for code, ws in kept.get("workers", {}).items():
            runs.setdefault(code, []).extend(ws)
    path = write_result(
        "floor",
        {
            "runs": runs_meta,
            "versions": versions("torch", "numpy", "fastapi", "uvicorn", "httpx", "sqlalchemy"),
            "code": args.candidate or revision(),
            "baseline": args.baseline,
            "workers": {code: [_meta(w) for w in ws] for code, ws in runs.items()},
            "rounds": args.rounds,
            "block": args.block,
            "records": final,
        },
        args.out,
    )
    for rec in final:
        print(_line(rec))
    print(f"wrote {path}")


def _meta(worker: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in worker.items() if k != "samples"}


def _line(rec: dict[str, Any]) -> str:
    text = (
        f"{rec['task']:>15} {rec['party']}: floor {rec['floor_ms']:.2f} ms, product "
        f"{rec['product_ms']:.2f} ms, ratio {rec['ratio']:.2f}"
    )
    if "before" in rec:
        b = rec["before"]
        text += f" (before: {b['product_ms']:.2f} ms, ratio {b['ratio']:.2f})"
    return text


if __name__ == "__main__":
    main()
