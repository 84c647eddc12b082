"""Party B's persistent state through SQLAlchemy 2.0, in one layer.

    tables.py       the tables: tokens, runs, step log, checkpoints, evaluations, PSI keys
    engine.py       make_engine (SQLite made safe for threads and crashes), copy_database
    checkpoints.py  save / load / list / roll back checkpoints (one transaction each)
    queries.py      every other query the service makes

Everything is re-exported here: ``from party_b import store`` then ``store.owned_run(...)``.
(``party_b.auth`` keeps the token queries beside the token logic.)
"""

from party_b.store.checkpoints import (
    checkpoint_steps,
    forget_after,
    load_checkpoint,
    save_checkpoint,
)
from party_b.store.engine import copy_database, make_engine, make_session_factory
from party_b.store.queries import (
    add_run,
    count_open_runs,
    eval_results,
    log_evaluation,
    log_step,
    owned_run,
    psi_key,
    run_created_with_key,
    runs_in_status,
    runs_of,
    step_log,
)
from party_b.store.tables import (
    ApiToken,
    Base,
    Checkpoint,
    EvalResult,
    IdempotencyKey,
    PsiKey,
    RevokedToken,
    Run,
    StepLog,
)

__all__ = [
    "ApiToken",
    "Base",
    "Checkpoint",
    "EvalResult",
    "IdempotencyKey",
    "PsiKey",
    "RevokedToken",
    "Run",
    "StepLog",
    "add_run",
    "checkpoint_steps",
    "copy_database",
    "count_open_runs",
    "eval_results",
    "forget_after",
    "load_checkpoint",
    "log_evaluation",
    "log_step",
    "make_engine",
    "make_session_factory",
    "owned_run",
    "psi_key",
    "run_created_with_key",
    "runs_in_status",
    "runs_of",
    "save_checkpoint",
    "step_log",
]
