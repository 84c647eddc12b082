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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent
# Public demo data: label privacy off, so that the evaluation printed is on the true labels
# and predict scores any id. Party B's default is label differential privacy, under which
# party A's evaluations are on the run's randomized labels (docs/PRIVACY.md). Both demos
# (this one and demo_parties.py) serve with it.
DEMO_PRIVACY = "off,predict_train_ids=true"
IDS = "s0000,s0001,s0019"  # the ids both demos ask party B to score after training


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(*cmd: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return out.stdout.strip()


def fedlite(party: str, *args: str, env: dict[str, str] | None = None) -> str:
    """``fedlite-a`` (party "a") or ``fedlite-b`` (party "b") of this venv; its stdout."""
    return run(str(BIN / f"fedlite-{party}"), *args, env=env)


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


def fresh_directory(doc: str, default: str) -> Path:
    """The demo's ``--dir`` (``default`` unless given), wiped."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(default))
    directory: Path = parser.parse_args().dir
    shutil.rmtree(directory, ignore_errors=True)
    return directory


def party_b_setup(b_dir: Path, token_name: str) -> tuple[str, str]:
    """Party B's half of the bundled data (the label and 10 columns) and an API token named
    ``token_name`` in a new SQLite file in ``b_dir``: (the label table's path, the token)."""
    labels = fedlite("b", "demo-data", "--out", str(b_dir / "labels.csv"))
    token = fedlite("b", "token", "issue", "--name", token_name, "--data-dir", str(b_dir))
    return labels, token


@dataclass
class PartyB:
    """``fedlite-b serve`` in a child process: where it answers; its exit code once stopped."""

    url: str
    code: int | None = None

    @property
    def clean(self) -> bool:
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it: -SIGTERM is clean
        return self.code in (0, -signal.SIGTERM)


@contextmanager
def party_b_serving(b_dir: Path, labels: str) -> Iterator[PartyB]:
    """``fedlite-b serve`` on a free port of 127.0.0.1 with label privacy ``DEMO_PRIVACY``
    (it records the policy in its database, where ``fedlite-b parties create`` reads it),
    healthy; SIGTERM on the way out (its log: ``b_dir/party_b.log``)."""
    party_b = PartyB(f"http://127.0.0.1:{free_port()}")
    log = open(b_dir / "party_b.log", "wb")  # noqa: SIM115 - the child writes to it
    proc = subprocess.Popen(
        [str(BIN / "fedlite-b"), "serve", "--port", party_b.url.rsplit(":", 1)[1],
         "--data-dir", str(b_dir), "--labels", labels, "--log-level", "warning",
         "--privacy", DEMO_PRIVACY],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_healthy(party_b.url, proc)
        print(f"party B is serving on {party_b.url} (SQLite: {b_dir / 'party_b.sqlite'})")
        print(f"label privacy: {DEMO_PRIVACY} (a demo on public data; the default is label DP)\n")
        yield party_b
    finally:
        proc.send_signal(signal.SIGTERM)
        party_b.code = proc.wait(timeout=30)
        log.close()


def held_out(summary: dict[str, Any]) -> str:
    """The held-out line of a ``fedlite-a train --summary-json`` summary."""
    metrics = summary["eval_metrics"]
    return (
        f"held-out accuracy {metrics['eval_accuracy']:.4f}, AUC {metrics['eval_auc']:.4f} "
        f"({metrics.get('eval_loss', float('nan')):.4f} loss) after {summary['last_step']} steps"
    )


def finish(party_b: PartyB, started: float) -> int:
    """The closing line; the demo's exit code (0: party B shut down cleanly)."""
    print(
        f"party B {'shut down cleanly' if party_b.clean else f'exited with {party_b.code}'}; "
        f"demo took {time.perf_counter() - started:.0f} s"
    )
    return 0 if party_b.clean else 1


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
    directory = fresh_directory(__doc__, "demo-state")
    a_dir, b_dir = directory / "party_a", directory / "party_b"
    started = time.perf_counter()

    features = fedlite("a", "demo-data", "--out", str(a_dir / "features.csv"))
    labels, token = party_b_setup(b_dir, "party-a")
    print(f"party A data: {features}\nparty B data: {labels}\nparty B issued a token for party A")

    with party_b_serving(b_dir, labels) as party_b:
        party_a_env = {**os.environ, "FEDLITE_A_TOKEN": token}  # not on the command line
        session = [
            *("--server", party_b.url, "--features", features),
            *("--config", str(HERE / "breast.toml"), "--state-dir", str(a_dir / "state")),
        ]
        summary_path = directory / "summary.json"
        subprocess.run(
            [str(BIN / "fedlite-a"), "train", *session, "--summary-json", str(summary_path)],
            check=True,
            env=party_a_env,
        )
        predictions = fedlite("a", "predict", *session, "--ids", IDS, env=party_a_env)

    summary = json.loads(summary_path.read_text())
    print("\nserving after training (party B's scores for three of party A's ids):")
    print(predictions)
    print(f"\n{held_out(summary)}")
    print(traffic(summary))
    return finish(party_b, started)


if __name__ == "__main__":
    sys.exit(main())
