"""A checkpoint is either wholly there or not there, whenever the writer dies.

A subprocess writes 4 MiB checkpoints through the real stores (party B's and party A's) as
fast as it can; the test SIGKILLs it ten times per store, restarting it on the same database
each time: a seeded-random moment after it begins a checkpoint, or while it waits just before
or just after a commit (so that both sides of a commit are hit whatever the machine's speed).
After every kill:
``PRAGMA integrity_check`` is clean, the checkpoints present are exactly the newest ``KEEP``
up to the last committed one, and each holds exactly the bytes written for its step.
"""

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.utils.checkpoint_writer import KEEP, payload
from tests.utils.crash import integrity, snapshot
from tests.utils.servers import REPO_ROOT

KILLS = 10


def _checkpoints(database: Path) -> dict[int, tuple[bytes, bytes]]:
    copy = snapshot(database)
    try:
        with sqlite3.connect(copy) as db:
            rows = db.execute("SELECT step, model_state, optimizer_state FROM checkpoints")
            return {step: (model, optimizer) for step, model, optimizer in rows.fetchall()}
    finally:
        shutil.rmtree(copy.parent)


@pytest.mark.parametrize("side", ["b", "a"])
def test_a_checkpoint_killed_mid_write_is_wholly_there_or_not_there(
    tmp_path: Path, side: str
) -> None:
    database = tmp_path / "state.sqlite"
    rng = random.Random(1234)
    outcomes = {"committed": 0, "absent": 0}

    for kill in range(KILLS):
        strike_at = rng.randint(1, 3)  # let a checkpoint or two through, then strike
        mode = ("random", "before-commit", "after-commit")[kill % 3]
        first = max(_checkpoints(database), default=0) + 1 if database.exists() else 1
        env = dict(os.environ)
        if mode != "random":
            env["FEDLITE_TEST_STALL"] = f"{mode}:{first + strike_at - 1}"
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.utils.checkpoint_writer", side, str(database)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert writer.stdout is not None
        printed: list[str] = []
        for line in writer.stdout:
            printed.append(line)
            if mode == "random" and sum(p.startswith("begin") for p in printed) == strike_at:
                time.sleep(rng.uniform(0.0, 0.2))  # in that write, its commit, or the next
                break
            if mode != "random" and line.startswith("stalled"):
                break
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
        printed += writer.stdout.readlines()
        writer.stdout.close()
        begun = max(int(p.split()[1]) for p in printed if p.startswith("begin"))
        committed = max([int(p.split()[1]) for p in printed if p.startswith("committed")] + [0])

        assert integrity(database) == "ok"
        present = _checkpoints(database)
        newest = max(present)
        # the last checkpoint reported committed is there; the one being written may be
        assert committed <= newest <= begun and begun - newest <= 1, (printed, sorted(present))
        outcomes["committed" if newest == begun else "absent"] += 1
        if mode == "before-commit":
            assert newest == begun - 1, (mode, printed, sorted(present))
        if mode == "after-commit":
            assert newest == begun, (mode, printed, sorted(present))
        assert sorted(present) == list(range(max(1, newest - KEEP + 1), newest + 1))
        for step, (model, optimizer) in present.items():
            assert model == payload(step, "model") and optimizer == payload(step, "optimizer")

    # the kills landed on both sides of a commit: some checkpoints made it, some did not
    assert outcomes["committed"] and outcomes["absent"], outcomes


@pytest.mark.parametrize("side", ["b", "a"])
def test_both_stores_run_sqlite_in_wal_mode_with_a_busy_timeout(tmp_path: Path, side: str) -> None:
    from sqlalchemy import text

    from party_a.store import LocalStore
    from party_b.store import make_engine

    url = f"sqlite:///{tmp_path / 'state.sqlite'}"
    engine = make_engine(url) if side == "b" else LocalStore(url).engine
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA busy_timeout")).scalar() == 30000
    engine.dispose()
