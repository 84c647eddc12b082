"""``fedlite-b token budget``: the operator's cap on the label-DP epsilon of one token's runs.

    fedlite-b token budget --name alice                  what alice's runs spent, and her cap
    fedlite-b token budget --name alice --epsilon 2      cap: epsilon 2 over all her runs
    fedlite-b token budget --name alice --none           no cap

Reads and writes the database directly, like ``token issue``; takes effect at the next run
creation, also while party B serves. ``party_b.privacy.accounting`` says what a run spends.
"""

import argparse
import json
import math

from party_b import store
from party_b.ops.admin import existing_database
from party_b.ops.maintenance import MaintenanceError
from party_b.privacy.accounting import spent
from party_b.settings import settings_from_flags
from party_b.store import make_engine, make_session_factory

__all__ = ["cmd_token_budget", "epsilon_value"]


def epsilon_value(text: str) -> float:
    """argparse type of ``--epsilon``: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"the budget is a finite epsilon > 0, not {text!r}")
    return value


def cmd_token_budget(args: argparse.Namespace) -> int:
    engine = make_engine(existing_database(settings_from_flags(args)))
    try:
        with make_session_factory(engine)() as session:
            token = store.token_named(session, args.name)
            if token is None:
                raise MaintenanceError(f"no token named {args.name!r}: see 'fedlite-b token list'")
            if args.none or args.epsilon is not None:
                store.set_privacy_budget(session, token.id, None if args.none else args.epsilon)
                session.commit()
            shown = {"token": token.name, **spent(session, token.id).as_json()}
    finally:
        engine.dispose()
    print(json.dumps(shown))
    return 0
