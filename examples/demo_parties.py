"""``make demo-parties``: party B and two feature parties, three processes, real HTTP.

1. The bundled breast-cancer data, split three ways: party B keeps the label and 10 columns;
   feature party "left" gets 10 columns, feature party "right" the other 10.
2. Party B's operator starts ``fedlite-b serve`` (label privacy off: the data is public),
   then creates the run naming both feature parties (``fedlite-b parties create
   examples/parties/run.json``, which gives the run the policy serve recorded in party B's
   database) and issues one token per party.
3. Both feature parties run ``fedlite-a train --party ...`` at once, each with its own
   columns, token, bottom model, quantizer and state; party B fuses their activations, takes
   one step per batch and answers each with its own slice of the gradient. Then both ask for
   the same predictions (``fedlite-a predict --party ...``): party B answers once both parts
   are in.
4. The closing lines: held-out AUC, and every byte each party exchanged, both ways.

Everything goes to a fresh directory (default ./demo-parties-state, wiped first).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from demo import (
    BIN,
    DEMO_PRIVACY,
    HERE,
    IDS,
    fedlite,
    finish,
    fresh_directory,
    held_out,
    party_b_serving,
    party_b_setup,
)

PARTIES = {"left": "0:10", "right": "10:20"}


def _traffic(name: str, summary: dict[str, Any]) -> str:
    steps = max(summary["last_step"], 1)
    return (
        f"  {name:<6} uplink {summary['bytes_sent']:>8,} B ({summary['bytes_sent'] / steps:,.0f} "
        f"B a step; SplitFed: {summary['raw_bytes']:,} B, {summary['compression']:.1f}x more)\n"
        f"  {'':<6} downlink {summary['bytes_received']:>6,} B "
        f"({summary['bytes_received'] / steps:,.0f} B a step: its slice of the gradient)\n"
        f"  {'':<6} alignment {summary['alignment_bytes']:>5,} B (PSI and the run's id hashes); "
        f"everything, both ways: {summary['http_bytes_sent']:,} B sent, "
        f"{summary['http_bytes_received']:,} B received"
    )


def _parties_at_once(
    verb: str, extra: dict[str, list[str]], env: dict[str, dict[str, str]], logs: Path
) -> dict[str, str]:
    """``fedlite-a VERB --party NAME`` for every party at once (each party's progress and
    summary go to ``logs/NAME-VERB.log``); their standard outputs."""
    procs = {}
    for name in PARTIES:
        log = open(logs / f"{name}-{verb}.log", "wb")  # noqa: SIM115 - the child's
        procs[name] = subprocess.Popen(
            [str(BIN / "fedlite-a"), verb, *extra[name]],
            env=env[name],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()
    print(f"fedlite-a {verb} --party {' / '.join(PARTIES)}: at once (logs in {logs})")
    outputs = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=900)
        if proc.returncode != 0:
            tail = (logs / f"{name}-{verb}.log").read_text()[-2000:]
            raise SystemExit(f"fedlite-a {verb} --party {name} exited {proc.returncode}:\n{tail}")
        outputs[name] = out.decode()
    return outputs


def main() -> int:
    directory = fresh_directory(__doc__, "demo-parties-state")
    b_dir = directory / "party_b"
    started = time.perf_counter()

    labels, _coordinator = party_b_setup(b_dir, "coordinator")  # the token owning the run
    tables = {
        name: fedlite("a", "demo-data", "--columns", columns,
                      "--out", str(directory / name / "features.csv"))
        for name, columns in PARTIES.items()
    }  # fmt: skip
    print(f"party B data: {labels}")

    with party_b_serving(b_dir, labels) as party_b:
        created = json.loads(
            fedlite("b", "parties", "create", str(HERE / "parties" / "run.json"),
                    "--owner", "coordinator", "--out", str(directory / "tokens"),
                    "--data-dir", str(b_dir), "--labels", labels)
        )  # fmt: skip
        if created["privacy"] != DEMO_PRIVACY:  # else the AUC printed is not on the true labels
            raise SystemExit(f"the run got label privacy {created['privacy']}, not {DEMO_PRIVACY}")
        print(f"party B's operator created run {created['run']} for {', '.join(PARTIES)} "
              f"(label privacy {created['privacy']}, as party B serves) and issued one token "
              f"each: {created['tokens']}\n")  # fmt: skip
        env = {
            name: {
                **os.environ,
                "FEDLITE_A_TOKEN": Path(created["tokens"][name]).read_text().strip(),
            }
            for name in PARTIES
        }
        session = {
            name: ["--server", party_b.url, "--features", tables[name], "--party", name,
                   "--config", str(HERE / "parties" / f"{name}.toml"),
                   "--state-dir", str(directory / name / "state")]
            for name in PARTIES
        }  # fmt: skip
        train = {
            n: [*s, "--summary-json", str(directory / f"{n}.json")] for n, s in session.items()
        }
        _parties_at_once("train", train, env, directory)
        predictions = _parties_at_once(
            "predict", {n: [*s, "--ids", IDS] for n, s in session.items()}, env, directory
        )

    summaries = {name: json.loads((directory / f"{name}.json").read_text()) for name in PARTIES}
    metrics = summaries["left"]["eval_metrics"]
    assert all(s["eval_metrics"] == metrics for s in summaries.values())  # one evaluation
    print("\nserving after training (party B's scores, the same answer to both parties):")
    print(predictions["left"].strip())
    print(f"\n{held_out(summaries['left'])}")
    print("traffic per party (HTTP message bodies):")
    for name, summary in summaries.items():
        print(_traffic(name, summary))
    return finish(party_b, started)


if __name__ == "__main__":
    sys.exit(main())
