"""The Python API: ``examples/notebook.py`` (party B in a thread, party A through
``party_a.api.connect``) runs as a user would run it, and ``connect`` picks a trained run up
again by its name instead of making a second one."""

import re
import subprocess
import sys
from pathlib import Path

from party_a.api import connect
from party_b.ops.background import serve_in_thread
from shared.demo_data import write_party_a_demo, write_party_b_demo

ROOT = Path(__file__).resolve().parents[2]


def test_the_notebook_example_trains_evaluates_predicts_and_finishes(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "notebook.py"),
            "--dir",
            str(tmp_path / "state"),  # the example wipes it first: not the working directory
            "--steps",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "trained 20 steps" in done.stdout
    accuracy = float(re.search(r"held-out accuracy (\S+),", done.stdout).group(1))  # type: ignore[union-attr]
    assert accuracy > 0.8, done.stdout
    assert re.search(r"run [0-9a-f]{32} is finished", done.stdout), done.stdout


def test_connect_resumes_the_run_of_the_same_name(tmp_path: Path) -> None:
    features = write_party_a_demo(tmp_path / "features.csv")
    labels = write_party_b_demo(tmp_path / "labels.csv")
    config = ROOT / "examples" / "breast.toml"
    with serve_in_thread(labels=labels, data_dir=tmp_path / "b") as party_b:
        common = {"features": features, "config": config, "state_dir": tmp_path / "a"}
        with connect(party_b.url, party_b.token, overrides={"run.steps": 3}, **common) as run:
            first = run.train()
        with connect(party_b.url, party_b.token, overrides={"run.steps": 3}, **common) as run:
            again = run.run_id
            assert run.step == 3  # restored from party A's checkpoint
    assert first.run_id == again and first.last_step == 3
