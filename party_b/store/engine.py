"""Connecting to party B's database, and copying it to another one.

SQLite by default (WAL journal, busy timeout, foreign keys on); any SQLAlchemy URL works.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Integer, create_engine, event, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from party_b.store.tables import Base

__all__ = [
    "Database",
    "checkpoint_wal",
    "connection_of",
    "copy_database",
    "make_engine",
    "make_session_factory",
    "one_at_a_time",
]

log = logging.getLogger("fedlite.party_b")

# Where a write goes: an ORM session's transaction, or a Core connection's (a step's commit
# takes a connection: a session's set-up and bookkeeping cost more than its one insert)
Database = Session | Connection


def connection_of(db: Database) -> Connection:
    """The connection a write on ``db`` executes on: the session's (in its transaction)."""
    return db if isinstance(db, Connection) else db.connection()


_STARTUP_LOCK = 0x46454442  # PostgreSQL advisory lock key of party B's start-up ("FEDB")


def make_engine(url: str) -> Engine:
    """An engine with SQLite made safe for concurrent threads and crashes (WAL, busy wait)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            # NORMAL in WAL mode survives a killed process (not a power cut) and is much faster
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()
    else:
        engine = create_engine(url, pool_pre_ping=True)
    with one_at_a_time(engine):
        Base.metadata.create_all(engine)
    return engine


@contextmanager
def one_at_a_time(engine: Engine) -> Iterator[None]:
    """Start-up work that replicas of party B sharing one PostgreSQL database must not do at
    once (creating tables, registering tokens: two replicas starting together raced into
    duplicate-key errors): one process at a time, by an advisory lock. A no-op on other
    databases (one SQLite file has one party B)."""
    if engine.dialect.name != "postgresql":
        yield
        return
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _STARTUP_LOCK})
        try:
            yield
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _STARTUP_LOCK})


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def copy_database(source: Engine, target: Engine, *, batch: int = 200) -> dict[str, int]:
    """Copy every table of party B's state from ``source`` to an empty ``target``.

    For moving from SQLite to PostgreSQL (or back) with party B stopped. Rows stream in
    batches (checkpoints can be large), all in one transaction on the target, so a failed
    copy leaves the target empty. Returns the number of rows copied per table.
    """
    Base.metadata.create_all(target)
    tables = Base.metadata.sorted_tables  # parents before children (foreign keys)
    with target.connect() as check:
        for table in tables:
            if check.scalar(select(func.count()).select_from(table)):
                raise ValueError(f"the target database is not empty (table {table.name})")
    copied: dict[str, int] = {}
    with source.connect() as src, target.begin() as dst:
        for table in tables:
            copied[table.name] = 0
            result = src.execution_options(yield_per=batch).execute(select(table))
            for rows in result.mappings().partitions(batch):
                dst.execute(table.insert(), [dict(r) for r in rows])
                copied[table.name] += len(rows)
        if target.dialect.name == "postgresql":
            # ids were copied verbatim; move each serial sequence past them
            for table in tables:
                for column in table.primary_key.columns:
                    if column.autoincrement is True or (
                        column.autoincrement == "auto"
                        and isinstance(column.type, Integer)
                        and len(table.primary_key.columns) == 1
                    ):
                        dst.execute(
                            text(
                                f"SELECT setval(pg_get_serial_sequence('{table.name}', "
                                f"'{column.name}'), COALESCE(MAX({column.name}), 0) + 1, false) "
                                f"FROM {table.name}"
                            )
                        )
    return copied


def checkpoint_wal(engine: Engine) -> None:
    """Copy every committed page from the WAL into the database file and empty the WAL
    (SQLite only; a no-op for other databases). Called when party B stops."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as connection:
        row = connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").one()
    busy, wal_pages, moved = (int(v) for v in row)
    if busy or moved < wal_pages:
        log.warning(
            "WAL checkpoint incomplete (%d of %d pages; a reader was busy): the database "
            "file alone may lack the newest rows; keep its -wal file with it",
            moved,
            wal_pages,
        )
