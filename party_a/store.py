"""Party A's own persistent state (SQLite through SQLAlchemy): runs, checkpoints, step log,
and private set intersections with party B cached per pair of dataset versions.

A local run is found again by (server URL, run name), so ``fedlite-a train`` with the same
config picks up where it stopped. Checkpoints hold the bottom model and optimizer after a
step and are written in one transaction with the pruning of older ones.
"""

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
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
    UniqueConstraint,
    create_engine,
    delete,
    event,
    insert,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

__all__ = ["LocalCheckpoint", "LocalRun", "LocalStep", "LocalStore", "PsiResult", "RunServing"]


def _now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class LocalRun(Base):
    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("server", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    server: Mapped[str] = mapped_column(String(500))
    name: Mapped[str] = mapped_column(String(120))
    remote_id: Mapped[str] = mapped_column(String(64))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    alignment_key: Mapped[str] = mapped_column(String(64))
    aligned_ids: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    # JSON bodies of the alignment exchange, both directions (counted once per run)
    alignment_bytes: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default="training")
    final_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class LocalCheckpoint(Base):
    __tablename__ = "checkpoints"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_state: Mapped[bytes] = mapped_column(LargeBinary)
    optimizer_state: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class RunServing(Base):
    """What serving a run needs besides the bottom model: the feature transform (fitted on
    the training rows when the run is aligned) and the codebook frozen at the end of training.

    A table of its own so that an older database gains it with ``create_all``.
    """

    __tablename__ = "run_serving"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    transform: Mapped[dict[str, Any]] = mapped_column(JSON)  # FeatureTransform.to_json()
    codebook: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)  # .npy (R, L, s)
    codebook_step: Mapped[int | None] = mapped_column(Integer, default=None)  # model step


class LocalStep(Base):
    __tablename__ = "steps"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    loss: Mapped[float | None] = mapped_column(Float)
    bytes_sent: Mapped[int] = mapped_column(Integer)
    bytes_received: Mapped[int] = mapped_column(Integer)
    raw_bytes: Mapped[int] = mapped_column(Integer)  # what SplitFed would have sent
    step_ms: Mapped[float] = mapped_column(Float)


class PsiResult(Base):
    """One PSI with party B: the ids both hold, for one version of each side's id set."""

    __tablename__ = "psi_results"
    __table_args__ = (UniqueConstraint("server", "own_version", "peer_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    server: Mapped[str] = mapped_column(String(500))
    own_version: Mapped[str] = mapped_column(String(64))  # dataset_digest of party A's ids
    peer_version: Mapped[str] = mapped_column(String(64))  # party B's dataset_version
    own_size: Mapped[int] = mapped_column(Integer)
    peer_size: Mapped[int] = mapped_column(Integer)
    intersection: Mapped[list[str]] = mapped_column(JSON)  # party A's raw ids, sorted
    wire_bytes: Mapped[int] = mapped_column(Integer)  # PSI request + reply bodies
    seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class StoreIdentity(Base):
    """One random id per state directory, made the first time it is asked for.

    Run creation derives its Idempotency-Key from it (see ``PartyATrainer.prepare``): a party
    A that dies after party B created its run but before writing it down here asks for the
    same run again on restart; a fresh state directory is a new identity and gets new runs.
    A table of its own so that an older database gains it with ``create_all``.
    """

    __tablename__ = "store_identity"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)  # always 1
    value: Mapped[str] = mapped_column(String(32))


class LocalStore:
    """Party A's database. One file per state directory; safe to reopen after a crash."""

    def __init__(self, url: str) -> None:
        self.engine = _make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @classmethod
    def in_directory(cls, directory: Path) -> "LocalStore":
        directory.mkdir(parents=True, exist_ok=True)
        return cls(f"sqlite:///{(directory / 'party_a.sqlite').resolve()}")

    def session(self) -> Session:
        return self._sessions()

    def close(self) -> None:
        self.engine.dispose()

    def identity(self) -> str:
        """This state directory's random id (32 hex characters), stable across restarts."""
        with self.session() as s:
            row = s.get(StoreIdentity, 1)
            if row is None:
                row = StoreIdentity(id=1, value=secrets.token_hex(16))
                s.add(row)
                s.commit()
            return row.value

    # ------------------------------------------------------------------ runs

    def find_run(self, server: str, name: str) -> LocalRun | None:
        with self.session() as s:
            return s.scalar(
                select(LocalRun).where(LocalRun.server == server, LocalRun.name == name)
            )

    def add_run(self, run: LocalRun) -> LocalRun:
        with self.session() as s:
            s.add(run)
            s.commit()
            return run

    def update_run(self, run_id: int, **fields: Any) -> None:
        with self.session() as s:
            run = s.get(LocalRun, run_id)
            assert run is not None
            for key, value in fields.items():
                setattr(run, key, value)
            s.commit()

    def delete_run(self, run_id: int) -> None:
        with self.session() as s:
            s.execute(delete(LocalStep).where(LocalStep.run_id == run_id))
            s.execute(delete(LocalCheckpoint).where(LocalCheckpoint.run_id == run_id))
            s.execute(delete(RunServing).where(RunServing.run_id == run_id))
            s.execute(delete(LocalRun).where(LocalRun.id == run_id))
            s.commit()

    # ------------------------------------------------------------------ serving

    def serving(self, run_id: int) -> RunServing | None:
        with self.session() as s:
            return s.get(RunServing, run_id)

    def save_serving(self, entry: RunServing) -> None:
        with self.session() as s:
            s.merge(entry)
            s.commit()

    # ------------------------------------------------------------------ PSI results

    def find_psi(self, server: str, own_version: str, peer_version: str) -> PsiResult | None:
        with self.session() as s:
            return s.scalar(
                select(PsiResult).where(
                    PsiResult.server == server,
                    PsiResult.own_version == own_version,
                    PsiResult.peer_version == peer_version,
                )
            )

    def newest_psi(self, server: str, own_version: str) -> PsiResult | None:
        """The newest PSI of this id set with ``server``, whatever party B's version was."""
        with self.session() as s:
            return s.scalar(
                select(PsiResult)
                .where(PsiResult.server == server, PsiResult.own_version == own_version)
                .order_by(PsiResult.created_at.desc(), PsiResult.id.desc())
                .limit(1)
            )

    def save_psi(self, result: PsiResult) -> PsiResult:
        """Store (or replace) the result for its (server, own_version, peer_version)."""
        with self.session() as s:
            s.execute(
                delete(PsiResult).where(
                    PsiResult.server == result.server,
                    PsiResult.own_version == result.own_version,
                    PsiResult.peer_version == result.peer_version,
                )
            )
            s.add(result)
            s.commit()
            return result

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(
        self,
        run_id: int,
        step: int,
        model_state: bytes,
        optimizer_state: bytes,
        *,
        keep: int,
        steps: Sequence[LocalStep] = (),
    ) -> None:
        """The checkpoint of ``step``, the step-log rows ``steps`` (those since the last
        checkpoint) and the pruning to the newest ``keep``: one transaction."""
        with self.session() as s:
            _put_steps(s, steps)
            s.merge(
                LocalCheckpoint(
                    run_id=run_id,
                    step=step,
                    model_state=model_state,
                    optimizer_state=optimizer_state,
                )
            )
            s.flush()
            kept = s.scalars(
                select(LocalCheckpoint.step)
                .where(LocalCheckpoint.run_id == run_id)
                .order_by(LocalCheckpoint.step.desc())
                .limit(keep)
            ).all()
            s.execute(
                delete(LocalCheckpoint).where(
                    LocalCheckpoint.run_id == run_id, LocalCheckpoint.step.not_in(kept)
                )
            )
            s.commit()

    def checkpoint_steps(self, run_id: int) -> list[int]:
        with self.session() as s:
            return list(
                s.scalars(
                    select(LocalCheckpoint.step)
                    .where(LocalCheckpoint.run_id == run_id)
                    .order_by(LocalCheckpoint.step)
                )
            )

    def load_checkpoint(self, run_id: int, step: int | None = None) -> LocalCheckpoint | None:
        with self.session() as s:
            query = select(LocalCheckpoint).where(LocalCheckpoint.run_id == run_id)
            if step is None:
                query = query.order_by(LocalCheckpoint.step.desc()).limit(1)
            else:
                query = query.where(LocalCheckpoint.step == step)
            return s.scalars(query).first()

    def forget_after(self, run_id: int, step: int) -> None:
        """Drop steps and checkpoints past ``step`` (the run was rolled back to it)."""
        with self.session() as s:
            s.execute(delete(LocalStep).where(LocalStep.run_id == run_id, LocalStep.step > step))
            s.execute(
                delete(LocalCheckpoint).where(
                    LocalCheckpoint.run_id == run_id, LocalCheckpoint.step > step
                )
            )
            s.commit()

    # ------------------------------------------------------------------ step log

    def log_step(self, entry: LocalStep) -> None:
        self.log_steps([entry])

    def log_steps(self, entries: Sequence[LocalStep]) -> None:
        """Add (or replace) step-log rows, in one transaction."""
        with self.session() as s:
            _put_steps(s, entries)
            s.commit()

    def steps(self, run_id: int) -> list[LocalStep]:
        with self.session() as s:
            return list(
                s.scalars(
                    select(LocalStep).where(LocalStep.run_id == run_id).order_by(LocalStep.step)
                )
            )


def _put_steps(session: Session, entries: Sequence[LocalStep]) -> None:
    """Replace the step-log rows of ``entries`` (one run's): one DELETE and one INSERT of
    them all, where the ORM merged them a row and a SELECT at a time."""
    if not entries:
        return
    columns = [c.key for c in LocalStep.__table__.columns]
    rows = [{c: getattr(e, c) for c in columns} for e in entries]
    for run_id in {e.run_id for e in entries}:
        steps = [e.step for e in entries if e.run_id == run_id]
        session.execute(
            delete(LocalStep).where(LocalStep.run_id == run_id, LocalStep.step.in_(steps))
        )
    session.execute(insert(LocalStep), rows)


def _make_engine(url: str) -> Engine:
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    Base.metadata.create_all(engine)
    return engine
