"""The tables and queries of runs with several feature parties (docs/PROTOCOL.md section 12).

    party_tokens    a bearer token bound to one run and one of its feature parties, stored
                    as its SHA-256 (as every token); revoked, not deleted; gone with its run
    party_grants    a party token's expiry and the client certificate it is bound to
    party_traffic   bytes in and out of every party at every applied step (the dashboard);
                    rows past a restored checkpoint are dropped with the step log's

Tables of their own, so that an older database gains them with ``create_all`` at start-up.
"""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ForeignKey, Integer, String, bindparam, delete, func, insert, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from party_b.store.engine import Database, connection_of
from party_b.store.tables import Base, Run, UtcDateTime

__all__ = [
    "PartyGrant",
    "PartyToken",
    "PartyTraffic",
    "active_party_token",
    "add_party_token",
    "party_credential",
    "forget_party_traffic_after",
    "log_party_traffic",
    "party_tokens",
    "party_traffic",
    "revoke_party_tokens",
]


def _now() -> datetime:
    return datetime.now(UTC)


class PartyToken(Base):
    """A token that acts for one feature party of one run, and for nothing else."""

    __tablename__ = "party_tokens"

    token_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    party: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), default=None)


class PartyGrant(Base):
    """When a party token expires, and the client certificate (RFC 4514 subject) it must come
    with (mutual TLS); a token without a row has neither (``party_b.access``)."""

    __tablename__ = "party_grants"

    token_sha256: Mapped[str] = mapped_column(
        ForeignKey("party_tokens.token_sha256", ondelete="CASCADE"), primary_key=True
    )
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), default=None)
    subject: Mapped[str | None] = mapped_column(String(1000), default=None)


class PartyTraffic(Base):
    """One party's bytes of one applied step: its request in, its answer out."""

    __tablename__ = "party_traffic"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    party: Mapped[str] = mapped_column(String(32), primary_key=True)
    bytes_in: Mapped[int] = mapped_column(Integer)
    bytes_out: Mapped[int] = mapped_column(Integer)


def add_party_token(
    session: Session,
    run_id: str,
    party: str,
    token_sha256: str,
    *,
    expires_at: datetime | None = None,
    subject: str | None = None,
) -> None:
    session.add(PartyToken(token_sha256=token_sha256, run_id=run_id, party=party))
    if expires_at is not None or subject is not None:
        session.flush()  # the token's row first: the grant refers to it
        session.add(PartyGrant(token_sha256=token_sha256, expires_at=expires_at, subject=subject))


def party_credential(db: Database, digest: str) -> Any:
    """The party token whose SHA-256 is ``digest`` (hex), revoked or not, of a run that
    exists: ``token_sha256, run_id, party, revoked_at``, the run's ``owner_id`` and the
    grant's ``expires_at, subject``. One Core statement (every request looks its caller up)."""
    return connection_of(db).execute(_PARTY_CREDENTIAL, {"digest": digest}).first()


def active_party_token(session: Session, run_id: str, party: str) -> PartyToken | None:
    row: PartyToken | None = session.scalar(
        select(PartyToken).where(
            PartyToken.run_id == run_id,
            PartyToken.party == party,
            PartyToken.revoked_at.is_(None),
        )
    )
    return row


def revoke_party_tokens(session: Session, run_id: str, party: str) -> int:
    """Revoke the party's active tokens of the run; how many there were."""
    rows = session.scalars(
        select(PartyToken).where(
            PartyToken.run_id == run_id,
            PartyToken.party == party,
            PartyToken.revoked_at.is_(None),
        )
    ).all()
    for row in rows:
        row.revoked_at = _now()
    return len(rows)


def party_tokens(session: Session, run_id: str | None = None) -> Sequence[PartyToken]:
    """Every party token (of one run), oldest first."""
    query = select(PartyToken).order_by(PartyToken.created_at, PartyToken.party)
    if run_id is not None:
        query = query.where(PartyToken.run_id == run_id)
    return session.scalars(query).all()


def log_party_traffic(
    db: Database, run_id: str, step: int, rows: Sequence[tuple[str, int, int]]
) -> None:
    """(party, bytes in, bytes out) of every party at ``step``, in the step's transaction."""
    connection_of(db).execute(
        insert(PartyTraffic.__table__),  # type: ignore[arg-type]  # a Table, as mypy can't see
        [
            {"run_id": run_id, "step": step, "party": p, "bytes_in": i, "bytes_out": o}
            for p, i, o in rows
        ],
    )


def party_traffic(session: Session, run_id: str) -> dict[str, tuple[int, int, int]]:
    """party -> (steps, bytes in, bytes out) over the run's applied steps."""
    rows = session.execute(
        select(
            PartyTraffic.party,
            func.count(),
            func.coalesce(func.sum(PartyTraffic.bytes_in), 0),
            func.coalesce(func.sum(PartyTraffic.bytes_out), 0),
        )
        .where(PartyTraffic.run_id == run_id)
        .group_by(PartyTraffic.party)
    ).all()
    return {party: (int(n), int(i), int(o)) for party, n, i, o in rows}


def forget_party_traffic_after(session: Session, run_id: str, step: int) -> None:
    session.execute(
        delete(PartyTraffic).where(PartyTraffic.run_id == run_id, PartyTraffic.step > step)
    )


# built once, after the tables: a party token of a hash, its run's owner and its grant
_PARTY_CREDENTIAL = (
    select(
        PartyToken.token_sha256,
        PartyToken.run_id,
        PartyToken.party,
        PartyToken.revoked_at,
        Run.owner_id,
        PartyGrant.expires_at,
        PartyGrant.subject,
    )
    .join(Run, Run.id == PartyToken.run_id)  # (a deleted run takes its tokens with it)
    .outerjoin(PartyGrant, PartyGrant.token_sha256 == PartyToken.token_sha256)
    .where(PartyToken.token_sha256 == bindparam("digest"))
)
