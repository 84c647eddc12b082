"""Who asks and what party B holds in memory for a run: ``Caller`` and ``RunState``."""

import threading
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy.orm import Session

from api_schemas import RunCreate
from party_b import store
from party_b.errors import ProblemError
from party_b.privacy.run import OFF, RunPrivacy
from party_b.top import TopTrainer
from shared.pq import GroupedProductQuantizer
from shared.schedule import BatchSchedule, StepBatch

__all__ = ["Caller", "RunState", "owned_row"]


@dataclass(frozen=True)
class Caller:
    """Who a request comes from (``party_b.access.identify``): ``token_id`` is the token
    whose runs it sees and acts on, ``name`` the token's name (logs, the audit trail)."""

    token_id: int
    name: str
    subject: str | None = None  # the client certificate's subject, with mutual TLS
    scopes: tuple[str, ...] = ()  # the token's scope names, for messages
    actions: frozenset[str] | None = None  # what it may do (party_b.access); None: anything


@dataclass
class RunState:
    """An aligned run with its top model in memory. Guarded by ``lock``.

    ``step``, ``last_request_sha`` and ``last_response`` change together, only when a step
    commits (``party_b.service.steps``) or the run rolls back to a checkpoint.
    """

    run_id: str
    owner_id: int
    alignment_key: bytes
    config: RunCreate
    trainer: TopTrainer
    aligned: list[bytes]  # aligned keys (HMACs) in raw-id order, the order both parties use
    label_rows: np.ndarray  # (n_aligned,) row of each aligned key in the label source
    train_pos: np.ndarray  # positions into ``aligned``
    eval_pos: np.ndarray
    batches: BatchSchedule  # the batch of every step, as positions into ``train_pos``
    rows_per_sample: int  # activation rows per sample: 1, or T tokens for sequence models
    dequantizer: GroupedProductQuantizer | None  # None for raw runs
    privacy: RunPrivacy = OFF  # the label-privacy policy party B gave the run
    step: int = 0  # last applied step
    last_request_sha: bytes | None = None
    last_response: bytes | None = None
    finished: bool = False
    key_index: dict[bytes, int] | None = None  # all of party B's ids, built on first predict
    # the fencing token of the run's lease this copy was loaded with (store.leases); None
    # once the copy lost it (the run was parked, or another replica claimed it)
    lease: int | None = None
    # loaded from a checkpoint older than steps the run had applied (a crash, a takeover):
    # party A is ahead and rolls back, so a step ahead is not held for its predecessor
    behind: bool = False
    train_keys: frozenset[str] | None = None  # hex keys of the training split (privacy)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def positions_of(self, split: str) -> np.ndarray:
        """Positions into ``aligned`` of the run's ``"train"`` or ``"eval"`` samples."""
        return self.train_pos if split == "train" else self.eval_pos

    def batch(self, step: int) -> StepBatch:
        """Step ``step``'s rows as positions into ``aligned``, and its chunk sizes."""
        batch = self.batches.batch(step)
        return StepBatch(self.train_pos[batch.positions], batch.chunk_sizes)

    def commit(self, step: int, request_sha: bytes | None, response: bytes | None) -> None:
        """Record that ``step`` is the last applied step, answered with ``response``."""
        self.step, self.last_request_sha, self.last_response = step, request_sha, response
        self.behind = False


def owned_row(session: Session, caller: Caller, run_id: str) -> store.Run:
    """The run's row if the caller owns it; otherwise 404, the same for another token's run
    as for a missing one (one lookup either way)."""
    run = store.owned_run(session, caller.token_id, run_id)
    if run is None:
        raise ProblemError.not_found(f"no run {run_id!r}")
    return run
