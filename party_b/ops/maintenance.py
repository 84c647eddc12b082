"""Party B's SQLite file as an operator handles it: created private, complete after a clean
stop, and backed up consistently while the service runs.

* :func:`create_private_database`: a new SQLite file is made mode 0600 in a 0700 directory
  (it holds token hashes and the PSI key; SQLite gives its ``-wal`` and ``-shm`` files the
  same mode).
* ``party_b.store.engine.checkpoint_wal`` (on SIGTERM): in WAL mode committed rows sit in
  ``party_b.sqlite-wal`` until a checkpoint copies them into the database file. Party B runs
  one (TRUNCATE) when it stops, so after a SIGTERM the ``.sqlite`` file alone holds
  everything: "stop, copy the file" works.
* :func:`backup_database`: SQLite's online backup API (a consistent snapshot, taken while
  party B keeps writing) into a new 0600 file that appears under its final name only once it
  is complete and passes ``PRAGMA integrity_check``.

Every refusal is a :class:`MaintenanceError` whose message names the file and the fix.
"""

import logging
import os
import sqlite3
from pathlib import Path

from sqlalchemy import make_url

from party_b.errors import MaintenanceError  # (defined there: the CLI reads it without SQLAlchemy)

__all__ = [
    "MaintenanceError",
    "backup_database",
    "create_private_database",
    "sqlite_path",
]

log = logging.getLogger("fedlite.party_b")


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for another database or an in-memory SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    if parsed.database == ":memory:" or parsed.database.startswith("file:"):
        return None
    return Path(parsed.database)


def create_private_database(url: str) -> bool:
    """Create the SQLite file of ``url`` (mode 0600; its directory 0700 when made here) if it
    does not exist yet. Returns whether it was created; other databases are left alone."""
    path = sqlite_path(url)
    if path is None or path.exists():
        return False
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError as exc:
        raise MaintenanceError(
            f"cannot create the database {path}: {exc.strerror}; check --data-dir "
            "(FEDLITE_B_DATA_DIR) and who may write there"
        ) from None
    return True


def backup_database(source: Path, target: Path) -> tuple[int, str]:
    """Online backup of ``source`` into the new file ``target``; (bytes, integrity check).

    Safe while party B serves: the backup API copies one consistent snapshot, and writers
    go on under WAL. The copy is a self-contained rollback-journal database (no ``-wal``
    beside it), created 0600, and renamed into place only when complete.
    """
    if not source.is_file():
        raise MaintenanceError(
            f"no database at {source}: check --data-dir (FEDLITE_B_DATA_DIR) or --database-url"
        )
    if target.exists():
        raise MaintenanceError(f"{target} exists; not overwriting it (choose a new name)")
    if not target.parent.is_dir():
        raise MaintenanceError(
            f"directory {target.parent} does not exist; create it first "
            f"(mkdir -p {target.parent}) or choose another --to"
        )
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        os.close(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError as exc:
        raise MaintenanceError(f"cannot write into {target.parent}: {exc.strerror}") from None
    try:
        check = _copy(source, partial)
        if check != "ok":
            raise MaintenanceError(f"the copy failed PRAGMA integrity_check: {check}")
        os.link(partial, target)  # fails, rather than overwrite, if target appeared meanwhile
    except FileExistsError:
        raise MaintenanceError(f"{target} appeared during the backup; not overwriting it") from None
    finally:
        partial.unlink(missing_ok=True)
    return target.stat().st_size, check


def _copy(source: Path, target: Path) -> str:
    # mode=rw: open the existing database, never create an empty one in its place
    src = sqlite3.connect(f"file:{source}?mode=rw", uri=True, timeout=30)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
        check = str(dst.execute("PRAGMA integrity_check").fetchone()[0])
    except sqlite3.Error as exc:
        raise MaintenanceError(f"backup of {source} failed: {exc}") from None
    finally:
        dst.close()
        src.close()
    return check
