"""Other versions of the product to measure beside this checkout's (``--baseline``,
``--candidate``): a commit's tree, and the name of what is measured."""

import shutil
import subprocess
from pathlib import Path

from benchmarks.common import ROOT

__all__ = ["baseline_tree", "revision"]

FLOOR = Path(__file__).resolve().parent


def baseline_tree(rev: str, into: Path) -> Path:
    """Commit ``rev`` of this repository in ``into``, with this checkout's floor package (so
    that this checkout can change while the benchmark runs)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    # the commit's own floor modules go, whether flat (benchmarks/floor*.py, before the
    # package) or packaged: a flat benchmarks/floor.py would shadow the package
    for old in (into / "benchmarks").glob("floor*"):
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    shutil.copytree(
        FLOOR, into / "benchmarks" / "floor", ignore=shutil.ignore_patterns("__pycache__")
    )
    return into


def revision() -> str:
    """This checkout's short commit, ``+changes`` when tracked files differ from it."""
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return head + ("+changes" if dirty else "")
