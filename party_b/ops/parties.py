"""``fedlite-b parties``: the operator's side of runs with several feature parties
(docs/PROTOCOL.md section 12.2).

    fedlite-b parties create RUN.json --owner NAME [--out DIR]   the run, and one token per party
    fedlite-b parties tokens --run ID [--party P ...] [--out DIR] (new) tokens of a run's parties
    fedlite-b parties revoke --run ID --party P                  at once, while party B serves
    fedlite-b parties list [--run ID]                            party tokens and their state

A token is printed once (JSON on stdout), or written to ``DIR/<party>.token`` (a new file,
mode 600) with ``--out``. Issuing a party's token again revokes its earlier one. ``create``
reads party B's label table (the flags and FEDLITE_B_* variables of ``serve``) to check the
run as ``POST /v1/runs`` does; the run belongs to the token ``--owner``, which may read and
delete it.
"""

import argparse
import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from api_schemas import RunCreate
from party_b import store
from party_b.errors import ProblemError
from party_b.ops.admin import existing_database
from party_b.ops.maintenance import MaintenanceError
from party_b.party_tokens import issue_party_token, revoke_party
from party_b.settings import settings_from_flags
from party_b.store import parties as party_store

__all__ = ["add_parser", "create_party_run", "issue_tokens"]


def create_party_run(settings_args: argparse.Namespace, spec: RunCreate, owner: str) -> str:
    """The run, created by party B's service as ``POST /v1/runs`` would; its id."""
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
    service = build_service(
        sessions=sessions,
        labels=load_labels(settings),
        limits=settings.limits,
        metrics=Metrics(),
        privacy=settings.privacy_policy(),
    )
    try:
        return service.runs.create(caller, spec).id
    except ProblemError as exc:
        raise MaintenanceError(f"party B refuses the run: {exc.detail}") from None


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
        return {party: issue_party_token(session, run_id, party) for party in parties or names}


def _deliver(run_id: str, tokens: dict[str, str], out: Path | None) -> None:
    """Print the tokens, or write each to a new private file."""
    if out is None:
        print(json.dumps({"run": run_id, "tokens": tokens}))
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
    print(json.dumps({"run": run_id, "tokens": files}))


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
    run_id = create_party_run(args, spec, args.owner)
    _deliver(run_id, issue_tokens(args, run_id, None), args.out)
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
    create.add_argument("--privacy", help="label privacy of the run (as serve's)")
    create.set_defaults(func=_cmd_create)
    tokens = add(parties_sub, "tokens", help="issue (again) the tokens of a run's parties")
    tokens.add_argument("--run", required=True, help="the run's id")
    tokens.add_argument("--party", action="append", help="only this party (repeatable)")
    tokens.add_argument("--out", type=Path, help="write each token to DIR/<party>.token")
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
