"""The operator's papercuts of issue 34, each as the operator meets it:

* the operator's commands (``token issue``, ``list``, ``revoke``, ``budget``, ``audit``,
  ``runs list``, ``parties list``, ``db backup``) never import torch: ``token issue`` took
  13-22 s when one did; in a fresh process, what is imported is checked, not the clock;
* a duration no date holds (``audit --since 99999999d``, ``token issue --expires
  99999999d``) is one line naming the flag and exit code 2, not a traceback;
* the demos' state directories are ignored by git;
* ``fedlite-b health``, which a container or Kubernetes runs as its probe every few seconds,
  imports nothing of the database (SQLAlchemy and the admin modules took 0.29 s of the CLI's
  0.43 s import).
"""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.cli import REPO_ROOT, run_cli
from tests.utils.live import live_server
from tests.utils.small_runs import TOKEN, labels_csv

COMMANDS = [
    ["token", "issue", "--name", "scorer", "--scope", "predict", "--expires", "30d"],
    ["token", "list"],
    ["token", "budget", "--name", "scorer"],
    ["audit", "--since", "7d"],
    ["runs", "list"],
    ["parties", "list"],
    ["token", "revoke", "--name", "scorer"],
]


def test_the_operators_commands_import_no_torch(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "b")
    script = (
        "import sys\n"
        "from party_b.ops.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print('torch' in sys.modules, code)\n"
    )
    backup = ["db", "backup", "--to", str(tmp_path / "copy.sqlite")]
    for command in [*COMMANDS, backup]:
        ran = subprocess.run(
            [sys.executable, "-c", script, *command, "--data-dir", data_dir],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=120,
        )
        assert ran.stdout.split()[-2:] == ["False", "0"], (command, ran.stdout, ran.stderr)


def test_the_health_probe_imports_no_database_and_answers_for_a_real_server(
    tmp_path: Path,
) -> None:
    settings = Settings(
        data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "labels.csv"), tokens=f"t:{TOKEN}"
    )
    script = (
        "import sys\n"
        "from party_b.ops.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(sorted(m for m in ('sqlalchemy', 'torch') if m in sys.modules), code)\n"
    )
    with live_server(create_app(settings)) as url:
        port = url.rsplit(":", 1)[1]
        for ready in ([], ["--ready"]):
            ran = subprocess.run(
                [sys.executable, "-c", script, "health", "--port", port, *ready],
                capture_output=True,
                text=True,
                cwd=REPO_ROOT,
                timeout=120,
            )
            assert ran.stdout.split()[-2:] == ["[]", "0"], (ready, ran.stdout, ran.stderr)
    # a port held by a socket that does not listen (refuses every connection): exit 1, one
    # line naming the URL
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = str(closed.getsockname()[1])
        ran = subprocess.run(
            [sys.executable, "-m", "party_b.ops.cli", "-v", "health", "--port", port],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=120,
        )
    assert ran.returncode == 1 and f"127.0.0.1:{port}/healthz" in ran.stderr, ran.stderr


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["audit", "--since", "99999999d"], "--since '99999999d' reaches back before the year 1"),
        (["audit", "--until", "99999999999999d"], "--until '99999999999999d': a duration of at"),
        (
            ["token", "issue", "--name", "x", "--expires", "99999999d"],
            "--expires '99999999d' is past the year 9999",
        ),
    ],
)
def test_a_duration_no_date_holds_is_one_line_naming_the_flag(
    tmp_path: Path, command: list[str], message: str
) -> None:
    data_dir = tmp_path / "b"
    run_cli("b", "token", "issue", "--name", "first", "--data-dir", str(data_dir))

    ran = run_cli("b", *command, "--data-dir", str(data_dir))

    assert ran.returncode == 2, ran.stderr
    assert message in ran.stderr and len(ran.stderr.strip().splitlines()) == 1, ran.stderr


def test_the_demos_state_directories_are_not_in_git() -> None:
    """``make demo`` and ``make demo-parties`` write into the checkout: git ignores both."""
    for directory in ("demo-state", "demo-parties-state"):
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", f"{directory}/party_b.sqlite"],
            cwd=REPO_ROOT,
            timeout=60,
        )
        assert ignored.returncode == 0, directory
