"""benchmarks/device_check.py in its CPU smoke mode: every check of the GPU path (both parties
on the device, kill and resume in child processes, checkpoints across devices, the torch
k-means against the kernels, speed) at toy sizes, so the script the GPU machine runs once is
known to work before it gets there."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils.data import shared_data

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_the_device_check_passes_in_its_cpu_smoke_mode(tmp_path: Path) -> None:
    shared_data()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.device_check", "--cpu-smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=880,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "device_check.json").read_text())
    checks = result["checks"]
    assert set(checks) == {"breast", "femnist_resume", "across_devices", "kmeans", "speed"}
    assert all(check["ok"] for check in checks.values())
    resume = checks["femnist_resume"]
    assert resume["killed_exit_code"] == -9 and resume["resumed_from"] == 2
    assert all(resume["bit_identical"].values())
    assert checks["across_devices"]["cpu_to_device"]["resumed_from"] == 4
    assert {row["device"] for row in checks["speed"]["rows"]} == {"cpu"}
