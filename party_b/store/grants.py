"""The queries of token grants (``party_b.access``): scopes, expiry, certificate subjects."""

from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from party_b.store.engine import Database, connection_of
from party_b.store.tables import ApiToken, TokenGrant

__all__ = [
    "certificate_credential",
    "grant_of",
    "grant_with_subject",
    "set_grant",
    "token_credential",
]


# One statement, built once: the token of a hash with its grant (None columns: no grant row)
_TOKEN_CREDENTIAL = (
    select(
        ApiToken.id,
        ApiToken.name,
        ApiToken.token_sha256,
        ApiToken.revoked_at,
        TokenGrant.scopes,
        TokenGrant.expires_at,
        TokenGrant.subject,
        TokenGrant.runs_of,
    )
    .outerjoin(TokenGrant, TokenGrant.token_id == ApiToken.id)
    .where(ApiToken.token_sha256 == bindparam("digest"))
)


# ... and the active token a client certificate's subject is bound to, with its grant
_CERTIFICATE_CREDENTIAL = (
    select(
        ApiToken.id,
        ApiToken.name,
        TokenGrant.scopes,
        TokenGrant.expires_at,
        TokenGrant.subject,
        TokenGrant.runs_of,
        TokenGrant.certificate_only,
    )
    .join(ApiToken, ApiToken.id == TokenGrant.token_id)
    .where(TokenGrant.subject == bindparam("subject"), ApiToken.revoked_at.is_(None))
)


def token_credential(db: Database, digest: str) -> Any:
    """The API token whose SHA-256 is ``digest`` (hex), revoked or not, joined with its
    grant: ``id, name, token_sha256, revoked_at`` and the grant's ``scopes, expires_at,
    subject, runs_of`` (``scopes`` None: no grant). Every request looks its caller up, so
    this is one Core statement: the ORM's two lookups took 0.28 ms a request against 0.05
    (docs/PERFORMANCE.md, "Steps at the limit")."""
    return connection_of(db).execute(_TOKEN_CREDENTIAL, {"digest": digest}).first()


def certificate_credential(db: Database, subject: str) -> Any:
    """The active (unrevoked) API token bound to the client certificate ``subject``, with
    its grant: ``id, name`` and ``scopes, expires_at, subject, runs_of, certificate_only``;
    None for none. One Core statement, like ``token_credential``."""
    return connection_of(db).execute(_CERTIFICATE_CREDENTIAL, {"subject": subject}).first()


def grant_of(session: Session, token_id: int) -> TokenGrant | None:
    """The token's grant; None: every scope, no expiry, no certificate."""
    return session.get(TokenGrant, token_id)


def grant_with_subject(session: Session, subject: str) -> TokenGrant | None:
    """The grant of the active token bound to the certificate ``subject``, if any."""
    row: TokenGrant | None = session.scalar(
        select(TokenGrant)
        .join(ApiToken, ApiToken.id == TokenGrant.token_id)
        .where(TokenGrant.subject == subject, ApiToken.revoked_at.is_(None))
    )
    return row


def set_grant(
    session: Session,
    token_id: int,
    *,
    scopes: str,
    expires_at: datetime | None,
    subject: str | None,
    certificate_only: bool,
    runs_of: int | None,
) -> TokenGrant:
    """Replace the token's grant (not committed)."""
    grant = session.get(TokenGrant, token_id)
    if grant is None:
        grant = TokenGrant(token_id=token_id, scopes=scopes)
        session.add(grant)
    grant.scopes = scopes
    grant.expires_at = expires_at
    grant.subject = subject
    grant.certificate_only = certificate_only
    grant.runs_of = runs_of
    return grant
