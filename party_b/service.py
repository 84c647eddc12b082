"""Party B's run service: every operation of the API, without any HTTP.

Routes in ``party_b.app`` only translate HTTP to these calls (run in worker threads, since
they do torch work) and render :class:`ProblemError` as problem+json. The experiment harness
calls the same methods in-process.

Exactly-once steps. Party B keeps, per run, the last applied step t, the SHA-256 of its request
body and its response bytes. A request for step t again (party A retrying after a lost
response) gets the identical stored bytes back, without a second update; any other step than
t+1 gets 409 ``step-out-of-order`` naming the expected step. Every ``checkpoint_interval``
steps the top model, optimizer state and that step's request hash and response are written in
one transaction *before* the response leaves, and the newest few checkpoints are kept. After a
crash party B restarts from its newest checkpoint c; party A, which keeps matching
checkpoints, either resends step c (answered from the stored response) or rolls both parties
back to a common checkpoint with ``resume``.
"""

import hashlib
import logging
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from torch import Tensor

from api_schemas import (
    AlignmentOut,
    EvalResultOut,
    PsiInfo,
    RunCreate,
    RunOut,
    RunStatus,
    StepLogOut,
)
from api_schemas.problems import ProblemType
from api_schemas.runs import AlignmentInfo
from party_b import store
from party_b.alignment import Aligner, PsiAligner
from party_b.errors import ProblemError
from party_b.labels import LabelSource
from party_b.metrics import Metrics
from party_b.settings import Limits
from party_b.top import DivergedError, StepOutcome, TopTrainer
from shared import codec
from shared.alignment import hmac_ids, order_by_raw_id
from shared.models import MODEL_NAMES, build_top, top_kwargs
from shared.models import task as model_task
from shared.psi import (
    PSI_PROTOCOL,
    PsiError,
    PsiTooLarge,
    decode_psi_request,
    encode_psi_reply,
    new_server_key,
)
from shared.quantizer import GroupedProductQuantizer, PQCode, PQConfig
from shared.schedule import (
    BatchSchedule,
    StepBatch,
    batch_digest,
    make_schedule,
    split_train_eval,
    step_seed,
)
from shared.training import state_sha256

__all__ = ["Caller", "RunService"]

log = logging.getLogger("fedlite.party_b")

# The top-model kwarg that party B fills from its label set, per model.
_OUTPUT_KWARG = {
    "femnist_cnn": "num_classes",
    "tabular_mlp": "num_classes",
    "so_tag": "num_tags",
    "next_token_lstm": "vocab_size",
}
_FINISHED_CACHE = 4  # finished runs kept in memory for evaluate/predict


@dataclass(frozen=True)
class Caller:
    """The authenticated token a request came with."""

    token_id: int
    name: str


@dataclass
class _RunState:
    """A training or finished run with its top model in memory. Guarded by ``lock``."""

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
    step: int = 0  # last applied step
    last_request_sha: bytes | None = None
    last_response: bytes | None = None
    finished: bool = False
    key_index: dict[bytes, int] | None = None  # all of party B's ids, built on first predict
    lock: threading.Lock = field(default_factory=threading.Lock)

    def positions_of(self, split: str) -> np.ndarray:
        return self.train_pos if split == "train" else self.eval_pos


def _rows_per_step(spec: RunCreate) -> int:
    """Samples in one step of the run: its batch, times the clients of a 'clients' step."""
    return spec.batch_size * (
        spec.schedule.clients_per_step if spec.schedule.kind == "clients" else 1
    )


class RunService:
    def __init__(
        self,
        *,
        sessions: sessionmaker[Session],
        labels: LabelSource,
        limits: Limits,
        metrics: Metrics,
        checkpoints_kept: int = 3,
        aligner: Aligner | None = None,
    ) -> None:
        self._sessions = sessions
        self._labels = labels
        self._limits = limits
        self._metrics = metrics
        self._keep = checkpoints_kept
        self._aligner = aligner or PsiAligner(labels.ids, self._psi_key)
        self._decode_limits = codec.DecodeLimits(
            max_batch=limits.max_batch,
            max_dim=limits.max_dim,
            max_q=limits.max_q,
            max_L=limits.max_L,
        )
        self._live: dict[str, _RunState] = {}
        self._finished: OrderedDict[str, _RunState] = OrderedDict()
        self._registry_lock = threading.Lock()  # guards _live, _finished and _loading
        self._create_lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}

    # ============================================================== start-up

    def recover(self) -> list[tuple[str, str, int]]:
        """Report where every training run resumes after a restart: [(id, name, step)].

        Models load lazily on first use; this only reads checkpoint steps and drops step-log
        rows past them (steps applied after the last checkpoint died with the old process).
        """
        resumed = []
        with self._sessions() as session:
            runs = session.scalars(
                select(store.Run).where(store.Run.status == RunStatus.TRAINING.value)
            ).all()
            for run in runs:
                steps = store.checkpoint_steps(session, run.id)
                last = steps[-1] if steps else 0
                store.forget_after(session, run.id, last)
                resumed.append((run.id, run.name, last))
                log.warning(
                    "run %s (%s) resumes from checkpoint at step %d", run.id, run.name, last
                )
            session.commit()
        return resumed

    # ============================================================== runs

    def create_run(
        self, caller: Caller, spec: RunCreate, idempotency_key: str | None = None
    ) -> RunOut:
        """A new run; with ``idempotency_key``, a repeat of the same request gets the same run."""
        self._check_spec(spec)
        top = self._top_kwargs(spec)
        try:
            self._new_trainer(spec)  # refuse now what could not be built at alignment
        except ValueError as exc:
            raise ProblemError.invalid(f"top model: {exc}") from None
        # the quota check and the insert must not interleave with another create
        with self._create_lock, self._sessions() as session:
            if idempotency_key is not None:
                earlier = self._created_with(session, caller, spec, idempotency_key)
                if earlier is not None:
                    return earlier
            open_runs = session.scalar(
                select(func.count())
                .select_from(store.Run)
                .where(
                    store.Run.owner_id == caller.token_id,
                    store.Run.status != RunStatus.FINISHED.value,
                )
            )
            if (open_runs or 0) >= self._limits.max_runs_per_token:
                raise ProblemError(
                    429,
                    ProblemType.TOO_MANY_RUNS,
                    "Too many open runs",
                    f"this token already has {open_runs} unfinished runs "
                    f"(limit {self._limits.max_runs_per_token}); finish one first",
                )
            run = store.Run(
                id=uuid.uuid4().hex,
                owner_id=caller.token_id,
                name=spec.name,
                status=RunStatus.CREATED.value,
                config=spec.model_dump(mode="json"),
                alignment_key=secrets.token_hex(32),
                num_classes=self._labels.num_outputs,
                side_features=int(top.get("side_features", 0)),
            )
            session.add(run)
            if idempotency_key is not None:
                session.flush()  # the run row first: the key refers to it
                session.add(
                    store.IdempotencyKey(
                        owner_id=caller.token_id, key=idempotency_key, run_id=run.id
                    )
                )
            try:
                session.commit()
            except IntegrityError:  # the same key arrived twice at once: the other one won
                session.rollback()
                assert idempotency_key is not None
                earlier = self._created_with(session, caller, spec, idempotency_key)
                if earlier is None:
                    raise
                return earlier
            return self._run_out(session, run)

    def _created_with(
        self, session: Session, caller: Caller, spec: RunCreate, key: str
    ) -> RunOut | None:
        known = session.get(store.IdempotencyKey, (caller.token_id, key))
        run = session.get(store.Run, known.run_id) if known is not None else None
        if run is None:
            return None
        if run.config != spec.model_dump(mode="json"):
            raise ProblemError(
                422,
                ProblemType.IDEMPOTENCY_KEY_REUSED,
                "Idempotency key reused",
                f"run {run.id} was created with this Idempotency-Key and another configuration",
            )
        return self._run_out(session, run)

    def list_runs(self, caller: Caller) -> list[RunOut]:
        with self._sessions() as session:
            runs = session.scalars(
                select(store.Run)
                .where(store.Run.owner_id == caller.token_id)
                .order_by(store.Run.created_at)
            ).all()
            return [self._run_out(session, run) for run in runs]

    def get_run(self, caller: Caller, run_id: str) -> RunOut:
        """The run; for an aligned one also its top model's checksum at the reported step."""
        with self._sessions() as session:
            run = self._owned(session, caller, run_id)
            if run.status == RunStatus.CREATED.value:
                return self._run_out(session, run)
        try:
            state = self._state(caller, run_id)
        except ProblemError:  # e.g. the label table lost ids: still show the run
            with self._sessions() as session:
                return self._run_out(session, self._owned(session, caller, run_id))
        with state.lock, self._sessions() as session:  # step and checksum of one moment
            out = self._run_out(session, self._owned(session, caller, run_id))
            out.model_sha256 = state_sha256(state.trainer.model.state_dict())
            return out

    def finish(self, caller: Caller, run_id: str) -> RunOut:
        """No more steps; the final model is checkpointed and keeps serving predictions."""
        with self._sessions() as session:
            run = self._owned(session, caller, run_id)
            if run.status == RunStatus.FINISHED.value:
                return self._run_out(session, run)
            if run.status != RunStatus.TRAINING.value:
                raise ProblemError.run_state(f"run is {run.status}; align and train it first")
        state = self._state(caller, run_id)
        with state.lock, self._sessions() as session:
            run = self._owned(session, caller, run_id)
            if run.status == RunStatus.TRAINING.value:
                model_state, optimizer_state = state.trainer.state()
                store.save_checkpoint(
                    session,
                    run_id=run_id,
                    step=state.step,
                    model_state=model_state,
                    optimizer_state=optimizer_state,
                    request_sha256=state.last_request_sha,
                    response=state.last_response,
                    keep=self._keep,
                )
                run.status = RunStatus.FINISHED.value
                session.commit()
                state.finished = True
                self._retire(run_id, state)
            return self._run_out(session, run)

    # ============================================================== alignment

    def psi_info(self, caller: Caller) -> PsiInfo:
        """What party A needs before a PSI: party B's dataset version (to look up its cache)."""
        return PsiInfo(
            dataset_version=self._aligner.dataset_version(),
            protocol=PSI_PROTOCOL,
            size=len(self._labels.ids),
            max_ids=self._limits.max_aligned_ids,
        )

    def psi(self, caller: Caller, body: bytes) -> bytes:
        """One private set intersection request (shared.psi); returns the encoded PsiReply."""
        try:
            request = decode_psi_request(body)
            reply, count = self._aligner.psi(request.request, max_ids=self._limits.max_aligned_ids)
        except PsiTooLarge as exc:
            raise ProblemError.limit(str(exc)) from None
        except PsiError as exc:
            raise ProblemError(
                400, ProblemType.MALFORMED_MESSAGE, "Malformed message", str(exc)
            ) from None
        # Every PSI answers "which of these ids do you hold?": keep a record of who asked.
        log.info("PSI request from %s: %d ids offered", caller.name, count)
        data = encode_psi_reply(reply)
        self._metrics.bytes_received.labels("psi").inc(len(body))
        self._metrics.bytes_sent.labels("psi").inc(len(data))
        return data

    def _psi_key(self, ids_sha256: str) -> tuple[str, bytes]:
        with self._sessions() as session:
            row = store.psi_key(session, ids_sha256=ids_sha256, new_key=new_server_key)
            return row.dataset_version, row.private_key

    def align(self, caller: Caller, run_id: str, hashed_hex: Sequence[str]) -> AlignmentOut:
        """Align the run on the ids party A sends and start it (idempotent).

        Party A sends HMAC(run key, id) of the ids in its private set intersection with party B
        (``psi``), none other; party B keeps the ones it holds.
        """
        if len(hashed_hex) > self._limits.max_aligned_ids:
            raise ProblemError.limit(
                f"{len(hashed_hex)} ids, over the limit {self._limits.max_aligned_ids}"
            )
        offered = [bytes.fromhex(h) for h in hashed_hex]
        with self._sessions() as session:
            run = self._owned(session, caller, run_id)
            spec = RunCreate.model_validate(run.config)
            key = bytes.fromhex(run.alignment_key)
            own = hmac_ids(key, self._labels.ids)
            common = self._aligner.intersect(set(own), offered)
            aligned = order_by_raw_id(self._labels.ids, own, common)
            if run.status != RunStatus.CREATED.value:
                if run.aligned_ids == b"".join(aligned):
                    return self._alignment_out(run, aligned)  # a retried call: same answer
                raise ProblemError.run_state("run is already aligned with a different id set")
            train_pos, eval_pos = split_train_eval(
                max(len(aligned), 1), seed=spec.seed, eval_fraction=spec.eval_fraction
            )
            if len(aligned) < 2 or len(train_pos) < spec.batch_size:
                raise ProblemError.invalid(
                    f"only {len(aligned)} ids in common ({len(train_pos)} for training); "
                    f"need at least batch_size={spec.batch_size} training samples"
                )
            trainer = self._new_trainer(spec)
            model_state, optimizer_state = trainer.state()
            run.aligned_ids = b"".join(aligned)
            run.train_size, run.eval_size = len(train_pos), len(eval_pos)
            run.status = RunStatus.TRAINING.value
            store.save_checkpoint(
                session,
                run_id=run_id,
                step=0,
                model_state=model_state,
                optimizer_state=optimizer_state,
                request_sha256=None,
                response=None,
                keep=self._keep,
            )
            session.commit()
            return self._alignment_out(run, aligned)

    # ============================================================== training

    def step(self, caller: Caller, run_id: str, body: bytes) -> bytes:
        """Apply one training step exactly once; returns the encoded StepResponse."""
        started = time.perf_counter()
        state = self._state(caller, run_id)
        with state.lock:
            if state.finished:
                raise ProblemError.run_state("run is finished; it takes no more steps")
            sha = hashlib.sha256(body).digest()
            request = self._decode(codec.decode_step_request, body)
            if request.step == state.step and state.last_response is not None:
                if sha != state.last_request_sha:
                    self._metrics.steps.labels("rejected").inc()
                    raise ProblemError(
                        409,
                        ProblemType.STEP_REPLAY_MISMATCH,
                        "Step already applied with another body",
                        f"step {request.step} was applied with a different request; "
                        "party A's state diverged from party B's",
                        applied_step=state.step,
                    )
                self._metrics.steps.labels("replayed").inc()
                return state.last_response
            if request.step != state.step + 1:
                self._metrics.steps.labels("rejected").inc()
                when = "future" if request.step > state.step else "past"
                raise ProblemError(
                    409,
                    ProblemType.STEP_OUT_OF_ORDER,
                    "Step out of order",
                    f"step {request.step} is from the {when}: party B has applied step "
                    f"{state.step} and expects {state.step + 1}",
                    expected_step=state.step + 1,
                    applied_step=state.step,
                )
            if request.step > state.config.steps:
                raise ProblemError.run_state(
                    f"the run has {state.config.steps} steps; finish it instead",
                    applied_step=state.step,
                )
            batch = self._batch(state, request.step)
            positions = batch.positions
            if request.batch_digest != batch_digest([state.aligned[p] for p in positions]):
                self._metrics.steps.labels("rejected").inc()
                raise ProblemError(
                    409,
                    ProblemType.BATCH_MISMATCH,
                    "Batch mismatch",
                    f"the batch digest of step {request.step} does not match party B's batch; "
                    "the parties disagree on the aligned ids, seed or batch size",
                )
            expected = tuple(state.rows_per_sample * b for b in batch.chunk_sizes)
            if tuple(c.B for c in request.chunks) != expected:
                raise ProblemError.shape(
                    f"chunks of {[c.B for c in request.chunks]} rows, the run's schedule has "
                    f"{list(expected)} at step {request.step}"
                )
            z_tilde = self._dequantize(
                state, request.chunks, expected_rows=state.rows_per_sample * len(positions)
            )
            decoded = time.perf_counter()
            rows = state.label_rows[positions]
            outcome = self._train(state, z_tilde, rows, request.step)
            computed = time.perf_counter()
            response = codec.encode_step_response(
                codec.StepResponse(
                    step=request.step,
                    loss=outcome.loss,
                    metrics=outcome.metrics,
                    grad=outcome.grad.numpy(),
                ),
                grad_dtype=state.config.grad_dtype,
            )
            try:
                self._record_step(
                    state, request.step, sha, response, outcome, body, started, decoded, computed
                )
            except Exception:
                # The model moved but the step is not durable: forget the in-memory state so the
                # next call reloads the last checkpoint and party A rolls back to it.
                self._drop(run_id)
                raise
            state.step = request.step
            state.last_request_sha = sha
            state.last_response = response
            self._metrics.steps.labels("applied").inc()
            self._metrics.step_compute.observe(computed - decoded)
            return response

    def resume(self, caller: Caller, run_id: str, from_step: int) -> RunOut:
        """Roll the run back to one of its checkpoints (party A resumes from its own copy)."""
        state = self._state(caller, run_id)
        with state.lock, self._sessions() as session:
            run = self._owned(session, caller, run_id)
            if run.status != RunStatus.TRAINING.value:
                raise ProblemError.run_state(f"run is {run.status}; only training runs resume")
            checkpoint = store.load_checkpoint(session, run_id, from_step)
            if checkpoint is None:
                kept = store.checkpoint_steps(session, run_id)
                raise ProblemError(
                    409,
                    ProblemType.CHECKPOINT_NOT_FOUND,
                    "No such checkpoint",
                    f"no checkpoint at step {from_step}; party B keeps {kept}",
                    checkpoints=kept,
                )
            try:
                _restore(state.trainer, checkpoint)
            except ProblemError:
                self._drop(run_id)  # the model may be half loaded: reload it on next use
                raise
            state.step = checkpoint.step
            state.last_request_sha = checkpoint.request_sha256
            state.last_response = checkpoint.response
            store.forget_after(session, run_id, from_step)
            session.commit()
            log.info("run %s rolled back to step %d at party A's request", run_id, from_step)
            return self._run_out(session, run)

    # ============================================================== serving

    def evaluate(self, caller: Caller, run_id: str, body: bytes, split: str = "eval") -> bytes:
        """Forward only over all ``split`` samples (in aligned order); metrics stay at party B."""
        if split not in ("eval", "train"):
            raise ProblemError.invalid(f"split must be 'eval' or 'train', got {split!r}")
        state = self._state(caller, run_id)
        with state.lock:
            request = self._decode(codec.decode_evaluate_request, body)
            positions = state.positions_of(split)
            if len(positions) == 0:
                raise ProblemError.invalid(f"the run has no {split} samples")
            if request.ids_digest != batch_digest([state.aligned[p] for p in positions]):
                raise ProblemError(
                    409,
                    ProblemType.BATCH_MISMATCH,
                    "Evaluation ids mismatch",
                    f"the digest does not match party B's {len(positions)} {split} samples",
                )
            z_tilde = self._dequantize(
                state,
                request.chunks,
                expected_rows=state.rows_per_sample * len(positions),
                allow_raw=True,
            )
            rows = state.label_rows[positions]
            outcome = state.trainer.evaluate(
                z_tilde, self._labels.targets(rows), self._side(state, rows)
            )
            with self._sessions() as session:
                session.add(
                    store.EvalResult(
                        run_id=run_id,
                        step=state.step,
                        # "eval+raw": the same samples, sent unquantized (z, not z~)
                        split=split if _is_quantized(request.chunks) else f"{split}+raw",
                        n=outcome.n,
                        loss=_finite_or_none(outcome.loss),
                        metrics={k: _finite_or_none(v) for k, v in outcome.metrics.items()},
                    )
                )
                session.commit()
        response = codec.encode_evaluate_response(
            codec.EvaluateResponse(n=outcome.n, loss=outcome.loss, metrics=outcome.metrics)
        )
        self._metrics.bytes_received.labels("evaluate").inc(len(body))
        self._metrics.bytes_sent.labels("evaluate").inc(len(response))
        return response

    def predict(self, caller: Caller, run_id: str, body: bytes) -> bytes:
        """Forward only for the given (hashed) ids: serving after or during training."""
        state = self._state(caller, run_id)
        if state.rows_per_sample != 1:
            raise ProblemError.invalid(
                f"predict gives one score per sample; this run's model makes "
                f"{state.rows_per_sample} activation rows per sample (one per token)"
            )
        request = self._decode(codec.decode_predict_request, body)
        side: Tensor | None = None
        with state.lock:
            if state.config.use_side_features and state.trainer.model.side_features:
                rows = self._rows_of(state, request.ids)
                side = self._labels.side(rows)
            z_tilde = self._dequantize(
                state, request.chunks, expected_rows=request.rows, allow_raw=True
            )
            scores = state.trainer.predict(z_tilde, side)
        response = codec.encode_predict_response(
            codec.PredictResponse(ids=request.ids, scores=scores.numpy())
        )
        self._metrics.bytes_received.labels("predict").inc(len(body))
        self._metrics.bytes_sent.labels("predict").inc(len(response))
        return response

    def step_log(self, caller: Caller, run_id: str, start: int, limit: int) -> list[StepLogOut]:
        with self._sessions() as session:
            self._owned(session, caller, run_id)
            rows = session.scalars(
                select(store.StepLog)
                .where(store.StepLog.run_id == run_id, store.StepLog.step >= start)
                .order_by(store.StepLog.step)
                .limit(limit)
            ).all()
            return [StepLogOut.model_validate(r, from_attributes=True) for r in rows]

    def eval_results(self, caller: Caller, run_id: str) -> list[EvalResultOut]:
        with self._sessions() as session:
            self._owned(session, caller, run_id)
            rows = session.scalars(
                select(store.EvalResult)
                .where(store.EvalResult.run_id == run_id)
                .order_by(store.EvalResult.id)
            ).all()
            return [EvalResultOut.model_validate(r, from_attributes=True) for r in rows]

    # ============================================================== internals: state

    def _state(self, caller: Caller, run_id: str) -> _RunState:
        """The in-memory state of an aligned run the caller owns (loaded on first use)."""
        # A loading lock exists only while a run is being loaded (one per run id ever asked
        # for, unknown ones included, would grow without bound). Whoever holds it loads; the
        # others wait, and then start over: the run is in memory by then, or the load failed
        # and its lock was retired, so that exactly one of them takes a fresh lock and tries
        # again (never two loads of one run at once, never two states of one run).
        while True:
            with self._registry_lock:
                state = self._live.get(run_id) or self._finished.get(run_id)
                if state is not None:
                    break
                loading = self._loading.setdefault(run_id, threading.Lock())
            with loading:
                with self._registry_lock:
                    if self._loading.get(run_id) is not loading:
                        continue  # retired while we waited: look again
                try:
                    state = self._load(caller, run_id)
                finally:
                    with self._registry_lock:
                        del self._loading[run_id]
            break
        # Another token's run is indistinguishable from a missing one.
        if state.owner_id != caller.token_id:
            raise ProblemError.not_found(f"no run {run_id!r}")
        return state

    def _load(self, caller: Caller, run_id: str) -> _RunState:
        with self._sessions() as session:
            run = self._owned(session, caller, run_id)
            if run.status == RunStatus.CREATED.value or run.aligned_ids is None:
                raise ProblemError.run_state("run is not aligned yet: POST its alignment first")
            spec = RunCreate.model_validate(run.config)
            trainer = self._new_trainer(spec)
            checkpoint = store.load_checkpoint(session, run_id)
            if checkpoint is None:
                raise ProblemError(500, ProblemType.INTERNAL, "Run has no checkpoint", run_id)
            _restore(trainer, checkpoint)
            store.forget_after(session, run_id, checkpoint.step)
            session.commit()
            blob = run.aligned_ids
            aligned = [blob[i : i + 32] for i in range(0, len(blob), 32)]
            key_to_row = self._key_index(bytes.fromhex(run.alignment_key))
            missing = sum(1 for k in aligned if k not in key_to_row)
            if missing:
                raise ProblemError.run_state(
                    f"{missing} aligned ids are no longer in party B's label table; "
                    "the table changed since the run was aligned"
                )
            train_pos, eval_pos = split_train_eval(
                len(aligned), seed=spec.seed, eval_fraction=spec.eval_fraction
            )
            label_rows = np.array([key_to_row[k] for k in aligned], dtype=np.int64)
            state = _RunState(
                run_id=run_id,
                owner_id=run.owner_id,
                alignment_key=bytes.fromhex(run.alignment_key),
                config=spec,
                trainer=trainer,
                aligned=aligned,
                label_rows=label_rows,
                train_pos=train_pos,
                eval_pos=eval_pos,
                batches=self._batch_schedule(spec, label_rows[train_pos]),
                # targets are (n,), (n, tags) or (n * T,): T activation rows per sample
                rows_per_sample=int(self._labels.targets(label_rows[:1]).shape[0]),
                dequantizer=_dequantizer(spec),
                step=checkpoint.step,
                last_request_sha=checkpoint.request_sha256,
                last_response=checkpoint.response,
                finished=run.status == RunStatus.FINISHED.value,
            )
            finished = state.finished
        with self._registry_lock:
            if finished:
                self._finished[run_id] = state
                while len(self._finished) > _FINISHED_CACHE:
                    self._finished.popitem(last=False)
            else:
                self._live[run_id] = state
            self._metrics.live_runs.set(len(self._live) + len(self._finished))
        return state

    def _retire(self, run_id: str, state: _RunState) -> None:
        with self._registry_lock:
            self._live.pop(run_id, None)
            self._finished[run_id] = state
            while len(self._finished) > _FINISHED_CACHE:
                self._finished.popitem(last=False)
            self._metrics.live_runs.set(len(self._live) + len(self._finished))

    def _drop(self, run_id: str) -> None:
        with self._registry_lock:
            self._live.pop(run_id, None)
            self._finished.pop(run_id, None)
            self._metrics.live_runs.set(len(self._live) + len(self._finished))

    def _key_index(self, key: bytes) -> dict[bytes, int]:
        return {k: row for row, k in enumerate(hmac_ids(key, self._labels.ids))}

    def _rows_of(self, state: _RunState, hashed_hex: list[str]) -> np.ndarray:
        """Label-source rows of hashed ids (caller holds state.lock)."""
        if state.key_index is None:
            state.key_index = self._key_index(state.alignment_key)
        index = state.key_index
        rows, unknown = [], 0
        for h in hashed_hex:
            try:
                rows.append(index[bytes.fromhex(h)])
            except (ValueError, KeyError):
                unknown += 1
        if unknown:
            raise ProblemError(
                422,
                ProblemType.UNKNOWN_IDS,
                "Unknown ids",
                f"{unknown} of {len(hashed_hex)} ids are not hashed ids party B holds "
                "(expected hex HMAC-SHA256 under the run's alignment key)",
            )
        return np.array(rows, dtype=np.int64)

    # ============================================================== internals: checks

    def _owned(self, session: Session, caller: Caller, run_id: str) -> store.Run:
        run = session.get(store.Run, run_id)
        # Another token's run is indistinguishable from a missing one.
        if run is None or run.owner_id != caller.token_id:
            raise ProblemError.not_found(f"no run {run_id!r}")
        return run

    def _check_spec(self, spec: RunCreate) -> None:
        lim = self._limits
        if spec.model not in MODEL_NAMES:
            raise ProblemError.invalid(f"unknown model {spec.model!r}; known: {list(MODEL_NAMES)}")
        if model_task(spec.model) != self._labels.task:
            raise ProblemError.invalid(
                f"model {spec.model!r} is for {model_task(spec.model)} tasks but party B's "
                f"labels are for {self._labels.task}"
            )
        if spec.schedule.kind == "clients" and self._labels.groups is None:
            raise ProblemError.invalid(
                "the 'clients' schedule needs the client of every sample, and party B's "
                "labels have no client column"
            )
        rows_per_step = _rows_per_step(spec)
        checks = [
            ("batch_size", spec.batch_size, lim.max_batch),
            ("rows per step", rows_per_step, lim.max_batch),
            ("cut_dim", spec.cut_dim, lim.max_dim),
            ("steps", spec.steps, lim.max_steps),
            ("quantizer.q", spec.quantizer.q or 1, lim.max_q),
            ("quantizer.L", spec.quantizer.L or 1, lim.max_L),
        ]
        for name, value, limit in checks:
            if value > limit:
                raise ProblemError.limit(f"{name}={value} is over this server's limit {limit}")

    def _top_kwargs(self, spec: RunCreate) -> dict[str, Any]:
        """The run's top kwargs with the ones party B derives from its labels filled in, checked
        (kwargs and size) by a build on the meta device."""
        kwargs: dict[str, Any] = dict(spec.top)
        kwargs[_OUTPUT_KWARG[spec.model]] = self._labels.num_outputs
        if "side_features" in top_kwargs(spec.model):
            kwargs["side_features"] = self._labels.side_width if spec.use_side_features else 0
        self._check_top_sizes(_rows_per_step(spec), spec.cut_dim, kwargs)
        try:
            # Built on the meta device: validates the kwargs and counts parameters without
            # allocating, so {"hidden": [10**6, 10**6]} is refused instead of exhausting memory.
            with torch.device("meta"):
                model = build_top(spec.model, cut_dim=spec.cut_dim, **kwargs)
        except ValueError as exc:
            raise ProblemError.invalid(f"top model: {exc}") from None
        except (RuntimeError, OverflowError, TypeError):  # sizes that overflow 64 bits
            raise ProblemError.limit(
                f"the top model {spec.top} is too large to build; this server's limit is "
                f"{self._limits.max_top_params:,} parameters"
            ) from None
        params = sum(p.numel() for p in model.parameters())
        if params > self._limits.max_top_params:
            raise ProblemError.limit(
                f"the top model would have {params:,} parameters, over this server's limit "
                f"{self._limits.max_top_params:,}"
            )
        return kwargs

    def _check_top_sizes(self, rows: int, cut_dim: int, kwargs: dict[str, Any]) -> None:
        """Bound every size in the top kwargs before anything is built: a list of a million
        layers takes minutes to build even on the meta device, and a layer that fits the
        parameter limit can still need terabytes of activations for one step of ``rows``
        samples. (Every integer top kwarg of every model is a layer width or an output
        count.)"""
        lim = self._limits
        sizes: list[int] = []
        for name, value in kwargs.items():
            values = value if isinstance(value, list) else [value]
            if isinstance(value, list) and len(value) > lim.max_top_layers:
                raise ProblemError.limit(
                    f"top.{name} has {len(value)} entries, over this server's limit "
                    f"{lim.max_top_layers}"
                )
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int):
                    continue  # not a size; the build below judges it
                if v < 0:
                    raise ProblemError.invalid(f"top.{name}={v}: sizes cannot be negative")
                if v > lim.max_dim:
                    raise ProblemError.limit(
                        f"top.{name}={v} is over this server's limit {lim.max_dim} on a width"
                    )
                sizes.append(v)
        floats = rows * (cut_dim + sum(sizes))
        if floats > lim.max_top_activations:
            raise ProblemError.limit(
                f"the top model's activations for a step of {rows} rows would be {floats:,} "
                f"floats, over this server's limit {lim.max_top_activations:,}"
            )

    def _new_trainer(self, spec: RunCreate) -> TopTrainer:
        return TopTrainer(
            model=spec.model,
            top_kwargs=self._top_kwargs(spec),
            cut_dim=spec.cut_dim,
            optimizer=spec.optimizer.model_dump(),
            task=self._labels.task,
            seed=spec.seed,
            accuracy_excludes=self._labels.accuracy_excludes,
        )

    def _batch_schedule(self, spec: RunCreate, train_rows: np.ndarray) -> BatchSchedule:
        """The run's schedule over its train samples (``train_rows``: their label rows)."""
        if spec.schedule.kind == "shuffle":
            return make_schedule(n=len(train_rows), batch_size=spec.batch_size, seed=spec.seed)
        groups = self._labels.groups
        if groups is None:  # checked at creation; party B restarted without the column
            raise ProblemError.run_state(
                "this run samples by client, and party B's labels have no client column "
                "now: restart it with the label table's client column configured"
            )
        return make_schedule(
            n=len(train_rows),
            batch_size=spec.batch_size,
            seed=spec.seed,
            clients=[groups[r] for r in train_rows.tolist()],
            clients_per_step=spec.schedule.clients_per_step,
        )

    @staticmethod
    def _batch(state: _RunState, step: int) -> StepBatch:
        """Step ``step``'s rows as positions into the aligned list, and its chunk sizes."""
        batch = state.batches.batch(step)
        return StepBatch(state.train_pos[batch.positions], batch.chunk_sizes)

    def _decode(self, decoder: Any, body: bytes) -> Any:
        try:
            return decoder(body, limits=self._decode_limits)
        except codec.CodecError as exc:
            raise ProblemError(
                400, ProblemType.MALFORMED_MESSAGE, "Malformed message", str(exc)
            ) from None

    def _dequantize(
        self,
        state: _RunState,
        chunks: Sequence[codec.Activations],
        *,
        expected_rows: int,
        allow_raw: bool = False,
    ) -> Tensor:
        """Concatenate the chunks' z~ into (rows, d), checking they fit the run's config.

        ``allow_raw``: a FedLite run also takes raw activations (evaluate and predict: the
        model without compression; training steps must be quantized as configured)."""
        spec = state.config
        rows = sum(c.B for c in chunks)
        if rows != expected_rows:
            raise ProblemError.shape(f"{rows} activation rows, expected {expected_rows}")
        if chunks[0].d != spec.cut_dim:
            raise ProblemError.shape(
                f"activations have d={chunks[0].d}, the run has {spec.cut_dim}"
            )
        parts = []
        for chunk in chunks:
            if isinstance(chunk, codec.RawActivations):
                if state.dequantizer is not None and not allow_raw:
                    raise ProblemError.shape("raw activations sent to a FedLite (pq) run")
                parts.append(torch.from_numpy(chunk.activations))
                continue
            if state.dequantizer is None:
                raise ProblemError.shape("quantized activations sent to a raw (SplitFed) run")
            cfg = state.dequantizer.config
            if (chunk.q, chunk.R, chunk.L) != (cfg.q, cfg.R, cfg.L):
                raise ProblemError.shape(
                    f"quantizer (q, R, L) = {(chunk.q, chunk.R, chunk.L)}, "
                    f"the run has {(cfg.q, cfg.R, cfg.L)}"
                )
            code = PQCode(
                codebook=torch.from_numpy(chunk.codebook),
                codewords=torch.from_numpy(chunk.codewords),
            )
            parts.append(state.dequantizer.decode(code))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _side(self, state: _RunState, rows: np.ndarray) -> Tensor | None:
        return self._labels.side(rows) if state.trainer.model.side_features else None

    def _train(self, state: _RunState, z_tilde: Tensor, rows: np.ndarray, step: int) -> StepOutcome:
        try:
            return state.trainer.train_step(
                z_tilde,
                self._labels.targets(rows),
                self._side(state, rows),
                dropout_seed=step_seed(state.config.seed, step, "dropout-top"),
            )
        except DivergedError as exc:
            raise ProblemError(
                422,
                ProblemType.TRAINING_DIVERGED,
                "Training diverged",
                f"step {step}: {exc}; the step was not applied (lower the learning rates?)",
                applied_step=state.step,
            ) from None

    def _record_step(
        self,
        state: _RunState,
        step: int,
        sha: bytes,
        response: bytes,
        outcome: StepOutcome,
        body: bytes,
        started: float,
        decoded: float,
        computed: float,
    ) -> None:
        """Log the step and, at checkpoint steps, save a checkpoint: one transaction."""
        with self._sessions() as session:
            session.add(
                store.StepLog(
                    run_id=state.run_id,
                    step=step,
                    loss=_finite_or_none(outcome.loss),
                    accuracy=_finite_or_none(outcome.metrics.get("accuracy", float("nan"))),
                    bytes_in=len(body),
                    bytes_out=len(response),
                    decode_ms=1000 * (decoded - started),
                    compute_ms=1000 * (computed - decoded),
                    total_ms=1000 * (time.perf_counter() - started),
                )
            )
            if step % state.config.checkpoint_interval == 0 or step == state.config.steps:
                model_state, optimizer_state = state.trainer.state()
                store.save_checkpoint(
                    session,
                    run_id=state.run_id,
                    step=step,
                    model_state=model_state,
                    optimizer_state=optimizer_state,
                    request_sha256=sha,
                    response=response,
                    keep=self._keep,
                )
            session.commit()
        self._metrics.bytes_received.labels("step").inc(len(body))
        self._metrics.bytes_sent.labels("step").inc(len(response))

    # ============================================================== internals: views

    def _run_out(self, session: Session, run: store.Run) -> RunOut:
        with self._registry_lock:
            live = self._live.get(run.id) or self._finished.get(run.id)
        checkpoints = store.checkpoint_steps(session, run.id)
        step = live.step if live is not None else (checkpoints[-1] if checkpoints else 0)
        alignment = None
        if run.aligned_ids is not None and run.train_size is not None:
            alignment = AlignmentInfo(
                aligned=len(run.aligned_ids) // 32,
                train=run.train_size,
                eval=run.eval_size or 0,
            )
        return RunOut(
            id=run.id,
            name=run.name,
            status=RunStatus(run.status),
            config=RunCreate.model_validate(run.config),
            created_at=run.created_at,
            step=step,
            checkpoints=checkpoints,
            alignment_key=run.alignment_key,
            alignment=alignment,
            num_classes=run.num_classes,
            side_features=run.side_features,
        )

    @staticmethod
    def _alignment_out(run: store.Run, aligned: list[bytes]) -> AlignmentOut:
        return AlignmentOut(
            intersection=[k.hex() for k in aligned],
            train=run.train_size or 0,
            eval=run.eval_size or 0,
        )


def _restore(trainer: TopTrainer, checkpoint: store.Checkpoint) -> None:
    """Load a checkpoint into ``trainer``; a row that is not a plain state dict is refused.

    The bytes come from our own database, but a database file can be tampered with or damaged:
    ``state_from_bytes`` unpickles with ``weights_only=True``, so a crafted row cannot run code,
    and it fails here with a clear error instead of loading.
    """
    try:
        trainer.load_state(checkpoint.model_state, checkpoint.optimizer_state)
    except Exception as exc:
        log.error(
            "checkpoint of run %s at step %d is unreadable: %s",
            checkpoint.run_id,
            checkpoint.step,
            exc,
        )
        raise ProblemError(
            500,
            ProblemType.INTERNAL,
            "Checkpoint unreadable",
            f"party B's checkpoint at step {checkpoint.step} of this run does not load as a "
            "plain state dict (damaged or tampered database); the operator must restore it",
        ) from None


def _is_quantized(chunks: Sequence[codec.Activations]) -> bool:
    return not any(isinstance(c, codec.RawActivations) for c in chunks)


def _dequantizer(spec: RunCreate) -> GroupedProductQuantizer | None:
    q = spec.quantizer
    if q.mode == "raw":
        return None
    assert q.q is not None and q.L is not None
    return GroupedProductQuantizer(spec.cut_dim, PQConfig(q=q.q, L=q.L, R=q.R))


def _finite_or_none(value: float) -> float | None:
    return value if np.isfinite(value) else None
