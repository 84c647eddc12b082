"""Run leases: which replica of party B holds a run, fenced by a token (table ``run_leases``).

Several party B processes may share one database (docs/DEPLOY.md, replicas). Each run is
held in memory by at most one of them at a time, and only its holder may commit what
changes the run. The protocol, one row per run:

    claim   (loading the run)      token := token + 1, holder := me; in the transaction that
                                   then reads the newest checkpoint. On PostgreSQL the upsert
                                   takes the row lock, so it waits for a commit of the old
                                   holder that is in flight and then reads what it wrote.
    fence   (every commit)         UPDATE ... WHERE token = the token I loaded with: 0 rows
                                   means someone claimed the run since, and the commit is
                                   refused. The update holds the row lock until the commit, so
                                   a claim cannot slip between the check and the write.
    release (an evicted run)       holder := NULL and token := token + 1, after its final
                                   checkpoint: a copy still referenced somewhere can no longer
                                   commit, and the run is free.

The token only grows (a fencing token): a replica that was paused, partitioned or simply
left with an old copy in memory fails its next commit instead of overwriting the new
holder's state. Callers commit.
"""

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from party_b.store.engine import Database
from party_b.store.tables import RunLease

__all__ = ["claim", "fence", "is_free", "lease_of", "release"]


def claim(session: Session, run_id: str, holder: str) -> int:
    """Make ``holder`` the run's holder; returns its new token (1 for a run never claimed)."""
    now = datetime.now(UTC)
    dialect = session.get_bind().dialect.name
    if dialect in ("postgresql", "sqlite"):
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        statement = (
            insert(RunLease)
            .values(run_id=run_id, holder=holder, token=1, held_at=now)
            .on_conflict_do_update(
                index_elements=[RunLease.run_id],
                set_={"holder": holder, "token": RunLease.token + 1, "held_at": now},
            )
            .returning(RunLease.token)
        )
        return int(session.execute(statement).scalar_one())
    # any other database: lock the row, then change or add it
    row = session.get(RunLease, run_id, with_for_update=True)
    if row is None:
        session.add(RunLease(run_id=run_id, holder=holder, token=1, held_at=now))
        session.flush()
        return 1
    row.holder, row.token, row.held_at = holder, row.token + 1, now
    session.flush()
    return row.token


def fence(db: Database, run_id: str, token: int) -> bool:
    """Whether ``token`` still holds the run; if so, its row stays locked until the commit."""
    result = db.execute(
        update(RunLease)
        .where(RunLease.run_id == run_id, RunLease.token == token)
        .values(held_at=datetime.now(UTC))
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult[Any], result).rowcount == 1


def release(session: Session, run_id: str, token: int) -> bool:
    """Leave the run unheld, if ``token`` still holds it (False: someone claimed it since)."""
    result = session.execute(
        update(RunLease)
        .where(RunLease.run_id == run_id, RunLease.token == token)
        .values(holder=None, token=token + 1, held_at=datetime.now(UTC))
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult[Any], result).rowcount == 1


def is_free(session: Session, run_id: str) -> bool:
    """No replica holds the run (never claimed, or released); locks its row if there is one."""
    row = session.execute(
        select(RunLease.holder).where(RunLease.run_id == run_id).with_for_update()
    ).first()
    return row is None or row.holder is None


def lease_of(session: Session, run_id: str) -> tuple[str | None, int] | None:
    """(holder, token) of the run's lease; None when it was never claimed (for operators and
    the failover benchmark, which finds the replica serving a run here)."""
    row = session.get(RunLease, run_id)
    return None if row is None else (row.holder, row.token)
