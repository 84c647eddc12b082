"""``fedlite-b evaluate RUN``: a run's quality on the true labels, for party B's operator.

    fedlite-b evaluate RUN                         every evaluation: party A's reply and the
                                                   same activations on the true labels
    fedlite-b evaluate RUN --held-out later.csv    the newest scores of each split against
                                                   another label table (e.g. outcomes that
                                                   arrived after training)

Under label DP party A's evaluations are on the run's randomized labels; party B, who owns
the labels, keeps every evaluation scored against the true ones too, and the model's scores
of the newest evaluation of each split (``party_b.privacy.truth``). One JSON object a line.
Reads the database directly (also while party B serves); nothing here reaches party A.
"""

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from party_b import store
from party_b.ops.admin import existing_database
from party_b.ops.maintenance import MaintenanceError
from party_b.settings import settings_from_flags
from party_b.store import make_engine, make_session_factory

__all__ = ["add_evaluate_parser", "cmd_evaluate", "held_out_metrics"]


def cmd_evaluate(args: argparse.Namespace) -> int:
    engine = make_engine(existing_database(settings_from_flags(args)))
    try:
        with make_session_factory(engine)() as session:
            run = store.run_by_id(session, args.run)
            if run is None:
                raise MaintenanceError(f"no run {args.run!r}: see 'fedlite-b runs list'")
            if args.held_out is None:
                lines = _evaluations(session, run.id)
            else:
                lines = _held_out(session, run, args)
    finally:
        engine.dispose()
    for line in lines:
        print(json.dumps(line))
    return 0


def _evaluations(session: Any, run_id: str) -> list[dict[str, Any]]:
    """One line per evaluation, oldest first: what party A got, and the true labels'."""
    truths = store.operator_evaluations(session, run_id)
    lines = []
    for e in store.eval_results(session, run_id):
        truth = truths.get(e.id)
        lines.append(
            {
                "step": e.step,
                "split": e.split,
                "n": e.n,
                "party_a": {"loss": e.loss, **e.metrics},
                "true_labels": {"loss": truth.loss, **truth.metrics} if truth else None,
                "at": e.created_at.isoformat(),
            }
        )
    if not lines:
        raise MaintenanceError(
            f"run {run_id} has no evaluation yet: party A evaluates it (fedlite-a train, "
            "fedlite-a evaluate); party B scores the activations it sends"
        )
    return lines


def _held_out(session: Any, run: store.Run, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The newest scores of each split against the held-out table's labels, by id."""
    from party_b.labels import load_label_table
    from shared.alignment import hmac_ids

    table = load_label_table(
        args.held_out, id_column=args.held_out_id, label_column=args.held_out_label,
        feature_columns=[],
    )  # fmt: skip
    if table.num_outputs != run.num_classes:
        raise MaintenanceError(
            f"{args.held_out} has {table.num_outputs} classes ({', '.join(table.classes)}); "
            f"run {run.id} has {run.num_classes}: give a table of the run's classes"
        )
    key = bytes.fromhex(run.alignment_key)
    labelled = table.labels >= 0
    by_key = {
        k: int(y)
        for k, y, has in zip(hmac_ids(key, table.ids), table.labels, labelled, strict=True)
        if has
    }
    lines = []
    for scored in store.newest_scored(session, run.id):
        assert scored.keys is not None and scored.scores is not None
        keys = [scored.keys[i : i + 32] for i in range(0, len(scored.keys), 32)]
        scores = np.frombuffer(scored.scores, dtype=np.float32).reshape(-1, scored.classes)
        found = [i for i, k in enumerate(keys) if k in by_key]
        truth = np.array([by_key[keys[i]] for i in found], dtype=np.int64)
        lines.append(
            {
                "step": scored.step,
                "split": scored.split,
                "scored": len(keys),
                "held_out": {"n": len(found), **held_out_metrics(truth, scores[found])},
            }
        )
    if not lines:
        raise MaintenanceError(f"run {run.id} has no scored evaluation to compare with")
    return lines


def held_out_metrics(truth: np.ndarray, scores: np.ndarray) -> dict[str, float | None]:
    """Loss (mean cross-entropy), accuracy and, with two classes, AUC of the (n, C) class
    probabilities ``scores`` against the classes ``truth`` (n,); None where undefined."""
    if len(truth) == 0:
        return {"loss": None, "accuracy": None}
    chosen = np.clip(scores[np.arange(len(truth)), truth].astype(np.float64), 1e-12, 1.0)
    out: dict[str, float | None] = {
        "loss": float(-np.log(chosen).mean()),
        "accuracy": float((scores.argmax(axis=1) == truth).mean()),
    }
    if scores.shape[1] == 2:
        from sklearn.metrics import roc_auc_score

        both = len(np.unique(truth)) == 2
        out["auc"] = float(roc_auc_score(truth, scores[:, 1])) if both else None
    return {k: v if v is None or math.isfinite(v) else None for k, v in out.items()}


def add_evaluate_parser(sub: Any, add: Any, storage_flags: Any) -> None:
    """``fedlite-b evaluate``'s parser (``add``: the CLI's subcommand factory)."""
    evaluate = add(
        sub,
        "evaluate",
        help="a run's evaluations on the true labels (under label DP party A's are on "
        "randomized ones); --held-out scores them against another label table",
        description="Party B's operator's view of a run's quality; nothing here reaches "
        "party A. One JSON object a line.",
    )
    evaluate.add_argument("run", help="the run's id (fedlite-b runs list)")
    evaluate.add_argument(
        "--held-out",
        type=Path,
        metavar="FILE",
        help="a label table (CSV(.gz) or Parquet, the run's classes): the newest scores of "
        "each split against its labels, joined by id",
    )
    # dests of their own: party B's --id-column / --label-column name its served table
    evaluate.add_argument(
        "--id-column",
        dest="held_out_id",
        metavar="COLUMN",
        default="id",
        help="its id column (default 'id')",
    )
    evaluate.add_argument(
        "--label-column",
        dest="held_out_label",
        metavar="COLUMN",
        default="y",
        help="its label column (default 'y')",
    )
    storage_flags(evaluate)
    evaluate.set_defaults(func=cmd_evaluate)
