"""Party B's steps/s under locust on small steps, before and after (issue 27's last target).

    python -m benchmarks.floor.locust --baseline f352584 [--candidate REV] [--pairs 3]

Each version's ``fedlite-b serve`` (its own tree: ``git archive``, as ``benchmarks.floor``
does) serves a 20,000-id label table on 127.0.0.1 with the product's defaults, and this
checkout's load test (``loadtests.run.run_locust``, the ``credit-fedlite`` scenario: B=256,
d=32, q=8, L=16) drives it; steps/s is party B's own count of applied steps over the run
minus its warm-up. Versions alternate, ``--pairs`` runs of each. Writes
``benchmarks/results/floor-locust.json``.

Both versions run in this checkout's environment, so a version from before the product
depended on uvloop and httptools gets them too: what changed in the code alone. With
``--declared`` each version serves with the event loop and HTTP parser its own
``pyproject.toml`` installs: one that does not declare uvloop and httptools runs without them
(asyncio and h11, uvicorn's fallbacks, as a fresh install of it would), so the gain is the
product's as a user installs it.
"""

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, write_result
from benchmarks.floor.trees import baseline_tree
from loadtests.run import TOKEN, run_locust, step_figures
from loadtests.scenarios import write_label_table
from party_b.ops.launch import local_party_b

__all__ = ["main"]


# uvicorn's optional speed-ups: its "auto" loop and parser pick them when they import
SERVER_EXTRAS = ("uvloop", "httptools")


def without_undeclared(tree: Path, shim: Path) -> list[str]:
    """The import paths that serve ``tree`` with only the server extras its pyproject.toml
    declares: a ``sitecustomize`` in ``shim`` makes the others unimportable (uvicorn then
    falls back to asyncio and h11). Returns what it hid."""
    declared = (tree / "pyproject.toml").read_text()
    hidden = [name for name in SERVER_EXTRAS if f'"{name}' not in declared]
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "sitecustomize.py").write_text(
        "import sys\n"
        f"for name in {hidden!r}:\n"
        "    sys.modules[name] = None  # not installed by this version: import fails\n"
    )
    return hidden


def one_run(
    tree: Path, labels: Path, work: Path, args: argparse.Namespace, shim: Path | None = None
) -> dict[str, Any]:
    """Serve from ``tree`` (with ``shim``'s sitecustomize first: ``without_undeclared``),
    load it with locust for ``--run-time``; the summary's figures."""
    load = [os.getloadavg()[0]]
    path = str(tree) if shim is None else f"{shim}{os.pathsep}{tree}"
    # ``tree``'s party B (PYTHONPATH and cwd), with the product's defaults: no malloc tuning
    with local_party_b(
        work / "party_b",
        labels,
        {"loadtest": TOKEN},
        env={"PYTHONPATH": path},
        cwd=tree,
        timeout=120,
    ) as url:
        summary = run_locust(
            [args.scenario],
            url,
            labels,
            users=args.users,
            run_time=args.run_time,
            warmup=args.warmup,
        )
    load.append(os.getloadavg()[0])
    figures = step_figures(summary)
    return {
        **{k: figures[k] for k in ("steps_per_s", "p50_ms", "p99_ms", "failures")},
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
    parser.add_argument(
        "--declared",
        action="store_true",
        help="serve each version with the event loop and parser its pyproject.toml installs",
    )
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    hidden: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="fedlite-floor-locust-") as tmp:
        trees = {
            "before": baseline_tree(args.baseline, Path(tmp) / "before"),
            "after": baseline_tree(args.candidate, Path(tmp) / "after") if args.candidate else ROOT,
        }
        labels = write_label_table(Path(tmp) / "labels.csv")
        shims: dict[str, Path | None] = {"before": None, "after": None}
        if args.declared:
            for code, tree in trees.items():
                shim = shims[code] = Path(tmp) / f"shim-{code}"
                hidden[code] = without_undeclared(tree, shim)
        for pair in range(args.pairs):
            for code in ("before", "after") if pair % 2 == 0 else ("after", "before"):
                work = Path(tmp) / f"{code}-{pair}"
                work.mkdir()
                runs[code].append(one_run(trees[code], labels, work, args, shims[code]))
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
            # --declared: the server extras each version ran without (its install lacks them)
            "declared": args.declared,
            "hidden_extras": hidden,
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
