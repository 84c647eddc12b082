"""What party B holds in memory for a run (``RunState``), and which of its feature parties a
caller is (``party_of``)."""

import threading
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy.orm import Session

from api_schemas import RunCreate
from party_b import store
from party_b.access import Caller
from party_b.errors import ProblemError
from party_b.privacy.run import OFF, RunPrivacy
from party_b.service.fusion import PartyPlan
from party_b.top import TopTrainer
from shared.schedule import BatchSchedule, StepBatch

__all__ = ["Caller", "RunState", "owned_row", "party_of"]


@dataclass
class RunState:
    """An aligned run with its top model in memory. Guarded by ``lock``.

    ``step``, ``last_request_sha`` and ``last_response`` change together, only when a step
    commits (``party_b.service.steps``) or the run rolls back to a checkpoint; the last two
    hold every feature party's request digest and answer of ``step``
    (``store.pack_answers``).
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
    plan: PartyPlan  # its feature parties: one (the token's run) or several, each quantized
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

    def training_keys(self) -> frozenset[str]:
        """The aligned keys (hex) of the run's training split, built once per run in memory
        (a race only builds it twice)."""
        if self.train_keys is None:
            self.train_keys = frozenset(self.aligned[p].hex() for p in self.train_pos)
        return self.train_keys

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


def party_of(plan: PartyPlan, run_id: str, caller: Caller) -> int:
    """The index in ``plan`` of the caller's feature party of run ``run_id``. A run's own
    token acts for its one party, on the routes of docs/PROTOCOL.md section 10; a run created
    with ``parties`` is served on its parties' routes only (409, naming them); a party token
    acts for its party (404 for a party the run does not have, as for a missing run)."""
    names = plan.names
    if caller.party is None:
        if plan.named:
            raise ProblemError.run_state(
                f"this run has feature parties ({', '.join(names)}): each party sends its "
                "requests to /v1/runs/{id}/parties/{party}/... with its own token "
                "(docs/PROTOCOL.md section 12)"
            )
        return 0
    if caller.party.run_id != run_id or caller.party.party not in names:
        raise ProblemError.not_found(
            f"no party {caller.party.party!r} in run {caller.party.run_id!r}"
        )
    return names.index(caller.party.party)
