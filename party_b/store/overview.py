"""The operator's queries: every run of every token at once, and aggregates of their logs.

The rest of the store answers one caller about its own runs; these answer party B's operator
(the dashboard, ``party_b.dashboard``, and the per-run Prometheus metrics,
``party_b.run_metrics``) about all of them. Read-only; each is one query (or one per table),
so a refresh costs the same whatever the number of runs shown.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from party_b.store.tables import ApiToken, Checkpoint, EvalResult, Run, StepLog

__all__ = [
    "Bucket",
    "StepTotals",
    "as_utc",
    "last_logged",
    "last_steps",
    "latest_evaluations",
    "newest_checkpoints",
    "recent_steps",
    "runs_by_status",
    "runs_with_owners",
    "step_buckets",
    "step_totals",
    "steps_since",
]


def as_utc(moment: datetime) -> datetime:
    """A stored time as an aware UTC datetime (SQLite hands back naive ones; every time
    party B stores is UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def runs_with_owners(
    session: Session,
    *,
    limit: int,
    finished: tuple[str, datetime] | None = None,
    run_id: str | None = None,
) -> list[tuple[Run, str]]:
    """Up to ``limit`` runs with their owner token's name, newest first. With ``finished =
    (status, since)``: runs in that status only if they changed since, every other run; with
    ``run_id``: that run only."""
    query = select(Run, ApiToken.name).join(ApiToken, Run.owner_id == ApiToken.id)
    if run_id is not None:
        query = query.where(Run.id == run_id)
    if finished is not None:
        status, since = finished
        query = query.where(or_(Run.status != status, Run.updated_at >= since))
    query = query.order_by(Run.created_at.desc()).limit(limit)
    return [(run, str(owner)) for run, owner in session.execute(query).all()]


def runs_by_status(session: Session) -> dict[str, int]:
    """How many runs are in each status."""
    query = select(Run.status, func.count()).group_by(Run.status)
    return {str(status): int(n) for status, n in session.execute(query).all()}


@dataclass(frozen=True)
class StepTotals:
    """A run's step log summed: rows, last step, bytes each way (int), last write (UTC)."""

    steps: int
    last_step: int
    bytes_in: int
    bytes_out: int
    last_at: datetime


def step_totals(session: Session, run_ids: Sequence[str]) -> dict[str, StepTotals]:
    """Per run with at least one logged step: its totals (one grouped query)."""
    if not run_ids:
        return {}
    query = (
        select(
            StepLog.run_id,
            func.count(),
            func.max(StepLog.step),
            func.sum(StepLog.bytes_in),
            func.sum(StepLog.bytes_out),
            func.max(StepLog.created_at),
        )
        .where(StepLog.run_id.in_(run_ids))
        .group_by(StepLog.run_id)
    )
    return {
        run_id: StepTotals(int(n), int(last), int(up or 0), int(down or 0), as_utc(at))
        for run_id, n, last, up, down, at in session.execute(query).all()
    }


def last_steps(session: Session, run_ids: Sequence[str]) -> dict[str, StepLog]:
    """Per run with at least one logged step: the row of its last step (by primary key)."""
    keys = [(run_id, step) for run_id, (step, _at) in last_logged(session, run_ids).items()]
    if not keys:
        return {}
    # one primary-key match per run (SQLite plans a row-value IN as a scan)
    query = select(StepLog).where(
        or_(*(and_(StepLog.run_id == run_id, StepLog.step == step) for run_id, step in keys))
    )
    return {row.run_id: row for row in session.scalars(query).all()}


def last_logged(session: Session, run_ids: Sequence[str]) -> dict[str, tuple[int, datetime]]:
    """Per run with at least one logged step: (its last step, when it was logged, UTC).

    One index lookup per run (correlated subqueries on the step log's primary key), so it
    costs the same however long the runs are; ``step_totals`` reads every row."""
    if not run_ids:
        return {}
    newest = (
        select(StepLog.step, StepLog.created_at)
        .where(StepLog.run_id == Run.id)
        .order_by(StepLog.step.desc())
        .limit(1)
    )
    query = select(
        Run.id,
        newest.with_only_columns(StepLog.step).scalar_subquery(),
        newest.with_only_columns(StepLog.created_at).scalar_subquery(),
    ).where(Run.id.in_(run_ids))
    return {
        run_id: (int(step), as_utc(at))
        for run_id, step, at in session.execute(query).all()
        if step is not None
    }


def newest_checkpoints(session: Session, run_ids: Sequence[str]) -> dict[str, int]:
    """Per run with a checkpoint: the step of its newest one."""
    if not run_ids:
        return {}
    query = (
        select(Checkpoint.run_id, func.max(Checkpoint.step))
        .where(Checkpoint.run_id.in_(run_ids))
        .group_by(Checkpoint.run_id)
    )
    return {run_id: int(step) for run_id, step in session.execute(query).all()}


def recent_steps(session: Session, run_id: str, count: int) -> Sequence[StepLog]:
    """The run's newest ``count`` step-log rows, newest first."""
    query = (
        select(StepLog).where(StepLog.run_id == run_id).order_by(StepLog.step.desc()).limit(count)
    )
    return session.scalars(query).all()


def steps_since(session: Session, moment: datetime) -> int:
    """Steps logged by every run since ``moment`` (UTC)."""
    query = select(func.count()).select_from(StepLog).where(StepLog.created_at >= moment)
    return int(session.scalar(query) or 0)


@dataclass(frozen=True)
class Bucket:
    """Consecutive logged steps ``first``..``last`` (``steps`` of them) of one run, summed or
    averaged: mean loss and batch accuracy (None where no step has one), bytes received and
    sent in all, mean time per step at party B (ms)."""

    first: int
    last: int
    steps: int
    loss: float | None
    accuracy: float | None
    bytes_in: int
    bytes_out: int
    step_ms: float


def step_buckets(session: Session, run_id: str, width: int) -> list[Bucket]:
    """The run's step log in buckets of ``width`` steps (1..width, width+1..2 width, ...), in
    step order: a curve of any length in a bounded number of points, computed by the
    database."""
    bucket = ((StepLog.step - 1) // width).label("bucket")
    query = (
        select(
            func.min(StepLog.step),
            func.max(StepLog.step),
            func.count(),
            func.avg(StepLog.loss),
            func.avg(StepLog.accuracy),
            func.sum(StepLog.bytes_in),
            func.sum(StepLog.bytes_out),
            func.avg(StepLog.total_ms),
        )
        .where(StepLog.run_id == run_id)
        .group_by(bucket)
        .order_by(bucket)
    )
    return [
        Bucket(
            first=int(first),
            last=int(last),
            steps=int(n),
            loss=None if loss is None else float(loss),
            accuracy=None if accuracy is None else float(accuracy),
            bytes_in=int(up or 0),
            bytes_out=int(down or 0),
            step_ms=float(ms or 0.0),
        )
        for first, last, n, loss, accuracy, up, down, ms in session.execute(query).all()
    ]


def latest_evaluations(session: Session, run_ids: Sequence[str]) -> dict[str, list[EvalResult]]:
    """Per run: its newest evaluation of each split."""
    if not run_ids:
        return {}
    newest = (
        select(func.max(EvalResult.id))
        .where(EvalResult.run_id.in_(run_ids))
        .group_by(EvalResult.run_id, EvalResult.split)
    )
    found: dict[str, list[EvalResult]] = {}
    for row in session.scalars(select(EvalResult).where(EvalResult.id.in_(newest))).all():
        found.setdefault(row.run_id, []).append(row)
    return found
