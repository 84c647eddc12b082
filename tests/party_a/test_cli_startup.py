"""``fedlite-a`` loads only what a command needs: ``--help``, ``runs`` and ``check`` never
import torch (3 s of the 3.5 s every command used to pay before argparse ran).

Each case runs the CLI in a fresh interpreter and reads ``sys.modules`` after it: what was
imported, not how long it took (timings are benchmarks/first_contact.py's job).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from party_a.session import open_state
from tests.utils.cli import REPO_ROOT

HEAVY = ("torch", "numba", "pandas", "pyarrow", "private_set_intersection")

_PROBE = """
import json, sys
from party_a.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:  # argparse's --help
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules if "." not in m)}))
"""


def _loaded(*argv: str, cwd: Path) -> tuple[int, set[str]]:
    ran = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    last = ran.stdout.strip().splitlines()[-1]
    answer = json.loads(last)
    return int(answer["code"] or 0), set(answer["modules"])


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("train", "--help"),
        ("predict", "--help"),
        ("--version",),
    ],
)
def test_help_imports_neither_torch_nor_pydantic(argv: tuple[str, ...], tmp_path: Path) -> None:
    code, modules = _loaded(*argv, cwd=tmp_path)
    assert code == 0
    assert not modules & {*HEAVY, "pydantic", "httpx", "sqlalchemy", "numpy"}


def test_runs_and_check_do_not_import_torch(tmp_path: Path) -> None:
    # runs: party A's store opened and read (an empty one)
    open_state(tmp_path / "state", create=True).close()
    code, modules = _loaded("runs", "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert code == 0
    assert "sqlalchemy" in modules
    assert not modules & set(HEAVY)
    # check: nothing listens there; the answer is exit 1 after one short try
    code, modules = _loaded(
        "check", "--server", "http://127.0.0.1:9", "--token", "t" * 20, "--retry-for", "0",
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 1
    assert "httpx" in modules  # it did try to reach party B
    assert not modules & set(HEAVY)
