"""``fedlite-b runs list|show|delete``: the operator's view of every caller's runs.

Reads and writes the database directly, like ``token`` and ``db``; a wrong ``--data-dir`` is
an error, never a new empty database. ``delete`` is for a stopped party B (a running one keeps
a run it has loaded in memory): while it serves, the run's owner deletes it with
``DELETE /v1/runs/{id}`` (``fedlite-a delete``).
"""

import argparse
import json
from typing import Any

from sqlalchemy.orm import Session

from party_b import store
from party_b.ops.admin import existing_database
from party_b.ops.budget_admin import served_default_budget
from party_b.ops.maintenance import MaintenanceError
from party_b.privacy.accounting import run_privacy_json
from party_b.settings import settings_from_flags
from party_b.store import make_engine, make_session_factory
from party_b.store.overview import runs_with_owners

__all__ = ["cmd_runs_delete", "cmd_runs_list", "cmd_runs_show"]


def cmd_runs_list(args: argparse.Namespace) -> int:
    """One line per run, newest first: id, name, owner, status, step of its newest checkpoint."""
    engine = make_engine(existing_database(settings_from_flags(args)))
    try:
        with make_session_factory(engine)() as session:
            for run, owner in runs_with_owners(session, limit=100_000):
                steps = store.checkpoint_steps(session, run.id)
                newest = steps[-1] if steps else "-"
                print(f"{run.id}\t{run.name}\t{owner}\t{run.status}\tcheckpoint {newest}")
    finally:
        engine.dispose()
    return 0


def cmd_runs_show(args: argparse.Namespace) -> int:
    """One run as JSON: config, status, sizes, checkpoints, steps logged, evaluations, its
    label privacy (policy, epsilon spent) and its owner's spend and budget."""
    settings = settings_from_flags(args)
    engine = make_engine(existing_database(settings))
    try:
        with make_session_factory(engine)() as session:
            found = runs_with_owners(session, limit=1, run_id=args.run)
            if not found:
                raise MaintenanceError(f"no run {args.run!r}: see 'fedlite-b runs list'")
            run, owner = found[0]
            shown = {
                "id": run.id,
                "name": run.name,
                "owner": owner,
                "status": run.status,
                "train_size": run.train_size,
                "eval_size": run.eval_size,
                "created_at": run.created_at.isoformat(),
                "checkpoints": store.checkpoint_steps(session, run.id),
                "steps_logged": len(store.step_log(session, run.id, 0, 10**9)),
                "evaluations": _evaluations(session, run.id),
                **run_privacy_json(
                    session,
                    run.id,
                    run.owner_id,
                    default_budget=served_default_budget(session, settings),
                ),
                "config": run.config,
            }
    finally:
        engine.dispose()
    print(json.dumps(shown, indent=2))
    return 0


def _evaluations(session: Session, run_id: str) -> list[dict[str, Any]]:
    """Each evaluation as party A got it, and (``true_labels``) the same activations scored
    against the true labels, which under label DP differ (``fedlite-b evaluate``)."""
    truths = store.operator_evaluations(session, run_id)
    shown = []
    for e in store.eval_results(session, run_id):
        truth = truths.get(e.id)
        true_labels = {"loss": truth.loss, **truth.metrics} if truth is not None else None
        shown.append(
            {"step": e.step, "split": e.split, "n": e.n, "loss": e.loss, **e.metrics}
            | {"true_labels": true_labels}
        )
    return shown


def cmd_runs_delete(args: argparse.Namespace) -> int:
    """Delete a run and everything stored for it (party B stopped)."""
    from party_b import audit
    from party_b.service.runstate import Caller

    engine = make_engine(existing_database(settings_from_flags(args)))
    try:
        sessions = make_session_factory(engine)
        with sessions() as session:
            if store.run_by_id(session, args.run) is None:
                raise MaintenanceError(f"no run {args.run!r}: see 'fedlite-b runs list'")
            store.delete_run(session, args.run)
            session.commit()
        # the operator's deletion is in the trail too (token id 0: no token, the operator)
        operator = Caller(token_id=0, name="operator (fedlite-b runs delete)")
        audit.record(sessions, operator, "delete", args.run)
    finally:
        engine.dispose()
    print(f"deleted run {args.run}")
    return 0
