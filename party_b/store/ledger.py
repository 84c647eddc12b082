"""The privacy ledger's queries: what each run spent, what each token may spend.

``party_b.privacy.accounting`` holds the rules (what a run costs, when a creation is
refused) on top of these.
"""

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from party_b.store.tables import PrivacyBudget, PrivacyLedger, Run, RunPrivacy

__all__ = [
    "add_ledger_entry",
    "ledger_entry",
    "ledger_of",
    "privacy_budget",
    "runs_before_ledger",
    "set_privacy_budget",
]


def add_ledger_entry(
    session: Session, *, run_id: str, owner_id: int, epsilon: float | None, policy: str
) -> None:
    session.add(PrivacyLedger(run_id=run_id, owner_id=owner_id, epsilon=epsilon, policy=policy))


def ledger_entry(session: Session, run_id: str) -> PrivacyLedger | None:
    return session.get(PrivacyLedger, run_id)


def ledger_of(session: Session, owner_id: int) -> Sequence[PrivacyLedger]:
    """Every ledger row of the token, deleted runs' included, oldest first."""
    query = (
        select(PrivacyLedger)
        .where(PrivacyLedger.owner_id == owner_id)
        .order_by(PrivacyLedger.created_at)
    )
    return session.scalars(query).all()


def runs_before_ledger(
    session: Session, owner_id: int, *, exclude: str | None = None
) -> Sequence[tuple[str, dict[str, object] | None]]:
    """(run id, stored policy or None) of the token's runs that have no ledger row: runs
    created before the ledger existed (their spend is read off their stored policy), but
    not ``exclude`` (a run being created in this session, not yet charged)."""
    query = (
        select(Run.id, RunPrivacy.policy)
        .outerjoin(RunPrivacy, RunPrivacy.run_id == Run.id)
        .outerjoin(PrivacyLedger, PrivacyLedger.run_id == Run.id)
        .where(Run.owner_id == owner_id, PrivacyLedger.run_id.is_(None))
    )
    if exclude is not None:
        query = query.where(Run.id != exclude)
    return [(run_id, policy) for run_id, policy in session.execute(query).all()]


def privacy_budget(session: Session, owner_id: int) -> float | None:
    row = session.get(PrivacyBudget, owner_id)
    return row.epsilon if row is not None else None


def set_privacy_budget(session: Session, owner_id: int, epsilon: float | None) -> None:
    """Set (or with None, remove) the token's cap; the caller commits."""
    row = session.get(PrivacyBudget, owner_id)
    if epsilon is None:
        if row is not None:
            session.delete(row)
    elif row is None:
        session.add(PrivacyBudget(owner_id=owner_id, epsilon=epsilon))
    else:
        row.epsilon = epsilon
