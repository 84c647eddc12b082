"""Operator-issued bearer tokens, stored only as SHA-256 hashes.

Tokens are random 256-bit strings, so a plain SHA-256 (no salt, no slow hash) is the right
tool: there is nothing to brute-force. Revocation writes ``revoked_at``; every request looks
its token up again, so a revoked token stops working at once, without a restart.
"""

import hashlib
import hmac
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from party_b.store.tables import ApiToken, RevokedToken
from party_b.store.tokens import revoked_hash, token_by_hash, token_named
from party_b.token_text import new_token

__all__ = ["authenticate", "hash_token", "issue_token", "register_token", "revoke_token"]

MIN_TOKEN_LENGTH = 16


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def issue_token(session: Session, name: str) -> str:
    """Create a new random token under ``name``; returns it (the only time it is visible)."""
    token = new_token()
    register_token(session, name, token)
    return token


def register_token(session: Session, name: str, token: str) -> bool:
    """Store ``token`` under ``name``, replacing that name's token; returns whether it is active.

    A revoked token stays revoked for good: registering it again (as every start-up does with
    FEDLITE_B_TOKENS), even after its name got a new token, changes nothing and returns False.
    Any other new token for the name is a new credential and is active.
    """
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"token for {name!r} is shorter than {MIN_TOKEN_LENGTH} characters")
    digest = hash_token(token)
    if revoked_hash(session, digest) is not None:
        return False
    clash = token_by_hash(session, digest)
    if clash is not None and clash.name != name:
        raise ValueError(f"that token is already registered under another name ({clash.name!r})")
    row = token_named(session, name)
    if row is None:
        session.add(ApiToken(name=name, token_sha256=digest))
    elif row.token_sha256 == digest and row.revoked_at is not None:
        _remember_revoked(session, row)  # revoked before the revoked_tokens table existed
        session.commit()
        return False
    elif row.token_sha256 != digest:
        if row.revoked_at is not None:
            _remember_revoked(session, row)
        row.token_sha256 = digest
        row.revoked_at = None
    session.commit()
    return True


def revoke_token(session: Session, name: str) -> bool:
    row = token_named(session, name)
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = datetime.now(UTC)
    _remember_revoked(session, row)
    session.commit()
    return True


def _remember_revoked(session: Session, row: ApiToken) -> None:
    if revoked_hash(session, row.token_sha256) is None:
        session.add(RevokedToken(token_sha256=row.token_sha256, name=row.name))


def authenticate(session: Session, token: str) -> ApiToken | None:
    """The active token row for ``token``, or None."""
    digest = hash_token(token)
    row = token_by_hash(session, digest)
    # The lookup is by hash of a high-entropy secret; compare_digest keeps the final check
    # constant-time anyway.
    if row is None or not hmac.compare_digest(row.token_sha256, digest):
        return None
    return row if row.revoked_at is None else None
