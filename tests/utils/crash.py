"""Checks of a SQLite database left behind by a killed process."""

import shutil
import sqlite3
import tempfile
from pathlib import Path

from shared import codec
from shared.training import state_from_bytes


def snapshot(database: Path) -> Path:
    """Copy the database with its -wal and -shm files, as the killed process left them.

    Checks run on the copy: opening the original would run SQLite's crash recovery (and fold
    the WAL in) before the restarted process gets to do it itself.
    """
    target = Path(tempfile.mkdtemp(prefix="crash-")) / database.name
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{database}{suffix}")
        if source.exists():
            shutil.copyfile(source, f"{target}{suffix}")
    return target


def integrity(database: Path) -> str:
    """``PRAGMA integrity_check`` of a snapshot of ``database``: "ok" when sound."""
    copy = snapshot(database)
    try:
        with sqlite3.connect(copy) as db:
            rows = db.execute("PRAGMA integrity_check").fetchall()
        return "; ".join(str(r[0]) for r in rows)
    finally:
        shutil.rmtree(copy.parent)


def party_b_checkpoints(database: Path) -> dict[str, list[int]]:
    """Every checkpoint row of party B, checked to be whole: {run id: [steps]}.

    Whole means: the model and optimizer states load (weights-only) and the stored response,
    if any, decodes as the StepResponse of that very step.
    """
    copy = snapshot(database)
    found: dict[str, list[int]] = {}
    try:
        with sqlite3.connect(copy) as db:
            rows = db.execute(
                "SELECT run_id, step, model_state, optimizer_state, request_sha256, response "
                "FROM checkpoints ORDER BY run_id, step"
            ).fetchall()
        for run_id, step, model, optimizer, sha, response in rows:
            state_from_bytes(model)
            state_from_bytes(optimizer)
            if response is not None:
                assert codec.decode_step_response(response).step == step
                assert len(sha) == 32
            found.setdefault(run_id, []).append(step)
        return found
    finally:
        shutil.rmtree(copy.parent)
