"""How far a run had gone before a load rolled it back (table ``run_lost_steps``).

A replica that loads a run at its newest checkpoint drops the steps logged past it: they died
with the process that applied them, or live on only in the copy of the replica that held the
run before. The parties are past that checkpoint, so the run is *behind*: a step ahead is not
held for a predecessor that never comes (``RunState.behind``). Once dropped, those steps are
gone from the step log; the highest of them is kept here, so that a second takeover before
the run applies a step again (a replica that comes back gets its runs back at once) still
knows that the parties are ahead. A load at a checkpoint at or past the mark forgets it.

A table of its own, so that an older database gains it with ``create_all`` at start-up.
"""

from sqlalchemy import ForeignKey, Integer, delete, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from party_b.store.tables import Base, StepLog

__all__ = ["LostSteps", "behind_mark", "last_logged_step"]


class LostSteps(Base):
    """The highest step of a run a load has dropped, while no checkpoint has reached it."""

    __tablename__ = "run_lost_steps"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer)


def last_logged_step(session: Session, run_id: str) -> int | None:
    """The run's highest logged step (None: none logged)."""
    return session.scalar(select(func.max(StepLog.step)).where(StepLog.run_id == run_id))


def behind_mark(session: Session, run_id: str, *, loaded_at: int, dropped_to: int | None) -> int:
    """After a load at checkpoint ``loaded_at`` that dropped logged steps up to
    ``dropped_to`` (None: none): the highest step the parties may have reached, kept for the
    next load while it is past ``loaded_at``; ``loaded_at`` when the run is not behind."""
    row = session.get(LostSteps, run_id, with_for_update=True)
    mark = max(loaded_at, dropped_to or 0, row.step if row is not None else 0)
    if mark <= loaded_at:
        if row is not None:
            session.execute(delete(LostSteps).where(LostSteps.run_id == run_id))
        return loaded_at
    if row is None:
        session.add(LostSteps(run_id=run_id, step=mark))
    else:
        row.step = mark
    return mark
