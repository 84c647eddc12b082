"""How much of party B's labels party A can read from training, per policy: leakage.json.

    python -m benchmarks.leakage                   # the grid (grid.GRID), every seed
    python -m benchmarks.leakage --only recommended --merge   # re-run a part, keep the rest
    python -m benchmarks.leakage --smoke           # two 10-step runs per task and seed
    python -m benchmarks.leakage.multirun          # the multi-run averaging attack
    python -m benchmarks.leakage.report            # renders the tables into docs/PRIVACY.md

Every run is real training through the product (``benchmarks.leakage.runs``), by an honest
and by an active party A; the attacks (``benchmarks.leakage.attacks``) read what party A
decoded from the replies and what it holds itself. The JSON holds ``runs``, one record per
(task, defence, seed, attack), and ``records``, the same over seeds: one per (task,
defence, attack), attack "best" being each measure's maximum over the attacks per seed.
Measures: ``leak_auc`` (pooled attack score against the true labels of the ordinary
training rows, oracle sign), ``leak_auc_signed`` (the sign from party A's ``predict``
scores), ``canary_auc`` and ``canary_auc_signed`` (the same on the canaries, whose labels
are coin flips: what training leaks of a row's own label), ``batch_auc`` (the previous
benchmark's per-batch measure, per-batch attacks only); ``model_auc`` (held-out AUC on the
true labels, computed by party B), ``auc_cost`` (per seed, the undefended run's minus this
one's), ``predict_auc`` (what ``predict``'s scores alone give on the training rows), the
chance floors, ``epsilon`` and ``auc_bound`` (the label-DP guarantee) and ``default``
(whether the setting is what new runs get). Each as a mean, a sample standard deviation and
the per-seed values. ``--merge`` replaces the runs it re-ran and keeps the others;
``invocations`` lists every command that contributed.
"""

import argparse
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine
from benchmarks.leakage import report
from benchmarks.leakage.grid import BASE, SEEDS, aggregate, order, seed_records


def _key(record: dict[str, Any]) -> tuple[str, str, int, str]:
    return (record["task"], record["defence"], record["seed"], record["attack"])


def dump(doc: dict[str, Any]) -> str:
    """The JSON with one line per record (a few hundred records: indenting each field would
    make the file ten times longer to read through)."""
    parts = []
    for key, value in doc.items():
        if key in ("runs", "records"):
            body = ",\n  ".join(json.dumps(r) for r in value)
            parts.append(f'"{key}": [\n  {body}\n ]')
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two 10-step runs per task")
    parser.add_argument("--tasks", nargs="+", default=list(BASE), choices=list(BASE))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--only", help='regular expression over "task/downlink/defence"')
    parser.add_argument("--merge", action="store_true", help="keep the JSON's other runs")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--out", type=Path, default=report.RESULT)
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the parties' databases here between invocations (the PSI of a task, the "
        "costliest part of a short run, is then cached); default: a temporary directory",
    )
    args = parser.parse_args()
    started = time.time()
    load_before = list(os.getloadavg())
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fedlite-leakage-"))
    # the long task first, so that the short ones fill in around it
    jobs = [(t, s) for t in sorted(args.tasks, key=lambda t: -BASE[t].steps) for s in args.seeds]
    old = report.load(args.out) if args.merge and args.out.exists() else {}
    # the multi-run attack's records (benchmarks.leakage.multirun) stay, whatever this runs
    multirun = report.load(args.out).get("multirun") if args.out.exists() else None
    known: dict[tuple[str, int], float] = {}
    for r in old.get("runs", []):
        if r["defence"] == "off" and r["attack"] == "best":
            known[(r["task"], r["seed"])] = r["model_auc"]
    try:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            pending = [
                pool.apply_async(
                    seed_records, (t, s, args.smoke, args.only, workdir, known.get((t, s)))
                )
                for t, s in jobs
            ]
            runs = [r for job in pending for r in job.get()]
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    invocation = {
        "command": "python -m benchmarks.leakage "
        + " ".join(
            [*(["--smoke"] if args.smoke else [])]
            + [f"--tasks {' '.join(args.tasks)}", f"--seeds {' '.join(map(str, args.seeds))}"]
            + ([f"--only '{args.only}'"] if args.only else [])
            + (["--merge"] if args.merge else [])
        ),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": time.time() - started,
        "runs": 2 * len({_key(r)[:3] for r in runs}),  # an honest and an active run each
        "loadavg_before": load_before,
        "loadavg_after": list(os.getloadavg()),
    }
    invocations = [invocation]
    if old:
        fresh = {_key(r) for r in runs}
        runs = [r for r in old.get("runs", []) if _key(r) not in fresh] + runs
        invocations = old.get("invocations", []) + invocations
    runs.sort(key=order)
    doc = {
        "machine": machine(),
        "invocations": invocations,
        "runs": runs,
        "records": aggregate(runs),
        **({"multirun": multirun} if multirun is not None else {}),
    }
    report.save(args.out, dump(doc))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
