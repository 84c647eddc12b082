"""The token queries: API tokens by name or hash, active or all, and the revoked hashes.

``party_b.auth`` holds the token logic (hashing, issuing, revoking for good) on top of these.
"""

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from party_b.store.tables import ApiToken, RevokedToken

__all__ = ["active_tokens", "all_tokens", "revoked_hash", "token_by_hash", "token_named"]


def token_named(session: Session, name: str) -> ApiToken | None:
    row: ApiToken | None = session.scalar(select(ApiToken).where(ApiToken.name == name))
    return row


def token_by_hash(session: Session, digest: str) -> ApiToken | None:
    """The token row whose SHA-256 is ``digest`` (hex), revoked or not."""
    row: ApiToken | None = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == digest))
    return row


def active_tokens(session: Session) -> Sequence[ApiToken]:
    return session.scalars(select(ApiToken).where(ApiToken.revoked_at.is_(None))).all()


def all_tokens(session: Session) -> Sequence[ApiToken]:
    return session.scalars(select(ApiToken).order_by(ApiToken.name)).all()


def revoked_hash(session: Session, digest: str) -> RevokedToken | None:
    """The record that ``digest`` was revoked, if it ever was (revoked hashes stay refused)."""
    return session.get(RevokedToken, digest)
