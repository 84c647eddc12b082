"""Party B's tables (SQLAlchemy 2.0 declarative): tokens, runs, step log, checkpoints, PSI keys,
run leases.

The types used here (JSON, LargeBinary) are portable between SQLite and PostgreSQL. A table
added later is created by ``make_engine``'s ``create_all`` on an older database: new state
goes into new tables, so upgrading needs no migration.
"""

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

__all__ = [
    "ApiToken",
    "AuditEntry",
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
    "StepLog",
    "TokenGrant",
]


def _now() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """A moment, stored in UTC and read back as an aware UTC datetime on every database.

    SQLite keeps no time zone: a plain ``DateTime(timezone=True)`` hands back naive datetimes
    there (aware ones on PostgreSQL), and the API then showed ``created_at`` without its ``Z``
    on every read but the first.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else _as_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else _as_utc(value)


def _as_utc(moment: datetime) -> datetime:
    """Every moment party B handles is UTC: a naive one (SQLite's) is read as UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class Base(DeclarativeBase):
    pass


class ApiToken(Base):
    """An operator-issued bearer token, stored only as its SHA-256."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(120), unique=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), default=None)


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), index=True)
    name: Mapped[str] = mapped_column(String(120))
    status: Mapped[str] = mapped_column(String(16), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    alignment_key: Mapped[str] = mapped_column(String(64))
    num_classes: Mapped[int] = mapped_column(Integer)
    side_features: Mapped[int] = mapped_column(Integer)
    # Sorted 32-byte HMACs of the intersection, concatenated (set once, at alignment).
    aligned_ids: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    train_size: Mapped[int | None] = mapped_column(Integer, default=None)
    eval_size: Mapped[int | None] = mapped_column(Integer, default=None)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now, onupdate=_now)


class StepLog(Base):
    """One row per applied training step (rows past a restored checkpoint are deleted)."""

    __tablename__ = "step_log"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    loss: Mapped[float | None] = mapped_column(Float)
    accuracy: Mapped[float | None] = mapped_column(Float)
    bytes_in: Mapped[int] = mapped_column(Integer)
    bytes_out: Mapped[int] = mapped_column(Integer)
    decode_ms: Mapped[float] = mapped_column(Float)
    compute_ms: Mapped[float] = mapped_column(Float)
    total_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)


class Checkpoint(Base):
    """Top model and optimizer after ``step``, plus that step's request hash and response.

    Keeping the response lets a restarted party B answer a resent step identically.
    """

    __tablename__ = "checkpoints"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_state: Mapped[bytes] = mapped_column(LargeBinary)
    optimizer_state: Mapped[bytes] = mapped_column(LargeBinary)
    request_sha256: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    response: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)


class EvalResult(Base):
    __tablename__ = "eval_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    split: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)


class RevokedToken(Base):
    """The SHA-256 of every token ever revoked, kept after its name gets a new token.

    ``api_tokens`` holds one (current) token per name; without this table, revoking a leaked
    token and issuing a new one under the same name forgot the old hash, and the next start-up
    that registered the old token from FEDLITE_B_TOKENS brought it back. A table of its own so
    that an older database gains it with ``create_all``, without a migration.
    """

    __tablename__ = "revoked_tokens"

    token_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(120))
    revoked_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)


class IdempotencyKey(Base):
    """The ``Idempotency-Key`` of the POST that created a run, per token.

    A retried ``POST /v1/runs`` whose answer was lost gets this run back instead of creating a
    second one. A table of its own (not a column of ``runs``) so that a database from before
    it gains it with ``create_all`` at start-up, without a migration.
    """

    __tablename__ = "idempotency_keys"

    owner_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)


class PsiKey(Base):
    """Party B's secret PSI scalar for one id set, and the public name of that set.

    Keeping the key keeps party B's blinded set (and so party A's cached intersections) valid
    across restarts; a new label table gets a new row. It is as secret as the ids themselves:
    with it and a PSI set-up, anyone can test guessed ids.
    """

    __tablename__ = "psi_keys"

    ids_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)  # dataset_digest
    dataset_version: Mapped[str] = mapped_column(String(32), unique=True)
    private_key: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)


class RunPrivacy(Base):
    """The label-privacy policy party B gave a run at creation, and the run's secret for its
    random draws (``party_b.privacy``). Kept with the run so that the run trains under the
    same policy after a restart, whatever the operator's switch says by then; a run without
    a row was created before policies existed and trains as ``off``. The secret is as secret
    as the labels: with it party A could regenerate the gradient noise.
    """

    __tablename__ = "run_privacy"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    policy: Mapped[dict[str, Any]] = mapped_column(JSON)
    secret: Mapped[bytes] = mapped_column(LargeBinary)


class RunLease(Base):
    """Which replica of party B holds a run in memory, and its fencing token.

    Every load of a run (a replica taking it over, or reloading it) raises ``token`` in the
    transaction that reads the run's newest checkpoint; every commit that changes the run
    (a step, a resume, a finish, a checkpoint of an evicted run) first updates this row where
    ``token`` is still the one its holder loaded with, and is refused when it is not. So two
    replicas never both apply steps of one run: the row lock orders a takeover against a
    commit, and a copy loaded before the takeover can no longer commit (``store.leases``).
    A table of its own, so that an older database gains it with ``create_all``.
    """

    __tablename__ = "run_leases"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(200), default=None)  # None: released
    token: Mapped[int] = mapped_column(Integer)
    held_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)  # last claim/commit


class PrivacyLedger(Base):
    """The label-DP epsilon each run spent of its owner's labels, one row per run created
    since accounting existed (``party_b.privacy.accounting``); ``epsilon`` None: the run's
    policy gives no formal bound (off, or gradient noise alone). No foreign key to ``runs``
    and not deleted with the run: what party A received from a deleted run stays spent.
    """

    __tablename__ = "privacy_ledger"

    run_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), index=True)
    epsilon: Mapped[float | None] = mapped_column(Float, default=None)
    policy: Mapped[str] = mapped_column(String(400))  # PrivacyPolicy.describe()
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)


class PrivacyBudget(Base):
    """The operator's cap on the label-DP epsilon one token's runs may spend in total
    (``fedlite-b token budget``); a token without a row has no cap."""

    __tablename__ = "privacy_budgets"

    owner_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), primary_key=True)
    epsilon: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now, onupdate=_now)


class LabelDraw(Base):
    """One draw of a label table's randomized labels (``party_b.privacy.draws``): the secret
    from which every run on that table under that mechanism (``label_epsilon``,
    ``prior_fraction``) derives each id's randomized label, so that all of them train on the
    same randomized labels and the table spends the epsilon of this one draw.

    ``table_sha256``: the table's content digest (ids and labels, never sent); ``retired_at``:
    set by ``fedlite-b privacy redraw``, after which the next run draws anew (a new secret,
    counted again in its token's ledger). As secret as the labels; never deleted, like the
    ledger: what party A received from a draw stays received. A table of its own, so that an
    older database gains it with ``create_all``.
    """

    __tablename__ = "label_draws"
    __table_args__ = (UniqueConstraint("table_sha256", "mechanism", "generation"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    table_sha256: Mapped[str] = mapped_column(String(64), index=True)
    mechanism: Mapped[str] = mapped_column(String(200))  # privacy.draws.mechanism
    generation: Mapped[int] = mapped_column(Integer)  # 0, then one more per redraw
    epsilon: Mapped[float] = mapped_column(Float)
    secret: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)
    retired_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), default=None)


class RunLabelDraw(Base):
    """Which draw a run's randomized labels come from, for the ledger: a token's runs on one
    draw spend its epsilon once. No foreign key to ``runs`` and not deleted with the run, like
    ``privacy_ledger``; a run without a row draws its own labels (created before draws
    existed) or has no label DP."""

    __tablename__ = "run_label_draws"

    run_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    draw_id: Mapped[int] = mapped_column(ForeignKey("label_draws.id"), index=True)


class OperatorEvaluation(Base):
    """An evaluation as party B's operator sees it: the activations party A sent for it,
    scored against the true labels (under label DP party A's reply, ``eval_results``, is on
    the randomized ones), and the model's scores of the rows, kept for the newest evaluation
    of each split so that ``fedlite-b evaluate`` can score them against another label table.
    Never served to party A. A table of its own, so that an older database gains it with
    ``create_all``.
    """

    __tablename__ = "operator_evaluations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    eval_id: Mapped[int] = mapped_column(
        ForeignKey("eval_results.id", ondelete="CASCADE"), index=True
    )
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    split: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)  # on the true labels
    # the evaluated rows' aligned keys (32 bytes each) and the model's float32 (n, C) class
    # probabilities; None once a newer evaluation of the split keeps them
    keys: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    scores: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    classes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)


class TokenGrant(Base):
    """What a token may do and until when (``party_b.access``): its scopes, expiry, the client
    certificate it is bound to, and whose runs it acts on.

    A table of its own (a token without a row has every scope and no expiry), so that an
    older database gains it with ``create_all`` and its tokens keep working as they did.
    """

    __tablename__ = "token_grants"

    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), primary_key=True)
    scopes: Mapped[str] = mapped_column(String(200))  # comma-separated scope names
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), default=None)
    # RFC 4514 subject of the client certificate the token must come with (mutual TLS)
    subject: Mapped[str | None] = mapped_column(String(1000), default=None, index=True)
    certificate_only: Mapped[bool] = mapped_column(Boolean, default=False)  # no bearer token
    runs_of: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"), default=None)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now)


class AuditEntry(Base):
    """One line of party B's audit trail (``party_b.audit``): who did what to which run, with
    how many ids, when.

    No foreign key to ``runs``: the trail outlives a deleted run (its deletion is an entry).
    A table of its own, so an older database gains it with ``create_all``.
    """

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), default=_now, index=True)
    action: Mapped[str] = mapped_column(String(32), index=True)  # party_b.access.Action
    actor: Mapped[str] = mapped_column(String(120), index=True)  # the token's name
    subject: Mapped[str | None] = mapped_column(String(1000), default=None)  # client cert
    run_id: Mapped[str | None] = mapped_column(String(32), default=None, index=True)
    ids: Mapped[int | None] = mapped_column(Integer, default=None)  # ids aligned / scored
    outcome: Mapped[str] = mapped_column(String(16), default="ok")  # ok, refused
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
