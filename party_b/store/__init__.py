"""Party B's persistent state through SQLAlchemy 2.0, in one layer.

    tables.py       the tables: tokens, runs, step log, checkpoints, evaluations, PSI keys
    engine.py       make_engine (SQLite made safe for threads and crashes), copy_database
    checkpoints.py  save / load / list / roll back checkpoints (one transaction each)
    queries.py      every other query the service makes
    ledger.py       the privacy ledger: epsilon spent per run, budgets per token
    draws.py        label draws: each label table's secret for its randomized labels
    truth.py        the operator's evaluations: on the true labels, with the newest scores
    tokens.py       API tokens by name or hash, active or all; revoked hashes
    leases.py       which replica holds a run, fenced by a token (claim, fence, release)
    takeovers.py    how far a run had gone before a load rolled it back (its "behind" mark)
    parties.py      runs with several feature parties: party tokens, traffic per party
    served.py       what ``fedlite-b serve`` last started with (the privacy of new runs)

Everything is re-exported here: ``from party_b import store`` then ``store.owned_run(...)``.
"""

from party_b.store.checkpoints import (
    checkpoint_steps,
    forget_after,
    load_checkpoint,
    pack_answers,
    save_checkpoint,
    unpack_answers,
)
from party_b.store.draws import (
    current_draw,
    draw_of_run,
    draws,
    draws_of_runs,
    link_run_to_draw,
    retire_draws,
    runs_per_draw,
)
from party_b.store.engine import copy_database, make_engine, make_session_factory
from party_b.store.leases import claim, fence, is_free, lease_of, release
from party_b.store.ledger import (
    add_ledger_entry,
    ledger_entry,
    ledger_of,
    privacy_budget,
    runs_before_ledger,
    set_privacy_budget,
)
from party_b.store.queries import (
    add_run,
    add_run_privacy,
    count_open_runs,
    delete_run,
    eval_results,
    lock_owner,
    log_evaluation,
    log_step,
    owned_run,
    psi_key,
    run_by_id,
    run_created_with_key,
    run_privacy,
    runs_in_status,
    runs_of,
    step_log,
)
from party_b.store.served import SERVED_PRIVACY, ServedSetting, record_served, served_setting
from party_b.store.tables import (
    ApiToken,
    Base,
    Checkpoint,
    EvalResult,
    IdempotencyKey,
    LabelDraw,
    OperatorEvaluation,
    PrivacyBudget,
    PrivacyLedger,
    PsiKey,
    RevokedToken,
    Run,
    RunLabelDraw,
    RunLease,
    RunPrivacy,
    StepLog,
)
from party_b.store.takeovers import behind_mark, last_logged_step
from party_b.store.tokens import (
    active_tokens,
    all_tokens,
    revoked_hash,
    token_by_hash,
    token_named,
)
from party_b.store.truth import log_operator_evaluation, newest_scored, operator_evaluations

__all__ = [
    "ApiToken",
    "Base",
    "Checkpoint",
    "EvalResult",
    "IdempotencyKey",
    "LabelDraw",
    "OperatorEvaluation",
    "PrivacyBudget",
    "PrivacyLedger",
    "PsiKey",
    "RevokedToken",
    "Run",
    "RunLabelDraw",
    "RunLease",
    "RunPrivacy",
    "SERVED_PRIVACY",
    "ServedSetting",
    "StepLog",
    "active_tokens",
    "add_ledger_entry",
    "add_run",
    "add_run_privacy",
    "all_tokens",
    "behind_mark",
    "checkpoint_steps",
    "claim",
    "copy_database",
    "count_open_runs",
    "current_draw",
    "delete_run",
    "draw_of_run",
    "draws",
    "draws_of_runs",
    "eval_results",
    "fence",
    "forget_after",
    "is_free",
    "last_logged_step",
    "lease_of",
    "link_run_to_draw",
    "ledger_entry",
    "ledger_of",
    "load_checkpoint",
    "pack_answers",
    "lock_owner",
    "log_evaluation",
    "log_operator_evaluation",
    "log_step",
    "make_engine",
    "make_session_factory",
    "newest_scored",
    "operator_evaluations",
    "owned_run",
    "privacy_budget",
    "psi_key",
    "record_served",
    "release",
    "retire_draws",
    "revoked_hash",
    "run_by_id",
    "run_created_with_key",
    "run_privacy",
    "runs_before_ledger",
    "runs_in_status",
    "runs_of",
    "runs_per_draw",
    "save_checkpoint",
    "unpack_answers",
    "served_setting",
    "set_privacy_budget",
    "step_log",
    "token_by_hash",
    "token_named",
]
