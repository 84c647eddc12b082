"""``fedlite-b audit``: read party B's audit trail (``party_b.audit``).

    fedlite-b audit                               the newest 100 events, one a line
    fedlite-b audit --action predict --totals     per caller: calls, ids scored, first, last
    fedlite-b audit --since 2026-11-01 --jsonl --out audit.jsonl   JSON lines for a SIEM

Reading needs no running party B (the table is in its database; SQLite allows it while
party B serves).
"""

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from party_b.ops.admin import existing_database
from party_b.ops.maintenance import MaintenanceError
from party_b.settings import settings_from_flags
from party_b.store import make_engine, make_session_factory
from party_b.store.audit import AuditFilter, audit_entries, audit_totals
from party_b.store.tables import AuditEntry

__all__ = ["add_audit_parser", "cmd_audit"]


def _moment(text: str, flag: str) -> datetime:
    """A UTC date or date-time, or a duration back from now (``7d``); ValueError naming the
    flag for anything else, and for a duration reaching back before the year 1."""
    from party_b.access import parse_duration

    now = datetime.now(UTC)
    duration = parse_duration(text, flag)
    if duration is not None:
        try:
            return now - duration
        except OverflowError:
            raise ValueError(
                f"{flag} {text!r} reaches back before the year 1: give a shorter duration "
                "or a date (2026-11-01)"
            ) from None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{flag} {text!r}: give a UTC date (2026-11-01), a date-time "
            "(2026-11-01T08:00:00Z) or a duration back from now (7d, 12h)"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _as_json(entry: AuditEntry) -> dict[str, Any]:
    return {
        "at": entry.at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "action": entry.action,
        "actor": entry.actor,
        "subject": entry.subject,
        "run": entry.run_id,
        "ids": entry.ids,
        "outcome": entry.outcome,
        **(entry.detail or {}),
    }


@contextmanager
def _output(path: Path | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    if path.exists():
        raise MaintenanceError(f"{path} exists; not overwriting it (choose a new --out)")
    with path.open("x") as handle:
        yield handle


def cmd_audit(args: argparse.Namespace) -> int:
    filters = AuditFilter(
        run_id=args.run,
        actor=args.actor,
        action=args.action,
        since=_moment(args.since, "--since") if args.since else None,
        until=_moment(args.until, "--until") if args.until else None,
    )
    engine = make_engine(existing_database(settings_from_flags(args)))
    try:
        with make_session_factory(engine)() as session, _output(args.out) as out:
            if args.totals:
                for t in audit_totals(session, filters):
                    print(
                        f"{t.actor}\t{t.subject or '-'}\t{t.action}\t{t.calls} calls\t"
                        f"{t.ids} ids\t{t.first:%Y-%m-%d %H:%M:%S}Z\t{t.last:%Y-%m-%d %H:%M:%S}Z",
                        file=out,
                    )
                return 0
            limit = None if args.jsonl and args.limit is None else (args.limit or 100)
            for entry in audit_entries(session, filters, limit=limit):
                if args.jsonl:
                    print(json.dumps(_as_json(entry), ensure_ascii=False), file=out)
                    continue
                print(
                    f"{entry.at:%Y-%m-%d %H:%M:%S}Z\t{entry.action}\t{entry.actor}\t"
                    f"{entry.subject or '-'}\t{entry.run_id or '-'}\t"
                    f"{'-' if entry.ids is None else entry.ids}\t{entry.outcome}",
                    file=out,
                )
    finally:
        engine.dispose()
    return 0


def add_audit_parser(sub: Any, add: Any, storage_flags: Any) -> None:
    """``fedlite-b audit``'s parser (``add``: the CLI's subcommand factory)."""
    audit = add(
        sub,
        "audit",
        help="who created, aligned, finished, deleted, evaluated or scored which run, with "
        "how many ids, when",
        description="Read party B's audit trail (table audit_log of its database). One event "
        "a line: time (UTC), action, caller (token name), client certificate subject, run, "
        "ids, outcome (ok, or refused: outside the token's scope).",
    )
    audit.add_argument("--run", help="only this run")
    audit.add_argument("--actor", help="only this caller (token name)")
    audit.add_argument(
        "--action",
        # party_b.access.Action's values (step and read appear as refused calls only)
        choices=[
            "create-run",
            "psi",
            "align",
            "finish",
            "delete",
            "evaluate",
            "predict",
            "step",
            "read",
        ],  # fmt: skip
        help="only this action",
    )
    audit.add_argument("--since", help="from this UTC date/time, or a duration back (7d)")
    audit.add_argument("--until", help="before this UTC date/time, or a duration back")
    audit.add_argument(
        "--totals", action="store_true", help="per caller and action: calls, ids, first, last"
    )
    audit.add_argument(
        "--jsonl", action="store_true", help="one JSON object a line (every match), for a SIEM"
    )
    audit.add_argument("--limit", type=int, help="the newest N events (default 100)")
    audit.add_argument("--out", type=Path, help="write to this new file instead of stdout")
    storage_flags(audit)
    audit.set_defaults(func=cmd_audit)
