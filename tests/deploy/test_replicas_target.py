"""``make replicas`` installs what the replicated stack runs on and nothing more: the product
and the PostgreSQL driver (``.[postgres]``), not the development extra (issue 34 measured
``.[dev]`` at +2.5 minutes and 1.7 -> 2.7 GB); and it starts the stack with mutual TLS."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_replicas_installs_the_product_and_the_postgres_driver_only(tmp_path: Path) -> None:
    planned = subprocess.run(
        ["make", "-n", "-B", "replicas", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert planned.returncode == 0, planned.stderr
    installs = [line for line in planned.stdout.splitlines() if "docker/install.sh" in line]
    assert installs and all(line.endswith("-e '.[postgres]'") for line in installs), installs
    assert "[dev]" not in planned.stdout
    assert "-m party_b.ops.stack --replicas 2 --mutual-tls" in planned.stdout
