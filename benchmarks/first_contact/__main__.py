"""First contact: how long ``fedlite-a`` commands take to start, what the alignment costs on
the wire, and when a new user's first ``train`` first says something.

    python -m benchmarks.first_contact [--baseline-root DIR] [--repeats 5]

Three measurements, on FATE's default_credit pair (``../shared/data/fate_hetero``, 30,000
ids each side), cut to about the issue's sizes: party A keeps 29,200 ids, party B 29,600
(seeded), so that the intersection is about 28,800:

* ``startup``: wall seconds of ``fedlite-a --help``, ``runs`` (an empty state), ``check``
  (against a live party B) and ``fedlite-b --help``, each a fresh ``python -m`` process,
  median of ``--repeats``;
* ``alignment_bytes``: the bodies of one PSI (request and reply) and of aligning a run on its
  intersection, both ways: the JSON alignment (``POST /v1/runs/{id}/alignment``, hex keys, what
  every party A sent before) and the binary one (``.../alignment/keys``, docs/PROTOCOL.md 8.1),
  counted by party A's HTTP client against ``fedlite-b serve``;
* ``timeline``: ``fedlite-a train`` (20 steps) started the moment a fresh ``fedlite-b serve``
  answers ``/healthz``: the seconds (from the command's launch) of each line it writes before
  the first step, and the line that says training began. With ``--baseline-root`` (another
  checkout, e.g. the release before), the same run of that checkout's two CLIs comes first.

Writes ``benchmarks/results/first_contact.json``; ``python -m benchmarks.report`` renders it
into docs/PERFORMANCE.md. The package: ``inputs`` (the two tables), ``commands`` (start-up
and the timeline), ``alignment_bytes``, ``report`` (the tables of docs/PERFORMANCE.md).
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, versions, write_result
from benchmarks.first_contact.alignment_bytes import alignment_bytes
from benchmarks.first_contact.commands import PartyB, median_run, startup, timeline
from benchmarks.first_contact.inputs import A_IDS, B_IDS, PAIR, tables


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.first_contact", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs of each start-up command")
    parser.add_argument(
        "--timelines", type=int, default=3, help="first-contact runs of each checkout"
    )
    parser.add_argument("--baseline-root", type=Path, help="another checkout to time first")
    parser.add_argument(
        "--baseline-label", default="another checkout", help="what --baseline-root is (recorded)"
    )
    args = parser.parse_args()
    if not PAIR.is_dir():
        sys.exit(f"no FATE data at {PAIR} (set FEDLITE_SHARED_DATA)")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="first-contact-") as tmp:
        work = Path(tmp)
        features, labels = tables(work)
        result: dict[str, Any] = {"sizes": {"party_a_ids": A_IDS, "party_b_ids": B_IDS}}
        roots = {"current": ROOT}
        if args.baseline_root is not None:
            roots = {"baseline": args.baseline_root.resolve(), **roots}
        runs: dict[str, list[dict[str, Any]]] = {key: [] for key in roots}
        for i in range(args.timelines):  # interleaved: the checkouts share the machine's noise
            for key, root in roots.items():
                runs[key].append(timeline(root, features, labels, work / f"{key}-{i}"))
        for key, timed in runs.items():
            result[key] = median_run(timed)
        from party_a.session import open_state

        open_state(work / "empty-state", create=True).close()
        party_b = PartyB(ROOT, work / "serving", labels)
        try:
            result["alignment_bytes"] = alignment_bytes(party_b.url, features, work)
            result["startup"] = startup(party_b.url, args.repeats, work / "empty-state")
        finally:
            party_b.stop()
    result["loadavg_before"] = load_before
    result["loadavg_after"] = os.getloadavg()
    result["versions"] = versions("torch", "httpx", "openmined.psi")
    # the command as run, with the baseline named rather than its path on this machine
    result["command"] = "python -m benchmarks.first_contact" + (
        f" --baseline-root <{args.baseline_label}>" if args.baseline_root else ""
    )
    if args.baseline_root is not None:
        result["baseline"]["label"] = args.baseline_label
    print(write_result("first_contact", result))


if __name__ == "__main__":
    main()
