"""``fedlite-a`` as a user meets it, against a real ``fedlite-b serve`` on the demo data.

* evaluate, predict and finish never create a run: an unknown ``--name``, or a command run
  from another directory (the default ``--state-dir`` is relative), is exit code 2 and a
  message that says where party A looked -- and party B's run list (over HTTP) stays as it was;
* a trained run can be used by ``--name`` alone (its config is in party A's state);
* the progress bar on a terminal shows no made-up ``loss 0.0000`` before the first step;
* ``--version``, and ``-v`` after the subcommand.
"""

import json
import os
import pty
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.utils.cli import DEMO_CONFIG, REPO_ROOT, TOKEN, Ran, demo_tables, run_cli
from tests.utils.servers import PartyBProcess

STEPS = "8"


def _on_a_terminal(cmd: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``cmd`` with stdout and stderr on a pseudo-terminal; (exit code, what it drew)."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    code = proc.wait(timeout=300)
    reader.join(timeout=30)
    os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Party B serving the demo labels, and one run trained by ``fedlite-a train`` on a
    terminal (the progress bar's first frame is what one test looks at)."""
    root = tmp_path_factory.mktemp("party-a-cli")
    features, labels = demo_tables(root)
    party_b = PartyBProcess(root / "party_b", labels, {"alice": TOKEN})
    party_b.start()
    state = root / "a-state"
    session = [
        "--server", party_b.url, "--token", TOKEN, "--features", str(features),
        "--config", str(DEMO_CONFIG), "--steps", STEPS, "--state-dir", str(state),
    ]  # fmt: skip
    summary = root / "summary.json"
    train = [sys.executable, "-m", "party_a.cli", "train", *session]
    try:
        code, drawn = _on_a_terminal([*train, "--summary-json", str(summary)], cwd=root)
        assert code == 0, drawn
        yield {
            "party_b": party_b,
            "features": features,
            "state": state,
            "root": root,
            "drawn": drawn,
            "summary": json.loads(summary.read_text()),
        }
    finally:
        party_b.stop()


def _remote_runs(party_b: PartyBProcess) -> list[str]:
    answer = httpx.get(
        f"{party_b.url}/v1/runs", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    answer.raise_for_status()
    return [r["name"] for r in answer.json()["runs"]]


def _use(trained: dict[str, object], command: str, *extra: str, cwd: Path | None = None) -> Ran:
    party_b = trained["party_b"]
    assert isinstance(party_b, PartyBProcess)
    return run_cli(
        "a", command, "--server", party_b.url, "--token", TOKEN,
        "--features", str(trained["features"]), *extra, cwd=cwd,
    )  # fmt: skip


def test_predict_with_a_mistyped_name_is_an_error_and_creates_no_run(
    trained: dict[str, object],
) -> None:
    ran = _use(
        trained, "predict", "--config", str(DEMO_CONFIG), "--name", "breast-dmeo",
        "--state-dir", str(trained["state"]), "--ids", "s0000",
    )  # fmt: skip

    assert ran.returncode == 2, ran.stdout
    assert "no run named 'breast-dmeo'" in ran.stderr
    assert str(Path(str(trained["state"])).resolve()) in ran.stderr
    assert "'breast-demo'" in ran.stderr  # what the state does hold
    assert ran.stdout == ""
    assert _remote_runs(trained["party_b"]) == ["breast-demo"]  # type: ignore[arg-type]


def test_evaluate_from_another_directory_says_where_it_looked(
    trained: dict[str, object], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    ran = _use(trained, "evaluate", "--config", str(DEMO_CONFIG), cwd=elsewhere)

    assert ran.returncode == 2
    assert f"no party A state in {elsewhere / 'fedlite-a-state'}" in ran.stderr
    assert "default --state-dir" in ran.stderr and "FEDLITE_A_STATE_DIR" in ran.stderr
    assert list(elsewhere.iterdir()) == []  # nothing made there
    assert _remote_runs(trained["party_b"]) == ["breast-demo"]  # type: ignore[arg-type]


def test_finish_of_a_run_never_trained_is_an_error(trained: dict[str, object]) -> None:
    party_b = trained["party_b"]
    assert isinstance(party_b, PartyBProcess)

    ran = run_cli(
        "a", "finish", "--server", party_b.url, "--token", TOKEN,
        "--state-dir", str(trained["state"]), "--name", "never-trained",
    )  # fmt: skip

    assert ran.returncode == 2 and "no run named 'never-trained'" in ran.stderr
    assert _remote_runs(party_b) == ["breast-demo"]


def test_a_trained_run_serves_by_name_alone_and_is_listed(trained: dict[str, object]) -> None:
    state = str(trained["state"])

    scored = _use(trained, "predict", "--name", "breast-demo", "--state-dir", state,
                  "--ids", "s0000,s0001")  # fmt: skip
    listed = run_cli("a", "runs", "--state-dir", state)

    assert scored.returncode == 0, scored.stderr
    rows = scored.stdout.strip().splitlines()
    assert rows[0] == "id,score_0,score_1" and [r.split(",")[0] for r in rows[1:]] == [
        "s0000",
        "s0001",
    ]
    assert listed.returncode == 0 and listed.stdout.startswith("breast-demo\tfinished\t")
    # the state holds the ids common with party B: private from the start
    assert (Path(state) / "party_a.sqlite").stat().st_mode & 0o777 == 0o600
    assert Path(state).stat().st_mode & 0o777 == 0o700


def test_the_progress_bar_shows_no_loss_before_the_first_step(
    trained: dict[str, object],
) -> None:
    drawn = str(trained["drawn"])

    assert f"{STEPS}/{STEPS}" in drawn  # the bar was drawn, to its end
    assert "loss 0.0000" not in drawn
    assert "loss -" in drawn  # the first frame: nothing known yet


def test_version_and_verbose_go_before_or_after_the_subcommand(
    trained: dict[str, object],
) -> None:
    from importlib.metadata import version

    state = str(trained["state"])
    first = run_cli("a", "--version")
    after = run_cli("a", "runs", "--state-dir", state, "-v")
    before = run_cli("a", "-v", "runs", "--state-dir", state)

    assert first.returncode == 0 and first.stdout.strip() == f"fedlite-a {version('fedlite-vfl')}"
    assert after.returncode == 0 and after.stdout == before.stdout != ""


def test_an_unknown_fedlite_a_variable_is_an_error(trained: dict[str, object]) -> None:
    ran = run_cli(
        "a", "runs", "--state-dir", str(trained["state"]),
        env={"FEDLITE_A_STATEDIR": "/tmp/x"},
    )  # fmt: skip

    assert ran.returncode == 2
    assert "FEDLITE_A_STATEDIR (did you mean FEDLITE_A_STATE_DIR?)" in ran.stderr


def test_the_summary_counts_every_http_body_both_ways(trained: dict[str, object]) -> None:
    data = trained["summary"]
    assert isinstance(data, dict)

    # the steps' bodies are a part of all bodies, in each direction
    assert data["http_bytes_sent"] > data["bytes_sent"] > 0
    assert data["http_bytes_received"] > data["bytes_received"] > 0
    for row in ("downlink bytes (steps)", "all HTTP bodies sent", "all HTTP bodies received"):
        assert row in str(trained["drawn"])
