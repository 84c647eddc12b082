"""Label-DP accounting for the operator: tokens' budgets and the label tables' draws.

    fedlite-b token budget --name alice                  what alice's runs spent, and her cap
    fedlite-b token budget --name alice --epsilon 2      cap: epsilon 2 over all her runs
    fedlite-b token budget --name alice --none           no cap of her own (party B's default)
    fedlite-b privacy draws                              every label draw: table, epsilon, runs
    fedlite-b privacy redraw --yes                       new randomized labels for new runs

A label draw is the secret every run on one label table (at one epsilon) takes its
randomized labels from (``party_b.privacy.draws``): however many runs use it, they release
one randomized response per label. ``redraw`` retires every draw in use, so that the next
run on each table draws anew: new randomized labels, and a new epsilon spent by every token
that trains again (the ledger counts it). It is the operator's act, for a secret that may
have leaked; it never makes the labels more private than they were.

Reads and writes the database directly, like ``token issue``; takes effect at the next run
creation, also while party B serves. ``party_b.privacy.accounting`` says what a run spends.
"""

import argparse
import json
import math
from typing import Any

from sqlalchemy.orm import Session

from party_b import store
from party_b.ops.admin import existing_database
from party_b.ops.maintenance import MaintenanceError
from party_b.privacy import PrivacyPolicy
from party_b.privacy.accounting import spent
from party_b.privacy.policy import default_budget
from party_b.settings import Settings, settings_from_flags
from party_b.store import make_engine, make_session_factory

__all__ = [
    "add_privacy_parser",
    "cmd_privacy_draws",
    "cmd_token_budget",
    "epsilon_value",
    "served_default_budget",
]


def epsilon_value(text: str) -> float:
    """argparse type of ``--epsilon``: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"the budget is a finite epsilon > 0, not {text!r}")
    return value


def served_default_budget(session: Session, settings: Settings) -> float | None:
    """The budget of a token the operator gave none, as the database's party B applies it:
    from the policy ``fedlite-b serve`` last recorded (else this command's own settings)."""
    served = store.served_setting(session, store.SERVED_PRIVACY)
    policy = (
        PrivacyPolicy.from_stored(served.value) if served is not None else settings.privacy_policy()
    )
    return default_budget(settings.limits.epsilon_budget, policy)


def cmd_token_budget(args: argparse.Namespace) -> int:
    settings = settings_from_flags(args)
    engine = make_engine(existing_database(settings))
    try:
        with make_session_factory(engine)() as session:
            token = store.token_named(session, args.name)
            if token is None:
                raise MaintenanceError(f"no token named {args.name!r}: see 'fedlite-b token list'")
            if args.none or args.epsilon is not None:
                store.set_privacy_budget(session, token.id, None if args.none else args.epsilon)
                session.commit()
            spend = spent(
                session, token.id, default_budget=served_default_budget(session, settings)
            )
            shown = {"token": token.name, **spend.as_json()}
    finally:
        engine.dispose()
    print(json.dumps(shown))
    return 0


def cmd_privacy_draws(args: argparse.Namespace) -> int:
    """Every label draw as a JSON line, oldest first; per label table, its epsilon over its
    lifetime (the sum over its draws: what all tokens together can have learnt)."""
    engine = make_engine(existing_database(settings_from_flags(args)))
    try:
        with make_session_factory(engine)() as session:
            rows = store.draws(session)
            runs = store.runs_per_draw(session)
            lifetime: dict[str, float] = {}
            for row in rows:
                if runs.get(row.id):  # a draw no run used released nothing
                    lifetime[row.table_sha256] = lifetime.get(row.table_sha256, 0.0) + row.epsilon
            for row in rows:
                print(json.dumps(_draw_json(row, runs.get(row.id, 0), lifetime)))
    finally:
        engine.dispose()
    return 0


def _draw_json(row: store.LabelDraw, runs: int, lifetime: dict[str, float]) -> dict[str, Any]:
    return {
        "draw": row.id,
        "table": row.table_sha256[:16],  # the label table's content digest, shortened
        "mechanism": row.mechanism,
        "epsilon": row.epsilon,
        "generation": row.generation,
        "created_at": row.created_at.isoformat(),
        "retired_at": row.retired_at.isoformat() if row.retired_at is not None else None,
        "runs": runs,
        "table_epsilon": lifetime.get(row.table_sha256, 0.0),
    }


def cmd_privacy_redraw(args: argparse.Namespace) -> int:
    """Retire every draw in use: the next run on each table draws new randomized labels."""
    if not args.yes:
        raise MaintenanceError(
            "a redraw gives new runs new randomized labels, and every token that trains again "
            "spends a new epsilon of each label (its ledger counts it; its budget may refuse "
            "it): give --yes to retire the draws in use"
        )
    engine = make_engine(existing_database(settings_from_flags(args)))
    try:
        with make_session_factory(engine)() as session:
            retired = store.retire_draws(session)
            session.commit()
    finally:
        engine.dispose()
    print(json.dumps({"retired_draws": retired}))
    return 0


def add_privacy_parser(sub: Any, add: Any, storage_flags: Any) -> None:
    """``fedlite-b privacy draws|redraw`` (``add``: the CLI's subcommand factory)."""
    privacy = add(
        sub,
        "privacy",
        help="the label tables' draws of randomized labels: list, redraw",
        description="Under label DP every run on a label table trains on the same randomized "
        "labels, drawn once per table and epsilon (docs/PRIVACY.md, section 2.4).",
    )
    privacy_sub = privacy.add_subparsers(dest="privacy_command", required=True)
    listing = add(
        privacy_sub,
        "draws",
        help="every label draw: table digest, epsilon, runs, and each table's epsilon so far",
    )
    storage_flags(listing)
    listing.set_defaults(func=cmd_privacy_draws)
    redraw = add(
        privacy_sub,
        "redraw",
        help="retire every draw in use: new runs get new randomized labels (spends anew)",
    )
    redraw.add_argument("--yes", action="store_true", help="confirm: every new draw spends anew")
    storage_flags(redraw)
    redraw.set_defaults(func=cmd_privacy_redraw)
