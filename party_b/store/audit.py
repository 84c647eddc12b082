"""The queries of party B's audit trail (``party_b.audit``): add an entry, read them back."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from party_b.store.tables import AuditEntry

__all__ = ["AuditFilter", "AuditTotal", "add_audit_entry", "audit_entries", "audit_totals"]


@dataclass(frozen=True)
class AuditFilter:
    """Which entries to read; None: any."""

    run_id: str | None = None
    actor: str | None = None
    action: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def add_audit_entry(session: Session, entry: AuditEntry) -> None:
    """Store ``entry`` and commit (its own transaction: the trail never waits on a request's)."""
    session.add(entry)
    session.commit()


def _conditions(filters: AuditFilter) -> list[ColumnElement[bool]]:
    conditions = []
    if filters.run_id is not None:
        conditions.append(AuditEntry.run_id == filters.run_id)
    if filters.actor is not None:
        conditions.append(AuditEntry.actor == filters.actor)
    if filters.action is not None:
        conditions.append(AuditEntry.action == filters.action)
    if filters.since is not None:
        conditions.append(AuditEntry.at >= filters.since)
    if filters.until is not None:
        conditions.append(AuditEntry.at < filters.until)
    return conditions


def audit_entries(
    session: Session, filters: AuditFilter, *, limit: int | None = None
) -> Sequence[AuditEntry]:
    """Matching entries, oldest first (the newest ``limit`` of them, with a limit)."""
    query = select(AuditEntry).where(*_conditions(filters)).order_by(AuditEntry.id.desc())
    if limit is not None:
        query = query.limit(limit)
    return list(reversed(session.scalars(query).all()))


@dataclass(frozen=True)
class AuditTotal:
    actor: str
    subject: str | None
    action: str
    calls: int
    ids: int
    first: datetime
    last: datetime


def audit_totals(session: Session, filters: AuditFilter) -> list[AuditTotal]:
    """Per caller and action: how many calls, how many ids, first and last (who scored how
    many of our customers, when)."""
    query = (
        select(
            AuditEntry.actor,
            AuditEntry.subject,
            AuditEntry.action,
            func.count(),
            func.coalesce(func.sum(AuditEntry.ids), 0),
            func.min(AuditEntry.at),
            func.max(AuditEntry.at),
        )
        .where(AuditEntry.outcome == "ok", *_conditions(filters))
        .group_by(AuditEntry.actor, AuditEntry.subject, AuditEntry.action)
        .order_by(AuditEntry.actor, AuditEntry.action)
    )
    return [
        AuditTotal(r[0], r[1], r[2], int(r[3]), int(r[4] or 0), r[5], r[6])
        for r in session.execute(query).all()
    ]
