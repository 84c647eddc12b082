"""How much of party B's labels party A can read from training, per defence: leakage.json.

    python -m benchmarks.leakage              # the grid below, one process per task
    python -m benchmarks.leakage --smoke      # two 10-step runs per task, to check the pipeline
    python -m benchmarks.leakage.report       # renders the tables into docs/PRIVACY.md

Every run is real training through the product (``benchmarks.leakage.runs``); the attacks
(``benchmarks.leakage.attacks``) read the gradients party A decoded from the step replies.
One record per (task, downlink representation, defence, attack), attack "best" being the
maximum over the three: ``leak_auc`` (the attacker's AUC, best sign per batch), ``model_auc``
(held-out AUC of the trained model, computed by party B), ``model_auc_undefended`` (the same
task and downlink with privacy ``off``), and ``chance_auc`` (the leak AUC of scores that know
nothing, the floor the best-sign rule gives for free on these batch sizes).
"""

import argparse
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, machine
from benchmarks.leakage.grid import BASE, task_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two 10-step runs per task")
    parser.add_argument("--tasks", nargs="+", default=list(BASE), choices=list(BASE))
    parser.add_argument("--out", default=str(RESULTS / "leakage.json"))
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
    try:
        with multiprocessing.get_context("spawn").Pool(len(args.tasks)) as pool:
            jobs = [pool.apply_async(task_records, (t, args.smoke, workdir)) for t in args.tasks]
            records = [r for job in jobs for r in job.get()]
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    doc = {
        "command": "python -m benchmarks.leakage" + (" --smoke" if args.smoke else ""),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": time.time() - started,
        "machine": machine(),
        "loadavg_before": load_before,
        "loadavg_after": list(os.getloadavg()),
        "records": records,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
