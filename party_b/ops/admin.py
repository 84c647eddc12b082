"""The operator's maintenance commands of ``fedlite-b``: API tokens and the database.

Secrets are created private: ``token issue --out FILE`` writes a new 0600 file, backups are
0600, a new SQLite file is 0600. Commands that only read or change existing state (``token
list``, ``token revoke``, ``db backup``) never create an empty database where they expected
one: a wrong ``--data-dir`` is an error that names the path.
"""

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from party_b import auth, store
from party_b.ops.maintenance import MaintenanceError, create_private_database, sqlite_path
from party_b.settings import Settings, settings_from_flags
from party_b.store import make_engine, make_session_factory

__all__ = [
    "cmd_db_backup",
    "cmd_db_copy",
    "cmd_token_issue",
    "cmd_token_list",
    "cmd_token_revoke",
    "existing_database",
]


# ====================================================================== db


def existing_database(settings: Settings) -> str:
    """The database URL, refusing a SQLite file that does not exist (never create one)."""
    url = settings.resolved_database_url()
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        where = "--database-url" if settings.database_url else "--data-dir (FEDLITE_B_DATA_DIR)"
        raise MaintenanceError(
            f"no database at {path}: pass the {where} party B serves from, or issue a first "
            "token with 'fedlite-b token issue' to create one"
        )
    return url


def cmd_db_backup(args: argparse.Namespace) -> int:
    """Online backup of the SQLite file (consistent while party B serves); PostgreSQL has
    pg_dump."""
    from party_b.ops.maintenance import backup_database

    url = settings_from_flags(args).resolved_database_url()
    path = sqlite_path(url)
    if path is None:
        raise MaintenanceError(
            f"{url.split(':', 1)[0]} database: back it up with its own tools (pg_dump for "
            "PostgreSQL)"
        )
    size, check = backup_database(path, Path(args.to))
    print(f"{args.to}\t{size} bytes\tintegrity_check: {check}")
    return 0


def cmd_db_copy(args: argparse.Namespace) -> int:
    from party_b.store import copy_database

    source_path = sqlite_path(args.source)
    if source_path is not None and not source_path.is_file():
        raise MaintenanceError(f"no database at {source_path} (--from)")
    source = make_engine(args.source)
    target = make_engine(args.target)
    try:
        copied = copy_database(source, target)
    finally:
        source.dispose()
        target.dispose()
    for table, rows in copied.items():
        print(f"{table}\t{rows}")
    return 0


# ====================================================================== tokens


@contextmanager
def _token_session(args: argparse.Namespace, *, create: bool) -> Iterator[Session]:
    """A session on the flags' database; its engine (and any PostgreSQL connection) closed
    at the end."""
    settings = settings_from_flags(args)
    if create:
        url = settings.resolved_database_url()
        if create_private_database(url):
            print(f"created the database {sqlite_path(url)}", file=sys.stderr)
    else:
        url = existing_database(settings)
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            yield session
    finally:
        engine.dispose()


def cmd_token_issue(args: argparse.Namespace) -> int:
    from party_b.access import ALL_SCOPES, parse_expiry, parse_scopes
    from party_b.store.grants import set_grant

    out: Path | None = args.out
    if out is not None and out.exists():
        raise MaintenanceError(f"{out} exists; not overwriting it (choose a new --out)")
    scopes = parse_scopes(args.scope or "all")  # ValueError: exit 2, one line
    expires_at = parse_expiry(args.expires) if args.expires else None
    subject = _subject(args.subject) if args.subject else None
    if args.certificate_only and subject is None:
        raise ValueError("--certificate-only needs --subject: the certificate is the credential")
    with _token_session(args, create=True) as session:
        row = store.token_named(session, args.name)
        if row is not None and not args.rotate:
            state = "revoked" if row.revoked_at else "active"
            raise MaintenanceError(
                f"a token named {args.name!r} exists ({state}); pass --rotate to replace it "
                "(the old token stops working at once), or choose another --name"
            )
        runs_of = None
        if args.runs_of:
            owner = store.token_named(session, args.runs_of)
            if owner is None:
                raise MaintenanceError(f"--runs-of {args.runs_of!r}: no token of that name")
            runs_of = owner.id
        if subject is not None:
            _refuse_subject_clash(session, subject, args.name)
        if row is not None:
            auth.revoke_token(session, args.name)  # the old hash stays refused for good
        token = auth.issue_token(session, args.name)
        issued = store.token_named(session, args.name)
        assert issued is not None
        grant_needed = scopes != ALL_SCOPES or expires_at or subject or runs_of or row is not None
        if grant_needed:
            set_grant(
                session,
                issued.id,
                scopes=",".join(sorted(scopes)),
                expires_at=expires_at,
                subject=subject,
                certificate_only=bool(args.certificate_only),
                runs_of=runs_of,
            )
            session.commit()
    if args.certificate_only:
        # the random bearer secret exists only to fill the row; it is never shown
        print(f"{args.name!r} authenticates with the client certificate {subject!r} alone")
        return 0
    if out is None:
        print(token)
        return 0
    fd = os.open(out, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    print(f"token for {args.name!r} written to {out} (mode 600)", file=sys.stderr)
    return 0


def _subject(text: str) -> str:
    """An RFC 4514 subject as ``openssl x509 -noout -subject -nameopt RFC2253`` prints it;
    ValueError for one in an order no certificate's subject is written in."""
    from party_b.subjects import operator_subject

    return operator_subject(text)


def _refuse_subject_clash(session: Any, subject: str, name: str) -> None:
    from party_b.store.grants import grant_with_subject

    clash = grant_with_subject(session, subject)
    if clash is None:
        return
    owner = session.get(store.ApiToken, clash.token_id)
    if owner is not None and owner.name != name:
        raise MaintenanceError(
            f"the certificate {subject!r} is already bound to the token {owner.name!r}; "
            "revoke that one first (one certificate, one caller)"
        )


def cmd_token_revoke(args: argparse.Namespace) -> int:
    with _token_session(args, create=False) as session:
        if not auth.revoke_token(session, args.name):
            print(f"fedlite-b token revoke: no active token named {args.name!r}", file=sys.stderr)
            return 1
    print(f"revoked {args.name}")
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    """One line per token: name, state (active, revoked, expired), scope, expiry, and the
    certificate and run owner where the token has them."""
    from datetime import UTC, datetime

    from party_b.store.grants import grant_of

    now = datetime.now(UTC)
    with _token_session(args, create=False) as session:
        names = {row.id: row.name for row in store.all_tokens(session)}
        for row in store.all_tokens(session):
            grant = grant_of(session, row.id)
            expires = grant.expires_at if grant is not None else None
            if row.revoked_at:
                state = f"revoked {row.revoked_at:%Y-%m-%d %H:%M}"
            elif expires is not None and expires <= now:
                state = f"expired {expires:%Y-%m-%d %H:%M}"
            else:
                state = "active"
            fields = [
                row.name,
                state,
                f"scope {grant.scopes if grant is not None else 'all'}",
                f"expires {expires:%Y-%m-%d %H:%M}Z" if expires else "expires never",
            ]
            if grant is not None and grant.subject:
                how = "certificate only" if grant.certificate_only else "token + certificate"
                fields.append(f"{how} {grant.subject}")
            if grant is not None and grant.runs_of is not None:
                fields.append(f"runs of {names.get(grant.runs_of, grant.runs_of)}")
            print("\t".join(fields))
    return 0
