"""Label draws: the secret of each label table's randomized labels, and which runs use it.

``party_b.privacy.draws`` holds the rules (what a draw is, how a run's labels come from it);
these are the queries. ``current_draw`` commits the draw it creates (like ``psi_key``), so
that two run creations racing on a new table end with one draw, the same for both.
"""

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from party_b.store.tables import LabelDraw, RunLabelDraw

__all__ = [
    "current_draw",
    "draw_of_run",
    "draws",
    "draws_of_runs",
    "link_run_to_draw",
    "retire_draws",
    "runs_per_draw",
]


def current_draw(
    session: Session,
    *,
    table_sha256: str,
    mechanism: str,
    epsilon: float,
    new_secret: Callable[[], bytes],
) -> LabelDraw:
    """The draw runs on this table under this mechanism use now: the newest one not retired,
    created (and committed) when there is none, as the next generation."""
    row = _newest(session, table_sha256, mechanism)
    if row is not None and row.retired_at is None:
        return row
    generation = 0 if row is None else row.generation + 1
    created = LabelDraw(
        table_sha256=table_sha256,
        mechanism=mechanism,
        generation=generation,
        epsilon=epsilon,
        secret=new_secret(),
    )
    session.add(created)
    try:
        session.commit()
    except IntegrityError:  # another process of party B made it first: use that one
        session.rollback()
        made = _newest(session, table_sha256, mechanism)
        assert made is not None and made.generation == generation
        return made
    return created


def _newest(session: Session, table_sha256: str, mechanism: str) -> LabelDraw | None:
    query = (
        select(LabelDraw)
        .where(LabelDraw.table_sha256 == table_sha256, LabelDraw.mechanism == mechanism)
        .order_by(LabelDraw.generation.desc())
        .limit(1)
    )
    return session.scalars(query).first()


def retire_draws(session: Session) -> int:
    """Retire every draw in use (``fedlite-b privacy redraw``): the next run on each table
    draws anew. How many were retired; the caller commits."""
    result = session.execute(
        update(LabelDraw).where(LabelDraw.retired_at.is_(None)).values(retired_at=datetime.now(UTC))
    )
    return int(getattr(result, "rowcount", 0) or 0)


def link_run_to_draw(session: Session, run_id: str, draw_id: int) -> None:
    session.add(RunLabelDraw(run_id=run_id, draw_id=draw_id))


def draw_of_run(session: Session, run_id: str) -> LabelDraw | None:
    """The draw the run's labels come from; None for a run that draws its own (created
    before draws existed) or has no label DP."""
    link = session.get(RunLabelDraw, run_id)
    return session.get(LabelDraw, link.draw_id) if link is not None else None


def draws_of_runs(session: Session, run_ids: Sequence[str]) -> dict[str, LabelDraw]:
    """run id -> its draw, for those of ``run_ids`` that have one."""
    if not run_ids:
        return {}
    query = (
        select(RunLabelDraw.run_id, LabelDraw)
        .join(LabelDraw, LabelDraw.id == RunLabelDraw.draw_id)
        .where(RunLabelDraw.run_id.in_(list(run_ids)))
    )
    return {str(run_id): draw for run_id, draw in session.execute(query).all()}


def draws(session: Session) -> Sequence[LabelDraw]:
    """Every draw, oldest first."""
    return session.scalars(select(LabelDraw).order_by(LabelDraw.id)).all()


def runs_per_draw(session: Session) -> dict[int, int]:
    """draw id -> how many runs have used it (deleted runs included)."""
    query = select(RunLabelDraw.draw_id, func.count()).group_by(RunLabelDraw.draw_id)
    return {int(draw_id): int(count) for draw_id, count in session.execute(query).all()}
