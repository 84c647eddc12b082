"""Party B's persistent state through SQLAlchemy 2.0: tokens, runs, step log, checkpoints,
PSI keys.

SQLite by default (WAL journal, busy timeout, foreign keys on); any SQLAlchemy URL works, and
the types used here (JSON, LargeBinary) are portable to PostgreSQL. A checkpoint is one row
written in one transaction together with the pruning of older ones, so after a crash it is
either wholly there or not there.
"""

import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    create_engine,
    delete,
    event,
    func,
    select,
    text,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

__all__ = [
    "ApiToken",
    "Base",
    "Checkpoint",
    "EvalResult",
    "IdempotencyKey",
    "PsiKey",
    "Run",
    "StepLog",
    "copy_database",
    "make_engine",
    "make_session_factory",
    "psi_key",
]


def _now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class ApiToken(Base):
    """An operator-issued bearer token, stored only as its SHA-256."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(120), unique=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), index=True)
    name: Mapped[str] = mapped_column(String(120))
    status: Mapped[str] = mapped_column(String(16), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    alignment_key: Mapped[str] = mapped_column(String(64))
    num_classes: Mapped[int] = mapped_column(Integer)
    side_features: Mapped[int] = mapped_column(Integer)
    # Sorted 32-byte HMACs of the intersection, concatenated (set once, at alignment).
    aligned_ids: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    train_size: Mapped[int | None] = mapped_column(Integer, default=None)
    eval_size: Mapped[int | None] = mapped_column(Integer, default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=_now, onupdate=_now
    )


class StepLog(Base):
    """One row per applied training step (rows past a restored checkpoint are deleted)."""

    __tablename__ = "step_log"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    loss: Mapped[float | None] = mapped_column(Float)
    accuracy: Mapped[float | None] = mapped_column(Float)
    bytes_in: Mapped[int] = mapped_column(Integer)
    bytes_out: Mapped[int] = mapped_column(Integer)
    decode_ms: Mapped[float] = mapped_column(Float)
    compute_ms: Mapped[float] = mapped_column(Float)
    total_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Checkpoint(Base):
    """Top model and optimizer after ``step``, plus that step's request hash and response.

    Keeping the response lets a restarted party B answer a resent step identically.
    """

    __tablename__ = "checkpoints"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_state: Mapped[bytes] = mapped_column(LargeBinary)
    optimizer_state: Mapped[bytes] = mapped_column(LargeBinary)
    request_sha256: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    response: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class EvalResult(Base):
    __tablename__ = "eval_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    split: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class RevokedToken(Base):
    """The SHA-256 of every token ever revoked, kept after its name gets a new token.

    ``api_tokens`` holds one (current) token per name; without this table, revoking a leaked
    token and issuing a new one under the same name forgot the old hash, and the next start-up
    that registered the old token from FEDLITE_B_TOKENS brought it back. A table of its own so
    that an older database gains it with ``create_all``, without a migration.
    """

    __tablename__ = "revoked_tokens"

    token_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(120))
    revoked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class IdempotencyKey(Base):
    """The ``Idempotency-Key`` of the POST that created a run, per token.

    A retried ``POST /v1/runs`` whose answer was lost gets this run back instead of creating a
    second one. A table of its own (not a column of ``runs``) so that a database from before
    it gains it with ``create_all`` at start-up, without a migration.
    """

    __tablename__ = "idempotency_keys"

    owner_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class PsiKey(Base):
    """Party B's secret PSI scalar for one id set, and the public name of that set.

    Keeping the key keeps party B's blinded set (and so party A's cached intersections) valid
    across restarts; a new label table gets a new row. It is as secret as the ids themselves:
    with it and a PSI set-up, anyone can test guessed ids.
    """

    __tablename__ = "psi_keys"

    ids_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)  # dataset_digest
    dataset_version: Mapped[str] = mapped_column(String(32), unique=True)
    private_key: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


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
    Base.metadata.create_all(engine)
    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


# --------------------------------------------------------------------------------- checkpoints


def save_checkpoint(
    session: Session,
    *,
    run_id: str,
    step: int,
    model_state: bytes,
    optimizer_state: bytes,
    request_sha256: bytes | None,
    response: bytes | None,
    keep: int,
) -> None:
    """Insert (or replace) the checkpoint of ``step`` and prune to the newest ``keep``.

    The caller commits; all of it lands in one transaction.
    """
    session.merge(
        Checkpoint(
            run_id=run_id,
            step=step,
            model_state=model_state,
            optimizer_state=optimizer_state,
            request_sha256=request_sha256,
            response=response,
        )
    )
    session.flush()
    kept = session.scalars(
        select(Checkpoint.step)
        .where(Checkpoint.run_id == run_id)
        .order_by(Checkpoint.step.desc())
        .limit(keep)
    ).all()
    session.execute(
        delete(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.step.not_in(kept))
    )


def checkpoint_steps(session: Session, run_id: str) -> list[int]:
    return list(
        session.scalars(
            select(Checkpoint.step).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step)
        )
    )


def load_checkpoint(session: Session, run_id: str, step: int | None = None) -> Checkpoint | None:
    """The checkpoint of ``step``, or the newest one when ``step`` is None."""
    query = select(Checkpoint).where(Checkpoint.run_id == run_id)
    if step is None:
        query = query.order_by(Checkpoint.step.desc()).limit(1)
    else:
        query = query.where(Checkpoint.step == step)
    return session.scalars(query).first()


def forget_after(session: Session, run_id: str, step: int) -> None:
    """Drop step-log rows and checkpoints past ``step``: that future was rolled back."""
    session.execute(delete(StepLog).where(StepLog.run_id == run_id, StepLog.step > step))
    session.execute(delete(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.step > step))


# --------------------------------------------------------------------------------- PSI keys


def psi_key(session: Session, *, ids_sha256: str, new_key: Callable[[], bytes]) -> PsiKey:
    """The PSI key row of an id set, created (and committed) on first use."""
    row = session.get(PsiKey, ids_sha256)
    if row is None:
        row = PsiKey(
            ids_sha256=ids_sha256, dataset_version=secrets.token_hex(8), private_key=new_key()
        )
        session.add(row)
        try:
            session.commit()
        except IntegrityError:  # another process of party B made it first
            session.rollback()
            row = session.get(PsiKey, ids_sha256)
            assert row is not None
    return row


# --------------------------------------------------------------------------------- migration


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
