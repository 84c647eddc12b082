"""One serving party B per SQLite file, proven by a lock rather than assumed.

Replicas share a database server (PostgreSQL); a SQLite file is one party B's (docs/DEPLOY.md,
section 9). The process that serves a file holds an exclusive ``flock`` on ``<file>.serve-lock``
for its lifetime; a second ``fedlite-b serve`` on the same file is refused at start, naming the
process that holds it. The kernel drops the lock when its holder exits, ``kill -9`` included,
so a restart after a crash finds it free.

What the lock buys: a process that holds it is the only one that can load (and so claim the
lease of) any run of the file, so its commits need not fence the lease again
(``party_b.service.ownership``): the lease cannot move. Administrative commands on the same
file (tokens, backups, label draws, creating runs) take no lease and no lock.
"""

import fcntl
import os
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.engine import make_url

__all__ = ["SQLiteInUse", "hold", "holds", "release"]

# realpath of the SQLite file -> the open lock file of this process (kept open: closing it
# would release the lock)
_held: dict[str, int] = {}


class SQLiteInUse(RuntimeError):
    """Another process serves this SQLite file."""


def _database_file(url: str) -> str | None:
    """The real path of a SQLite URL's file; None for any other database or in memory."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return os.path.realpath(str(parsed.database))


def hold(url: str) -> bool:
    """Make this process the one that serves the SQLite file of ``url``, for its lifetime.

    True once held (again: a no-op); False for a database that is not a SQLite file (replicas
    may share it: they fence). Raises ``SQLiteInUse`` when another process holds it."""
    path = _database_file(url)
    if path is None:
        return False
    if path in _held:
        return True
    lock_path = Path(f"{path}.serve-lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise SQLiteInUse(
            f"another party B (process {holder}) serves {path}: one SQLite file has one party "
            "B. Stop that one first, or give this one its own --data-dir; several party B "
            "processes share a PostgreSQL database instead (--database-url, docs/DEPLOY.md "
            "section 9)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
    _held[path] = fd
    return True


def release(url: str) -> None:
    """Let go of the SQLite file of ``url`` (a no-op unless this process holds it): for a
    process that serves many files one after another (the experiments' in-process party
    B, a file per run), which would otherwise keep a lock file open per file."""
    path = _database_file(url)
    fd = _held.pop(path, None) if path is not None else None
    if fd is not None:
        os.close(fd)  # closing the last descriptor releases the flock


def holds(engine: Engine) -> bool:
    """Whether this process holds the serving lock of the engine's SQLite file."""
    path = _database_file(engine.url.render_as_string(hide_password=False))
    return path is not None and path in _held
