"""``make demo-parties``: party B and two feature parties, three processes, real HTTP.

1. The bundled breast-cancer data, split three ways: party B keeps the label and 10 columns;
   feature party "left" gets 10 columns, feature party "right" the other 10.
2. Party B's operator starts ``fedlite-b serve``, creates the run naming both feature parties
   (``fedlite-b parties create examples/parties/run.json``) and issues one token per party.
3. Both feature parties run ``fedlite-a train --party ...`` at once, each with its own
   columns, token, bottom model, quantizer and state; party B fuses their activations, takes
   one step per batch and answers each with its own slice of the gradient. Then both ask for
   the same predictions (``fedlite-a predict --party ...``): party B answers once both parts
   are in.
4. The closing lines: held-out AUC, and every byte each party exchanged, both ways.

Everything goes to a fresh directory (default ./demo-parties-state, wiped first).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from demo import free_port, run, wait_healthy

BIN = Path(sys.executable).parent
# Public demo data: label privacy off, so that the AUC printed is on the true labels. Party
# B's default is label differential privacy (docs/PRIVACY.md).
DEMO_PRIVACY = "off"
HERE = Path(__file__).resolve().parent
PARTIES = {"left": "0:10", "right": "10:20"}
IDS = "s0000,s0001,s0019"


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("demo-parties-state"))
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    b_dir = args.dir / "party_b"
    started = time.perf_counter()

    labels = run(str(BIN / "fedlite-b"), "demo-data", "--out", str(b_dir / "labels.csv"))
    tables = {
        name: run(str(BIN / "fedlite-a"), "demo-data", "--columns", columns,
                  "--out", str(args.dir / name / "features.csv"))
        for name, columns in PARTIES.items()
    }  # fmt: skip
    run(str(BIN / "fedlite-b"), "token", "issue", "--name", "coordinator", "--data-dir", str(b_dir))
    created = json.loads(
        run(str(BIN / "fedlite-b"), "parties", "create", str(HERE / "parties" / "run.json"),
            "--owner", "coordinator", "--out", str(args.dir / "tokens"),
            "--data-dir", str(b_dir), "--labels", labels)
    )  # fmt: skip
    print(f"party B: {labels}\nparty B's operator created run {created['run']} for "
          f"{', '.join(PARTIES)} and issued one token each: {created['tokens']}")  # fmt: skip

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(b_dir / "party_b.log", "wb")  # noqa: SIM115 - the child writes to it
    party_b = subprocess.Popen(
        [str(BIN / "fedlite-b"), "serve", "--port", str(port), "--data-dir", str(b_dir),
         "--labels", labels, "--log-level", "warning", "--privacy", DEMO_PRIVACY],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_healthy(url, party_b)
        print(f"party B is serving on {url}\n")
        env = {
            name: {
                **os.environ,
                "FEDLITE_A_TOKEN": Path(created["tokens"][name]).read_text().strip(),
            }
            for name in PARTIES
        }
        session = {
            name: ["--server", url, "--features", tables[name], "--party", name,
                   "--config", str(HERE / "parties" / f"{name}.toml"),
                   "--state-dir", str(args.dir / name / "state")]
            for name in PARTIES
        }  # fmt: skip
        train = {n: [*s, "--summary-json", str(args.dir / f"{n}.json")] for n, s in session.items()}
        _parties_at_once("train", train, env, args.dir)
        predictions = _parties_at_once(
            "predict", {n: [*s, "--ids", IDS] for n, s in session.items()}, env, args.dir
        )
    finally:
        party_b.send_signal(signal.SIGTERM)
        code = party_b.wait(timeout=30)
        log.close()

    summaries = {name: json.loads((args.dir / f"{name}.json").read_text()) for name in PARTIES}
    metrics = summaries["left"]["eval_metrics"]
    assert all(s["eval_metrics"] == metrics for s in summaries.values())  # one evaluation
    print("\nserving after training (party B's scores, the same answer to both parties):")
    print(predictions["left"].strip())
    print(
        f"\nheld-out accuracy {metrics['eval_accuracy']:.4f}, AUC {metrics['eval_auc']:.4f} "
        f"({metrics['eval_loss']:.4f} loss) after {summaries['left']['last_step']} steps"
    )
    print("traffic per party (HTTP message bodies):")
    for name, summary in summaries.items():
        print(_traffic(name, summary))
    clean = code in (0, -signal.SIGTERM)
    print(
        f"party B {'shut down cleanly' if clean else f'exited with {code}'}; "
        f"demo took {time.perf_counter() - started:.0f} s"
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
