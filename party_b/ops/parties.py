"""``fedlite-b parties``: the operator's side of runs with several feature parties
(docs/PROTOCOL.md section 12.2).

    fedlite-b parties create RUN.json --owner NAME [--out DIR]   the run, and one token per party
    fedlite-b parties tokens --run ID [--party P ...] [--out DIR] (new) tokens of a run's parties
        [--expires 30d] [--subject "CN=..."]                     (one party's certificate)
    fedlite-b parties revoke --run ID --party P                  at once, while party B serves
    fedlite-b parties list [--run ID]                            party tokens and their state

A token is printed once (JSON on stdout), or written to ``DIR/<party>.token`` (a new file,
mode 600) with ``--out``. Issuing a party's token again revokes its earlier one; a party token
expires (``--expires``) and is bound to a client certificate (``--subject``, mutual TLS) as an
API token is (``party_b.access``). ``create``
reads party B's label table (the flags and FEDLITE_B_* variables of ``serve``) to check the
run as ``POST /v1/runs`` does; the run belongs to the token ``--owner``, which may read and
delete it.

The run's label privacy is ``--privacy`` (or ``FEDLITE_B_PRIVACY``) when given; otherwise
the policy ``fedlite-b serve`` recorded in the database when it last started (what it gives
the runs created over HTTP); otherwise party B's default (``protected``). ``create`` says
which, and why, on stderr, and the policy in its JSON (``"privacy"``).
"""

import argparse
import json
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from api_schemas import RunCreate
from party_b import store
from party_b.errors import ProblemError
from party_b.ops.admin import existing_database
from party_b.ops.maintenance import MaintenanceError
from party_b.party_tokens import issue_party_token, revoke_party
from party_b.privacy.policy import DEFAULT_PRESET, PRESETS, PrivacyPolicy, parse_policy
from party_b.settings import Settings, settings_from_flags
from party_b.store import parties as party_store

__all__ = [
    "RunPrivacyChoice",
    "add_parser",
    "create_party_run",
    "issue_tokens",
    "new_run_privacy",
    "spell_policy",
]


@dataclass(frozen=True)
class RunPrivacyChoice:
    """The label-privacy policy a run created here gets, and why (one line for the operator)."""

    policy: PrivacyPolicy
    why: str


def create_party_run(
    settings_args: argparse.Namespace, spec: RunCreate, owner: str
) -> tuple[str, RunPrivacyChoice]:
    """The run, created by party B's service as ``POST /v1/runs`` would; its id, and the
    privacy policy it got (see the module's docstring)."""
    from party_b.api.main import load_labels
    from party_b.metrics import Metrics
    from party_b.service import Caller, build_service

    settings = settings_from_flags(settings_args)
    sessions = store.make_session_factory(store.make_engine(existing_database(settings)))
    with sessions() as session:
        row = store.token_named(session, owner)
        if row is None or row.revoked_at is not None:
            raise MaintenanceError(f"no active token named {owner!r} to own the run (--owner)")
        caller = Caller(token_id=row.id, name=row.name)
        privacy = new_run_privacy(settings_args, settings, session)
    service = build_service(
        sessions=sessions,
        labels=load_labels(settings),
        limits=settings.limits,
        metrics=Metrics(),
        privacy=privacy.policy,
    )
    try:
        return service.runs.create(caller, spec).id, privacy
    except ProblemError as exc:
        raise MaintenanceError(f"party B refuses the run: {exc.detail}") from None


def new_run_privacy(
    args: argparse.Namespace, settings: Settings, session: Session
) -> RunPrivacyChoice:
    """``--privacy`` or FEDLITE_B_PRIVACY when given; else the policy ``fedlite-b serve``
    recorded in this database; else party B's default."""
    if getattr(args, "privacy", None) is not None:
        return RunPrivacyChoice(settings.privacy_policy(), "--privacy")
    if any(name.upper() == "FEDLITE_B_PRIVACY" for name in os.environ):
        return RunPrivacyChoice(settings.privacy_policy(), "FEDLITE_B_PRIVACY")
    served = store.served_setting(session, store.SERVED_PRIVACY)
    if served is None:
        return RunPrivacyChoice(
            parse_policy(DEFAULT_PRESET),
            "party B's default: no fedlite-b serve has recorded a policy in this database; "
            "give --privacy to choose",
        )
    try:
        policy = PrivacyPolicy(**served.value)
    except (TypeError, ValueError) as exc:  # recorded by another version of party B
        raise MaintenanceError(
            f"the privacy policy fedlite-b serve recorded in this database is not one this "
            f"version reads ({exc}); give --privacy"
        ) from None
    when = f"{served.recorded_at:%Y-%m-%d %H:%M:%S} UTC"
    return RunPrivacyChoice(
        policy, f"the policy fedlite-b serve recorded in this database when it started, {when}"
    )


def spell_policy(policy: PrivacyPolicy) -> str:
    """The policy as ``--privacy`` spells it: the closest preset, then what differs from it
    (``off``, ``off,predict_train_ids=true``); ``parse_policy`` reads it back."""
    spellings = []
    for preset, base in PRESETS.items():
        changed = [
            f"{f.name}={_spell_value(f.name, getattr(policy, f.name))}"
            for f in fields(PrivacyPolicy)
            if getattr(policy, f.name) != getattr(base, f.name)
        ]
        spellings.append((len(changed), ",".join([preset, *changed])))
    return min(spellings, key=lambda spelling: spelling[0])[1]  # the first of equals


def _spell_value(name: str, value: object) -> str:
    if value is None:  # label_epsilon's "none", predict_train_ids' "unset"
        return "unset" if name == "predict_train_ids" else "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def issue_tokens(
    args: argparse.Namespace, run_id: str, parties: list[str] | None
) -> dict[str, str]:
    """A new token for each named party of the run (all of them by default)."""
    settings = settings_from_flags(args)
    sessions = store.make_session_factory(store.make_engine(existing_database(settings)))
    with sessions() as session:
        run = store.run_by_id(session, run_id)
        if run is None:
            raise MaintenanceError(f"no run {run_id!r}")
        spec = RunCreate.from_stored(run.config)
        names = [p.name for p in spec.parties or []]
        if not names:
            raise MaintenanceError(
                f"run {run_id} has one feature party, its creator's token: no party tokens"
            )
        unknown = sorted(set(parties or []) - set(names))
        if unknown:
            raise MaintenanceError(f"run {run_id} has no party {unknown}; its parties: {names}")
        expires_at, subject = _grant(args, parties)
        return {
            party: issue_party_token(session, run_id, party, expires_at=expires_at, subject=subject)
            for party in parties or names
        }


def _grant(args: argparse.Namespace, parties: list[str] | None) -> tuple[Any, str | None]:
    """``--expires`` (every token issued) and ``--subject`` (one party's token: a party's
    client certificate is its own), checked as ``fedlite-b token issue`` checks them."""
    from party_b.access import parse_expiry
    from party_b.subjects import operator_subject

    expires, subject = getattr(args, "expires", None), getattr(args, "subject", None)
    if subject is not None and len(parties or []) != 1:
        raise MaintenanceError("--subject binds one party's token: name that party (--party P)")
    try:
        return (
            parse_expiry(expires) if expires else None,
            operator_subject(subject) if subject else None,
        )
    except ValueError as exc:
        raise MaintenanceError(str(exc)) from None


def _deliver(
    run_id: str, tokens: dict[str, str], out: Path | None, *, privacy: str | None = None
) -> None:
    """Print the tokens, or write each to a new private file (and print where); with the
    run's privacy policy when it was just created."""
    extra = {} if privacy is None else {"privacy": privacy}
    if out is None:
        print(json.dumps({"run": run_id, "tokens": tokens, **extra}))
        return
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = {}
    for party, token in tokens.items():
        path = out / f"{party}.token"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            raise MaintenanceError(
                f"{path} exists; not overwriting it (choose a new --out)"
            ) from None
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        files[party] = str(path)
    print(json.dumps({"run": run_id, "tokens": files, **extra}))


def _cmd_create(args: argparse.Namespace) -> int:
    try:
        spec = RunCreate.model_validate(json.loads(Path(args.spec).read_text()))
    except FileNotFoundError:
        raise MaintenanceError(f"no such run file: {args.spec}") from None
    except json.JSONDecodeError as exc:
        raise MaintenanceError(f"{args.spec}: not JSON: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'run'}: {e['msg']}" for e in exc.errors()
        )
        raise MaintenanceError(f"{args.spec}: {problems}") from None
    if spec.parties is None:
        raise MaintenanceError(
            f"{args.spec} names no parties; create such a run with POST /v1/runs"
        )
    run_id, privacy = create_party_run(args, spec, args.owner)
    spelled = spell_policy(privacy.policy)
    print(f"privacy: {spelled} ({privacy.why})", file=sys.stderr)
    _deliver(run_id, issue_tokens(args, run_id, None), args.out, privacy=spelled)
    return 0


def _cmd_tokens(args: argparse.Namespace) -> int:
    _deliver(args.run, issue_tokens(args, args.run, args.party), args.out)
    return 0


def _cmd_revoke(args: argparse.Namespace) -> int:
    settings = settings_from_flags(args)
    sessions = store.make_session_factory(store.make_engine(existing_database(settings)))
    with sessions() as session:
        if not revoke_party(session, args.run, args.party):
            raise MaintenanceError(f"no active token of party {args.party!r} of run {args.run}")
    print(json.dumps({"run": args.run, "revoked": args.party}))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    settings = settings_from_flags(args)
    sessions = store.make_session_factory(store.make_engine(existing_database(settings)))
    with sessions() as session:
        for row in party_store.party_tokens(session, args.run):
            state = f"revoked {row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "active"
            print(f"{row.run_id}\t{row.party}\t{state}\t{row.created_at:%Y-%m-%d %H:%M}")
    return 0


def add_parser(sub: Any, add: Any, storage: Any, labels: Any) -> None:
    """``fedlite-b parties ...``; ``add``, ``storage``, ``labels``: the CLI's helpers."""
    parties = add(sub, "parties", help="runs with several feature parties: create, tokens")
    parties_sub = parties.add_subparsers(dest="parties_command", required=True)
    create = add(
        parties_sub,
        "create",
        help="create a run naming its feature parties, and issue one token per party",
    )
    create.add_argument("spec", type=Path, help="the run as JSON (RunCreate with parties)")
    create.add_argument("--owner", required=True, help="the token (name) the run belongs to")
    create.add_argument("--out", type=Path, help="write each token to DIR/<party>.token")
    storage(create)
    labels(create)
    create.add_argument(
        "--privacy",
        help="label privacy of the run, spelled as serve's (default: the policy fedlite-b "
        "serve recorded in this database at its last start, else 'protected')",
    )
    create.set_defaults(func=_cmd_create)
    tokens = add(parties_sub, "tokens", help="issue (again) the tokens of a run's parties")
    tokens.add_argument("--run", required=True, help="the run's id")
    tokens.add_argument("--party", action="append", help="only this party (repeatable)")
    tokens.add_argument("--out", type=Path, help="write each token to DIR/<party>.token")
    tokens.add_argument("--expires", help="when the tokens stop working: 30d, 12h or a UTC date")
    tokens.add_argument(
        "--subject", help="the client certificate (RFC 4514) the party's token must come with"
    )
    storage(tokens)
    tokens.set_defaults(func=_cmd_tokens)
    revoke = add(parties_sub, "revoke", help="revoke a party's token (at once)")
    revoke.add_argument("--run", required=True)
    revoke.add_argument("--party", required=True)
    storage(revoke)
    revoke.set_defaults(func=_cmd_revoke)
    listing = add(parties_sub, "list", help="party tokens: run, party, state")
    listing.add_argument("--run", help="only this run's")
    storage(listing)
    listing.set_defaults(func=_cmd_list)
