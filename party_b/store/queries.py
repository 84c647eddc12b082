"""Every query party B's service makes about runs, their logs and PSI keys.

The rooms of ``party_b.service`` hold no SQL of their own: they open a session, call these
and commit. Functions that write leave the commit to the caller (one transaction per
operation), except ``psi_key``, which commits the row it creates.
"""

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from party_b.store.engine import Database, connection_of
from party_b.store.parties import PartyToken, PartyTraffic
from party_b.store.tables import (
    Checkpoint,
    EvalResult,
    IdempotencyKey,
    PsiKey,
    Run,
    RunLease,
    RunPrivacy,
    StepLog,
)

__all__ = [
    "add_run",
    "add_run_privacy",
    "count_open_runs",
    "delete_run",
    "eval_results",
    "log_evaluation",
    "lock_owner",
    "log_step",
    "owned_run",
    "psi_key",
    "run_created_with_key",
    "run_privacy",
    "runs_in_status",
    "run_by_id",
    "runs_of",
    "step_log",
]


_OWNER_LOCKS = 0x46454442  # advisory lock key space of run creation per owner

# --------------------------------------------------------------------------------- runs


def owned_run(session: Session, owner_id: int, run_id: str) -> Run | None:
    """The run ``run_id`` if ``owner_id`` owns it; None for another owner's run and for no
    run alike (one indexed lookup either way: the answer and its cost say nothing more)."""
    query = select(Run).where(Run.id == run_id, Run.owner_id == owner_id)
    return session.scalars(query).first()


PARTY_TABLES = (PartyToken, PartyTraffic)


def delete_run(session: Session, run_id: str) -> None:
    """Delete a run and everything stored for it (step log, checkpoints, evaluations, the
    key it was created with, its privacy policy, its lease, its parties); explicit rather
    than by cascade, which PostgreSQL and SQLite would both do but an older SQLite file may
    not have declared."""
    for table in (
        StepLog,
        Checkpoint,
        EvalResult,
        IdempotencyKey,
        RunPrivacy,
        RunLease,
    ) + PARTY_TABLES:
        session.execute(delete(table).where(table.run_id == run_id))
    session.execute(delete(Run).where(Run.id == run_id))


def run_by_id(session: Session, run_id: str) -> Run | None:
    """Any owner's run: for the operator's own commands (export), never for a caller."""
    return session.get(Run, run_id)


def runs_of(session: Session, owner_id: int) -> Sequence[Run]:
    """The owner's runs, oldest first."""
    query = select(Run).where(Run.owner_id == owner_id).order_by(Run.created_at)
    return session.scalars(query).all()


def runs_in_status(session: Session, status: str) -> Sequence[Run]:
    return session.scalars(select(Run).where(Run.status == status)).all()


def lock_owner(session: Session, owner_id: int) -> None:
    """On PostgreSQL, take a lock on ``owner_id`` until the transaction ends, so that the
    quota check and insert of a run creation go one at a time across replicas sharing the
    database (in one process a lock in memory does it; SQLite has one process)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(:space, :owner)"),
            {"space": _OWNER_LOCKS, "owner": owner_id},
        )


def count_open_runs(session: Session, owner_id: int, finished: str) -> int:
    """Runs of the owner whose status is not ``finished``."""
    query = (
        select(func.count())
        .select_from(Run)
        .where(Run.owner_id == owner_id, Run.status != finished)
    )
    return int(session.scalar(query) or 0)


def run_created_with_key(session: Session, owner_id: int, key: str) -> Run | None:
    """The owner's run whose creation carried ``Idempotency-Key: key``, if any."""
    known = session.get(IdempotencyKey, (owner_id, key))
    return session.get(Run, known.run_id) if known is not None else None


def add_run(session: Session, run: Run, idempotency_key: str | None) -> None:
    """Insert ``run``, and the key it was created with (the commit may then raise
    IntegrityError: the same key arrived twice at once)."""
    session.add(run)
    if idempotency_key is not None:
        session.flush()  # the run row first: the key refers to it
        session.add(IdempotencyKey(owner_id=run.owner_id, key=idempotency_key, run_id=run.id))


def add_run_privacy(session: Session, run_id: str, policy: dict[str, Any], secret: bytes) -> None:
    """Store the privacy policy and secret of a run added in this session (the unit of
    work inserts the run row first: the policy refers to it)."""
    session.add(RunPrivacy(run_id=run_id, policy=policy, secret=secret))


def run_privacy(session: Session, run_id: str) -> RunPrivacy | None:
    """The run's privacy row; None for a run created before policies existed."""
    return session.get(RunPrivacy, run_id)


# --------------------------------------------------------------------------------- logs


_INSERT_STEP = insert(StepLog.__table__)  # type: ignore[arg-type]  # a Table, as mypy can't see


def log_step(db: Database, **row: Any) -> None:
    """Add one step-log row (columns of ``StepLog``) in ``db``'s transaction.

    A Core insert: the ORM's unit of work (an object, a flush, its bookkeeping) cost 2.4x
    the insert itself, every step (docs/PERFORMANCE.md, "The floor"); column defaults
    (``created_at``) apply as before."""
    connection_of(db).execute(_INSERT_STEP, row)


def step_log(session: Session, run_id: str, start: int, limit: int) -> Sequence[StepLog]:
    """Up to ``limit`` step-log rows of the run from step ``start`` on, in step order."""
    query = (
        select(StepLog)
        .where(StepLog.run_id == run_id, StepLog.step >= start)
        .order_by(StepLog.step)
        .limit(limit)
    )
    return session.scalars(query).all()


def log_evaluation(session: Session, **row: Any) -> EvalResult:
    """Add one evaluation result (columns of ``EvalResult``); the row, for its id once flushed."""
    evaluation = EvalResult(**row)
    session.add(evaluation)
    return evaluation


def eval_results(session: Session, run_id: str) -> Sequence[EvalResult]:
    """The run's evaluation results, oldest first."""
    query = select(EvalResult).where(EvalResult.run_id == run_id).order_by(EvalResult.id)
    return session.scalars(query).all()


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
