"""The two CLIs as a user runs them (this interpreter's ``-m party_a.cli`` / ``party_b.ops.cli``),
on the bundled demo data (scikit-learn's breast-cancer set: no ../shared/data needed)."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from shared.demo_data import write_party_a_demo, write_party_b_demo

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO_ROOT / "examples" / "breast.toml"
TOKEN = "demo-test-token-0123456789"


@dataclass
class Ran:
    """A finished CLI run: exit code, output and how long it took (s)."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_cli(
    party: str,
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> Ran:
    """``fedlite-a`` (party "a") or ``fedlite-b`` (party "b") with ``args``; FEDLITE_* of
    this process are left out unless given in ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FEDLITE_A_", "FEDLITE_B_"))}
    # run from any directory: the package is found the way an installed one is
    base["PYTHONPATH"] = str(REPO_ROOT)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", f"party_{party}.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO_ROOT,
        env={**base, **(env or {})},
    )
    return Ran(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def demo_tables(directory: Path) -> tuple[Path, Path]:
    """(party A's features, party B's labels) of the bundled demo, every id shared."""
    return (
        write_party_a_demo(directory / "features.csv"),
        write_party_b_demo(directory / "labels.csv"),
    )
