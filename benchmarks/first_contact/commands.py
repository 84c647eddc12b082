"""The product's commands as a new user meets them, each a fresh process of a checkout:
how long each takes to start, and when a first ``fedlite-a train`` says what."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, TOKEN

__all__ = ["PartyB", "median_run", "startup", "timeline"]

# the run of the timeline's `fedlite-a train`: 20 steps of a small model on default_credit
CONFIG = """\
[run]
name = "{name}"
model = "tabular_mlp"
steps = 20
batch_size = 64
checkpoint_interval = 10
eval_fraction = 0.2

[model.bottom]
hidden = [32]
cut_dim = 16

[model.top]
hidden = [16]

[quantizer]
mode = "pq"
q = 4
L = 4
"""


def _env(root: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FEDLITE_A_", "FEDLITE_B_"))}
    return {**clean, "PYTHONPATH": str(root)}


def _seconds(cmd: list[str], root: Path) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=root, env=_env(root), capture_output=True, timeout=300, check=False)
    return time.perf_counter() - started


def startup(url: str, repeats: int, state: Path) -> dict[str, Any]:
    """Median wall seconds of each command as a fresh process (imports included)."""
    a = [sys.executable, "-m", "party_a.cli"]
    commands = {
        "fedlite-a --help": [*a, "--help"],
        "fedlite-a runs": [*a, "runs", "--state-dir", str(state)],
        "fedlite-a check": [*a, "check", "--server", url, "--token", TOKEN],
        "fedlite-b --help": [sys.executable, "-m", "party_b.ops.cli", "--help"],
    }
    out = {}
    for name, cmd in commands.items():
        _seconds(cmd, ROOT)  # warm the page cache
        times = sorted(_seconds(cmd, ROOT) for _ in range(repeats))
        out[name] = {"median_s": times[len(times) // 2], "min_s": times[0], "n": len(times)}
        print(f"{name}: {out[name]['median_s']:.2f} s", file=sys.stderr)
    return out


class PartyB:
    """``fedlite-b serve`` of the checkout ``root`` on a free port, logging at info."""

    def __init__(self, root: Path, data_dir: Path, labels: Path) -> None:
        with socket.socket() as probe:  # a free 127.0.0.1 port
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log = data_dir / "party_b.log"
        cmd = [
            sys.executable, "-m", "party_b.ops.cli", "serve", "--port", str(self.port),
            "--data-dir", str(data_dir), "--labels", str(labels), "--tokens",
            f"benchmark:{TOKEN}", "--log-level", "info",
        ]  # fmt: skip
        self.launched = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=root, env=_env(root), stdout=self.log.open("wb"), stderr=subprocess.STDOUT
        )
        import httpx

        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"party B exited:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        self.healthy_after = time.monotonic() - self.launched

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def timeline(root: Path, features: Path, labels: Path, work: Path) -> dict[str, Any]:
    """``fedlite-a train`` of ``root`` right after ``root``'s party B came up."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "run.toml"
    config.write_text(CONFIG.format(name="first-contact"))
    party_b = PartyB(root, work / "b", labels)
    lines: list[tuple[float, str]] = []
    try:
        cmd = [
            sys.executable, "-m", "party_a.cli", "train", "--server", party_b.url,
            "--token", TOKEN, "--features", str(features), "--config", str(config),
            "--state-dir", str(work / "a"), "--summary-json", str(work / "summary.json"),
        ]  # fmt: skip
        launched = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=root, env=_env(root), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        assert proc.stderr is not None

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append((time.monotonic() - launched, line.rstrip()))

        reader = threading.Thread(target=read)
        reader.start()
        code = proc.wait(timeout=1800)
        reader.join()
        total = time.monotonic() - launched
    finally:
        party_b.stop()
    if code != 0:
        raise RuntimeError(f"train exited {code}:\n" + "\n".join(t for _s, t in lines))
    summary = json.loads((work / "summary.json").read_text())
    first_step = next(s for s, t in lines if t.startswith("step 1/"))  # the progress line

    def clean(text: str) -> str:  # no machine paths in the results
        return text.replace(str(work.parent), "<tmp>")

    return {
        "party_b_healthy_after_s": round(party_b.healthy_after, 2),
        "first_line_s": round(lines[0][0], 2),
        "first_step_s": round(first_step, 2),
        "total_s": round(total, 2),
        "lines": [[round(s, 2), clean(text)] for s, text in lines if s <= first_step][:20],
        "alignment_bytes": summary.get("alignment_bytes"),
        "http_bytes_sent": summary.get("http_bytes_sent"),
        "http_bytes_received": summary.get("http_bytes_received"),
        "party_b_log": [
            clean(line)
            for line in party_b.log.read_text().splitlines()
            if "fedlite.party_b" in line
        ][:12],
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose first step came at the median time, with every run's timings."""
    ordered = sorted(runs, key=lambda r: r["first_step_s"])
    median = dict(ordered[len(ordered) // 2])
    median["all_runs"] = [
        {k: r[k] for k in ("first_line_s", "first_step_s", "total_s")} for r in runs
    ]
    return median
