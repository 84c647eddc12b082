"""Tokens of the feature parties of a run (docs/PROTOCOL.md section 12.2).

A party token is a random 256-bit string like every API token, stored only as its SHA-256,
but it lives in a table of its own (``party_tokens``) bound to one run and one of its
feature parties: it is accepted on that party's routes (``/v1/runs/{run}/parties/{party}/``)
and ``GET /v1/party``, and is an unknown token everywhere else. Party B's operator issues
and revokes them (``fedlite-b parties``); they go with their run.
"""

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from party_b.store import parties as party_store
from party_b.store.engine import Database
from party_b.token_text import new_token

__all__ = [
    "PartyCredential",
    "PartyScope",
    "authenticate_party",
    "issue_party_token",
    "revoke_party",
]


@dataclass(frozen=True)
class PartyScope:
    """What a party token may act for."""

    run_id: str
    party: str


@dataclass(frozen=True)
class PartyCredential:
    """An active party token: what it acts for, as whom, and its grant."""

    scope: PartyScope
    owner_id: int  # the run's owner, as whom party B's rooms know the run
    expires_at: datetime | None
    subject: str | None  # the client certificate it must come with (mutual TLS)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def issue_party_token(
    session: Session,
    run_id: str,
    party: str,
    *,
    expires_at: datetime | None = None,
    subject: str | None = None,
) -> str:
    """A new token for ``party`` of ``run_id`` (the party's earlier tokens are revoked: one
    active token per party), expiring at ``expires_at`` and bound to the client certificate
    ``subject`` when given; returns it, the only time it is visible. Commits."""
    party_store.revoke_party_tokens(session, run_id, party)
    token = new_token()
    party_store.add_party_token(
        session, run_id, party, _hash(token), expires_at=expires_at, subject=subject
    )
    session.commit()
    return token


def revoke_party(session: Session, run_id: str, party: str) -> bool:
    """Revoke the party's token of the run (at once: every request looks it up). Commits."""
    revoked = party_store.revoke_party_tokens(session, run_id, party) > 0
    session.commit()
    return revoked


def authenticate_party(db: Database, token: str) -> PartyCredential | None:
    """The credential of an active party token, or None (not one, or revoked, or of a
    deleted run). Its expiry and certificate are checked where every token's are
    (``party_b.access.identify``)."""
    digest = _hash(token)
    row = party_store.party_credential(db, digest)
    if row is None or not hmac.compare_digest(row.token_sha256, digest):
        return None
    if row.revoked_at is not None:
        return None
    return PartyCredential(
        PartyScope(row.run_id, row.party), row.owner_id, row.expires_at, row.subject
    )
