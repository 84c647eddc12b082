"""API tokens with their grants, from a file party B reads at start-up
(``FEDLITE_B_TOKENS_FILE``, ``fedlite-b serve --tokens-file``): scoped, expiring and
certificate-bound tokens for deployments whose secrets come from a secret store (a Kubernetes
Secret, a compose secret) rather than from ``fedlite-b token issue`` run against the
database. One TOML table per token::

    [[token]]
    name = "bank-a"
    token = "..."                      # at least 16 characters; keep the file mode 600
    scope = "train"                    # train, predict, read or all (default), comma-separated
    expires = 2027-01-31               # a date or date-time (UTC); never a duration
    subject = "CN=bank-a,O=Bank A"     # the client certificate it must come with
    certificate_only = false           # true: the certificate alone identifies the caller
    runs_of = "bank-a"                 # a scoring token acting on another token's runs

The file is the source of truth for the tokens it names: every start-up registers each token
(hashed) and sets its grant to what the file says, so an edit takes effect at the next start;
a token revoked with ``fedlite-b token revoke`` stays revoked. An expiry is an absolute
moment: a duration would start again at every restart.
"""

import tomllib
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from party_b import auth, store
from party_b.access import ALL_SCOPES, parse_scopes
from party_b.store.grants import set_grant
from party_b.subjects import operator_subject

__all__ = ["FileToken", "read_token_file", "register_file_tokens"]

_KEYS = {"name", "token", "scope", "expires", "subject", "certificate_only", "runs_of"}


@dataclass(frozen=True)
class FileToken:
    """One ``[[token]]`` of the file, checked."""

    name: str
    token: str
    scopes: frozenset[str]
    expires_at: datetime | None
    subject: str | None
    certificate_only: bool
    runs_of: str | None


def read_token_file(path: Path) -> list[FileToken]:
    """The file's tokens; ValueError naming the file, the entry and what to fix."""
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"tokens file {path}: {exc}") from None
    entries = document.get("token")
    if set(document) - {"token"} or not isinstance(entries, list) or not entries:
        raise ValueError(f"tokens file {path}: expected [[token]] tables only, at least one")
    tokens = [_entry(path, i, entry) for i, entry in enumerate(entries, start=1)]
    names = [t.name for t in tokens]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"tokens file {path}: the name {twice[0]!r} is given twice")
    return tokens


def _entry(path: Path, index: int, entry: Any) -> FileToken:
    where = f"tokens file {path}, token {index}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a [[token]] table")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(_KEYS))})")
    name, token = entry.get("name"), entry.get("token")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: 'name' is required, a string")
    where = f"tokens file {path}, token {name!r}"
    if not isinstance(token, str) or len(token) < auth.MIN_TOKEN_LENGTH:
        raise ValueError(
            f"{where}: 'token' must be a string of at least {auth.MIN_TOKEN_LENGTH} characters"
        )
    try:
        scopes = parse_scopes(str(entry.get("scope", "all")))
        subject = operator_subject(entry["subject"]) if entry.get("subject") else None
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    certificate_only = entry.get("certificate_only", False)
    if not isinstance(certificate_only, bool) or (certificate_only and subject is None):
        raise ValueError(f"{where}: certificate_only is true or false, and needs a subject")
    runs_of = entry.get("runs_of")
    if runs_of is not None and not isinstance(runs_of, str):
        raise ValueError(f"{where}: runs_of names a token")
    return FileToken(
        name,
        token,
        scopes,
        _expiry(where, entry.get("expires")),
        subject,
        certificate_only,
        runs_of,
    )


def _expiry(where: str, value: object) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, str):
        try:
            return _expiry(where, datetime.fromisoformat(value.strip().replace("Z", "+00:00")))
        except ValueError:
            pass
    raise ValueError(
        f"{where}: 'expires' is a date or date-time in UTC (2027-01-31, 2027-01-31T12:00:00Z); "
        "a duration would start again at every restart"
    )


def register_file_tokens(session: Session, tokens: list[FileToken]) -> list[str]:
    """Register each token and set its grant to the file's; returns the names of tokens that
    stay revoked (``fedlite-b token revoke``). Commits."""
    revoked = []
    for entry in tokens:
        if not auth.register_token(session, entry.name, entry.token):
            revoked.append(entry.name)
    for entry in tokens:
        if entry.name in revoked:
            continue
        row = store.token_named(session, entry.name)
        assert row is not None
        owner = store.token_named(session, entry.runs_of) if entry.runs_of else None
        if entry.runs_of and owner is None:
            raise ValueError(
                f"tokens file: token {entry.name!r}: runs_of {entry.runs_of!r} names no token"
            )
        set_grant(
            session,
            row.id,
            scopes=",".join(sorted(entry.scopes or ALL_SCOPES)),
            expires_at=entry.expires_at,
            subject=entry.subject,
            certificate_only=entry.certificate_only,
            runs_of=owner.id if owner is not None else None,
        )
    session.commit()
    return revoked
