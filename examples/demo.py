"""``make demo``: two parties, two processes, real HTTP, bundled data.

1. Each party writes its half of scikit-learn's breast-cancer set (party A: 20 feature
   columns; party B: the label and 10 columns).
2. Party B's operator issues an API token and starts ``fedlite-b serve`` on 127.0.0.1 with a
   new SQLite file.
3. Party A runs ``fedlite-a train`` with FedLite compression, then asks for predictions
   (serving after training).
4. Party B is shut down cleanly (SIGTERM).

Everything goes to a fresh directory (default ./demo-state, wiped first).
"""

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(*cmd: str) -> str:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
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
         "--labels", labels, "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_healthy(url, party_b)
        print(f"party B is serving on {url} (SQLite: {b_dir / 'party_b.sqlite'})\n")
        session = [
            *("--server", url, "--token", token, "--features", features),
            *("--config", str(HERE / "breast.toml"), "--state-dir", str(a_dir / "state")),
        ]
        summary_path = args.dir / "summary.json"
        subprocess.run(
            [str(BIN / "fedlite-a"), "train", *session, "--summary-json", str(summary_path)],
            check=True,
        )
        predictions = run(str(BIN / "fedlite-a"), "predict", *session, "--ids", "s0000,s0001,s0019")
    finally:
        party_b.send_signal(signal.SIGTERM)
        code = party_b.wait(timeout=30)
        log.close()

    summary = json.loads(summary_path.read_text())
    metrics = summary["eval_metrics"]
    print("\nserving after training (party B's scores for three of party A's ids):")
    print(predictions)
    per_step = summary["bytes_sent"] / max(summary["last_step"], 1)
    print(
        f"\nheld-out accuracy {metrics['eval_accuracy']:.4f}, AUC {metrics['eval_auc']:.4f} "
        f"({metrics.get('eval_loss', float('nan')):.4f} loss) after {summary['last_step']} steps "
        f"of {per_step:.0f} uplink bytes each"
    )
    print(
        f"uplink: {summary['bytes_sent']:,} bytes sent; SplitFed would have sent "
        f"{summary['raw_bytes']:,} ({summary['compression']:.1f}x more)"
    )
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it: -SIGTERM is the clean exit
    clean = code in (0, -signal.SIGTERM)
    print(
        f"party B {'shut down cleanly' if clean else f'exited with {code}'}; "
        f"demo took {time.perf_counter() - started:.0f} s"
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
