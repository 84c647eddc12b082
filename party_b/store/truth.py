"""The operator's evaluations: every evaluation scored against the true labels.

``party_b.privacy.truth`` computes them (in the evaluation's transaction, next to the row
party A's reply is logged as); ``fedlite-b runs show``, ``fedlite-b evaluate`` and the
dashboard read them. Nothing here is served to party A.
"""

from collections.abc import Sequence

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from party_b.store.tables import EvalResult, OperatorEvaluation

__all__ = ["log_operator_evaluation", "newest_scored", "operator_evaluations"]


def log_operator_evaluation(session: Session, evaluation: EvalResult, **row: object) -> None:
    """Add the operator's view of ``evaluation`` (added in this session: flushed here for its
    id); its scores replace those kept for the run's previous evaluation of the split."""
    session.flush()
    session.execute(
        update(OperatorEvaluation)
        .where(
            OperatorEvaluation.run_id == evaluation.run_id,
            OperatorEvaluation.split == evaluation.split,
            OperatorEvaluation.scores.is_not(None),
        )
        .values(keys=None, scores=None)
    )
    session.add(
        OperatorEvaluation(
            eval_id=evaluation.id,
            run_id=evaluation.run_id,
            step=evaluation.step,
            split=evaluation.split,
            **row,
        )
    )


def operator_evaluations(session: Session, run_id: str) -> dict[int, OperatorEvaluation]:
    """eval_results id -> the operator's view of that evaluation, for the run's evaluations
    that have one (those made before the table existed have none)."""
    query = select(OperatorEvaluation).where(OperatorEvaluation.run_id == run_id)
    return {row.eval_id: row for row in session.scalars(query).all()}


def newest_scored(session: Session, run_id: str) -> Sequence[OperatorEvaluation]:
    """The run's evaluations whose scores are kept: the newest of each split."""
    query = (
        select(OperatorEvaluation)
        .where(OperatorEvaluation.run_id == run_id, OperatorEvaluation.scores.is_not(None))
        .order_by(OperatorEvaluation.id)
    )
    return session.scalars(query).all()
