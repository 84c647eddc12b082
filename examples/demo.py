"""``make demo``: two parties, two processes, real HTTP, bundled data.

1. Each party writes its half of scikit-learn's breast-cancer set (party A: 20 feature
   columns; party B: the label and 10 columns).
2. Party B's operator issues an API token and starts ``fedlite-b serve`` on 127.0.0.1 with a
   new SQLite file.
3. Party A runs ``fedlite-a train`` with FedLite compression, then asks for predictions
   (serving after training).
4. Party B is shut down cleanly (SIGTERM).
5. The closing lines count every byte that crossed, both ways: uplink, downlink, id alignment.

Everything goes to a fresh directory (default ./demo-state, wiped first).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent
# Public demo data: label privacy off, so that the evaluation printed is on the true labels
# and predict scores any id. Party B's default is label differential privacy, under which
# party A's evaluations are on the run's randomized labels (docs/PRIVACY.md).
DEMO_PRIVACY = "off,predict_train_ids=true"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(*cmd: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return out.stdout.strip()


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"party B exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("party B did not become healthy")


def traffic(summary: dict[str, Any]) -> str:
    """Every byte ``fedlite-a train`` exchanged with party B (HTTP message bodies), by part."""
    steps = max(summary["last_step"], 1)
    sent, received = summary["http_bytes_sent"], summary["http_bytes_received"]
    rows = [
        ("uplink, training steps", summary["bytes_sent"],
         f"{summary['bytes_sent'] / steps:,.0f} B a step; SplitFed: {summary['raw_bytes']:,} B, "
         f"{summary['compression']:.1f}x more"),
        ("downlink, training steps", summary["bytes_received"],
         f"{summary['bytes_received'] / steps:,.0f} B a step: gradients"),
        ("id alignment, both ways", summary["alignment_bytes"], "PSI and the run's id hashes"),
        ("everything, both ways", sent + received,
         f"{sent:,} B sent, {received:,} B received; with set-up, evaluation"),
    ]  # fmt: skip
    width = max(len(f"{n:,}") for _label, n, _note in rows)
    lines = [f"  {label:<24} {n:>{width},} B  ({note})" for label, n, note in rows]
    return "traffic of fedlite-a train (HTTP message bodies):\n" + "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("demo-state"))
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    a_dir, b_dir = args.dir / "party_a", args.dir / "party_b"
    started = time.perf_counter()

    features = run(str(BIN / "fedlite-a"), "demo-data", "--out", str(a_dir / "features.csv"))
    labels = run(str(BIN / "fedlite-b"), "demo-data", "--out", str(b_dir / "labels.csv"))
    token = run(
        str(BIN / "fedlite-b"), "token", "issue", "--name", "party-a", "--data-dir", str(b_dir)
    )
    print(f"party A data: {features}\nparty B data: {labels}\nparty B issued a token for party A")

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
        print(f"party B is serving on {url} (SQLite: {b_dir / 'party_b.sqlite'})")
        print(f"label privacy: {DEMO_PRIVACY} (a demo on public data; the default is label DP)\n")
        party_a_env = {**os.environ, "FEDLITE_A_TOKEN": token}  # not on the command line
        session = [
            *("--server", url, "--features", features),
            *("--config", str(HERE / "breast.toml"), "--state-dir", str(a_dir / "state")),
        ]
        summary_path = args.dir / "summary.json"
        subprocess.run(
            [str(BIN / "fedlite-a"), "train", *session, "--summary-json", str(summary_path)],
            check=True,
            env=party_a_env,
        )
        predictions = run(
            str(BIN / "fedlite-a"), "predict", *session, "--ids", "s0000,s0001,s0019",
            env=party_a_env,
        )  # fmt: skip
    finally:
        party_b.send_signal(signal.SIGTERM)
        code = party_b.wait(timeout=30)
        log.close()

    summary = json.loads(summary_path.read_text())
    metrics = summary["eval_metrics"]
    print("\nserving after training (party B's scores for three of party A's ids):")
    print(predictions)
    print(
        f"\nheld-out accuracy {metrics['eval_accuracy']:.4f}, AUC {metrics['eval_auc']:.4f} "
        f"({metrics.get('eval_loss', float('nan')):.4f} loss) after {summary['last_step']} steps"
    )
    print(traffic(summary))
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it: -SIGTERM is the clean exit
    clean = code in (0, -signal.SIGTERM)
    print(
        f"party B {'shut down cleanly' if clean else f'exited with {code}'}; "
        f"demo took {time.perf_counter() - started:.0f} s"
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
