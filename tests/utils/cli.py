"""The two CLIs as a user runs them, on the bundled demo data (scikit-learn's breast-cancer
set: no ../shared/data needed).

``run_cli`` calls ``main(argv)`` of ``fedlite-a`` / ``fedlite-b`` in this process (their
output, exit code, environment and working directory as a process would have them, without
~3 s of imports per call); ``process=True`` runs the real ``python -m`` process instead, for
the tests whose subject is the process (start-up time, signals, what the shell sees).
"""

import contextlib
import io
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

from shared.demo_data import write_party_a_demo, write_party_b_demo

if TYPE_CHECKING:
    from collections.abc import Callable

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


# one in-process CLI run at a time: it swaps the process's environment and directory
_IN_PROCESS = threading.Lock()


def run_cli(
    party: str,
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    process: bool = False,
) -> Ran:
    """``fedlite-a`` (party "a") or ``fedlite-b`` (party "b") with ``args``; FEDLITE_* of
    this process are left out unless given in ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FEDLITE_A_", "FEDLITE_B_"))}
    if not process:
        return _in_process(party, list(args), cwd or REPO_ROOT, {**base, **(env or {})})
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


def _main(party: str) -> "Callable[[list[str]], int]":
    if party == "a":
        from party_a.cli import main as main_a

        return main_a
    from party_b.ops.cli import main as main_b

    return main_b


# loggers the CLIs configure (handlers, level, propagation): put back after each call
_LOGGERS = ("", "fedlite", "fedlite.party_a", "fedlite.party_b", "httpx", "uvicorn")


@contextlib.contextmanager
def _fresh_logging() -> Iterator[None]:
    """Logging as a new process has it (no handlers, so the CLI's own set-up takes effect
    and writes to the redirected stderr), restored afterwards."""
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers = []
    logging.getLogger().setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, handlers, level, propagate in saved:
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()
            lg.handlers, lg.level, lg.propagate = handlers, level, propagate


@contextlib.contextmanager
def _as_process(cwd: Path, env: dict[str, str]) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """The working directory, environment, standard streams and logging a process would
    have."""
    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    with (
        _IN_PROCESS,
        mock.patch.dict(os.environ, env, clear=True),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        _fresh_logging(),
    ):
        os.chdir(cwd)
        try:
            yield out, err
        finally:
            os.chdir(before)


def _in_process(party: str, args: list[str], cwd: Path, env: dict[str, str]) -> Ran:
    started = time.monotonic()
    with _as_process(cwd, env) as (out, err):
        try:
            code = _main(party)(args)
        except SystemExit as exc:  # argparse: --help, --version, a usage error
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
    return Ran(code, out.getvalue(), err.getvalue(), time.monotonic() - started)


def demo_tables(directory: Path) -> tuple[Path, Path]:
    """(party A's features, party B's labels) of the bundled demo, every id shared."""
    return (
        write_party_a_demo(directory / "features.csv"),
        write_party_b_demo(directory / "labels.csv"),
    )
