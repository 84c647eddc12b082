"""One SQLite file, one serving party B (``party_b.store.sole``), with the real CLI: a second
``fedlite-b serve`` on a file another one serves is refused at start and names the process
that serves it; a SIGKILLed party B leaves the file free for its restart."""

import subprocess
import sys
from pathlib import Path

from tests.utils.servers import ALICE, REPO_ROOT, breast_party_b, free_port


def test_a_second_party_b_on_one_sqlite_file_is_refused_at_start(tmp_path: Path) -> None:
    with breast_party_b(tmp_path / "party_b") as first:
        assert first.proc is not None
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "party_b.ops.cli",
                "serve",
                "--port",
                str(free_port()),
                "--data-dir",
                str(first.data_dir),
                "--labels",
                str(first.labels),
                "--tokens",
                f"alice:{ALICE}",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=300,
            check=False,
        )

        assert second.returncode == 2, second.stderr
        assert f"another party B (process {first.proc.pid}) serves" in second.stderr
        assert "one SQLite file has one party B" in second.stderr

        # the first one serves on, and a SIGKILL frees the file for its restart
        first.kill9()
        first.start()
        assert first.proc.poll() is None
