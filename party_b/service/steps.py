"""Exactly-once training steps, each one a transaction.

Party B keeps, per run, the last applied step t, the SHA-256 of its request body and its
response bytes. A request for step t again (party A retrying after a lost response) gets the
identical stored bytes back, without a second update; any other step than t+1 gets 409
``step-out-of-order`` naming the expected step (over HTTP a step that overtook its
predecessor first waits for it, on the event loop: ``turns.py``). Every
``checkpoint_interval`` steps the top model, optimizer state and that step's request hash and
response are written in one transaction *before* the response leaves, and the newest few
checkpoints are kept. After a
crash party B restarts from its newest checkpoint c; party A, which keeps matching
checkpoints, either resends step c (answered from the stored response) or rolls both parties
back to a common checkpoint with ``resume``.

One step, in order (``Steps.step``)::

    request = activations.decode(body)                400 if malformed
    replay or order check                             stored answer, or 409
    batch   = state.batch(t); check digest, chunks    409 / 422
    z~      = activations.dequantize(request.chunks)  422 if they do not fit the run
    outcome, reply = protected_step(z~, labels, ...)  422 if it diverges     } no state
    answer  = answer.step_response(reply)             the bytes party A gets } changed yet
    commit: trainer.apply_step(), log (+ checkpoint), state.commit(t, answer)

Everything that can fail runs before the commit, which is the only place state changes; a
failure inside the commit (the database) rolls the in-memory state back to the newest
checkpoint (the run is dropped from memory and reloaded), and party A rolls back with it.
The commit first checks that this copy still holds the run's lease (``ownership.fence``):
one that another replica took over meanwhile applies nothing, and the step goes once more
on a fresh load (``once_more_if_moved``).
"""

import hashlib
import logging
import time
from dataclasses import dataclass

from api_schemas import ProblemType, RunOut, RunStatus
from party_b import store
from party_b.errors import ProblemError
from party_b.privacy.run import protected_step
from party_b.service import activations, answer
from party_b.service.context import ServiceContext
from party_b.service.fusion import one_party_route
from party_b.service.loader import restore
from party_b.service.ownership import once_more_if_moved
from party_b.service.runstate import Caller, RunState, owned_row
from party_b.service.views import finite_or_none, run_out
from party_b.top import DivergedError, StepOutcome
from shared import codec
from shared.schedule import batch_digest, step_seed

__all__ = ["Steps"]

log = logging.getLogger("fedlite.party_b")


@dataclass(frozen=True)
class _Computed:
    """A step computed and answered, not yet applied: what the commit needs."""

    step: int
    request_sha: bytes
    outcome: StepOutcome
    response: bytes
    body_bytes: int
    started: float  # perf_counter() marks: received, decoded, computed
    decoded: float
    computed: float


class Steps:
    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    def step(self, caller: Caller, run_id: str, body: bytes) -> bytes:
        """Apply one training step exactly once; returns the encoded StepResponse."""
        return once_more_if_moved(lambda: self._step(caller, run_id, body))

    def _step(self, caller: Caller, run_id: str, body: bytes) -> bytes:
        started = time.perf_counter()
        state = self._ctx.cache.owned(caller, run_id)
        if state.config.parties is not None:
            one_party_route(state.config, "sends its steps")
        with state.lock:
            if state.finished:
                raise ProblemError.run_state("run is finished; it takes no more steps")
            request = activations.decode(codec.decode_step_request, body, self._ctx.decode_limits)
            sha = hashlib.sha256(body).digest()
            stored = self._replayed(state, request.step, sha)
            if stored is not None:
                return stored
            computed = self._compute(state, request, sha, started, len(body))
            self._commit(state, computed)
            return computed.response

    def resume(self, caller: Caller, run_id: str, from_step: int) -> RunOut:
        """Roll the run back to one of its checkpoints (party A resumes from its own copy)."""
        return once_more_if_moved(lambda: self._resume(caller, run_id, from_step))

    def _resume(self, caller: Caller, run_id: str, from_step: int) -> RunOut:
        state = self._ctx.cache.owned(caller, run_id)
        one_party_route(state.config, "rolls the run back")
        return self.roll_back(caller, run_id, state, from_step)

    def roll_back(self, caller: Caller, run_id: str, state: RunState, from_step: int) -> RunOut:
        """``resume`` of any run the caller owns (a run with parties: from a party route)."""
        with state.lock, self._ctx.sessions() as session:
            run = owned_row(session, caller, run_id)
            if run.status != RunStatus.TRAINING.value:
                raise ProblemError.run_state(f"run is {run.status}; only training runs resume")
            checkpoint = store.load_checkpoint(session, run_id, from_step)
            if checkpoint is None:
                kept = store.checkpoint_steps(session, run_id)
                raise ProblemError(
                    ProblemType.CHECKPOINT_NOT_FOUND,
                    f"no checkpoint at step {from_step}; party B keeps {kept}",
                    checkpoints=kept,
                )
            try:
                self._ctx.ownership.fence(session, state)
                restore(state.trainer, checkpoint)
                store.forget_after(session, run_id, from_step)
                session.commit()
            except BaseException:
                # the model may be half loaded, or loaded while the database kept the later
                # steps: forget it, and the next use reloads the newest checkpoint
                self._ctx.cache.drop(run_id, state)
                raise
            state.commit(checkpoint.step, checkpoint.request_sha256, checkpoint.response)
            log.info("run %s rolled back to step %d at party A's request", run_id, from_step)
            return run_out(session, run, state)

    # ------------------------------------------------------------------ before the commit

    def _replayed(self, state: RunState, step: int, sha: bytes) -> bytes | None:
        """The stored answer of a resent step; 409 for any step but the next one."""
        if step == state.step and state.last_response is not None:
            if sha != state.last_request_sha:
                self._ctx.metrics.steps.labels("rejected").inc()
                raise ProblemError(
                    ProblemType.STEP_REPLAY_MISMATCH,
                    f"step {step} was applied with a different request; "
                    "party A's state diverged from party B's",
                    applied_step=state.step,
                )
            self._ctx.metrics.steps.labels("replayed").inc()
            return state.last_response
        if step != state.step + 1:
            self._ctx.metrics.steps.labels("rejected").inc()
            when = "future" if step > state.step else "past"
            raise ProblemError(
                ProblemType.STEP_OUT_OF_ORDER,
                f"step {step} is from the {when}: party B has applied step {state.step} and "
                f"expects {state.step + 1}",
                expected_step=state.step + 1,
                applied_step=state.step,
            )
        if step > state.config.steps:
            raise ProblemError.run_state(
                f"the run has {state.config.steps} steps; finish it instead",
                applied_step=state.step,
            )
        return None

    def _compute(
        self,
        state: RunState,
        request: codec.StepRequest,
        sha: bytes,
        started: float,
        body_bytes: int,
    ) -> _Computed:
        """The step's outcome and encoded answer; changes no state (checks first: 409/422)."""
        batch = state.batch(request.step)
        if request.batch_digest != batch_digest([state.aligned[p] for p in batch.positions]):
            self._ctx.metrics.steps.labels("rejected").inc()
            raise ProblemError(
                ProblemType.BATCH_MISMATCH,
                f"the batch digest of step {request.step} does not match party B's batch; "
                "the parties disagree on the aligned ids, seed or batch size",
            )
        expected = tuple(state.rows_per_sample * b for b in batch.chunk_sizes)
        if tuple(c.B for c in request.chunks) != expected:
            raise ProblemError.shape(
                f"chunks of {[c.B for c in request.chunks]} rows, the run's schedule has "
                f"{list(expected)} at step {request.step}"
            )
        z_tilde = activations.dequantize(state, request.chunks, expected_rows=sum(expected))
        decoded = time.perf_counter()
        rows = state.label_rows[batch.positions]
        side = self._ctx.labels.side(rows) if state.trainer.model.side_features else None
        try:
            # the run's label-privacy policy: what party A may learn of the labels
            outcome, reply = protected_step(
                state.trainer,
                z_tilde,
                self._ctx.labels.targets(rows),
                side,
                rows=rows,
                labels=self._ctx.labels,
                step=request.step,
                dropout_seed=step_seed(state.config.seed, request.step, "dropout-top"),
                privacy=state.privacy,
            )
        except DivergedError as exc:
            raise ProblemError(
                ProblemType.TRAINING_DIVERGED,
                f"step {request.step}: {exc}; the step was not applied (lower the learning rates?)",
                applied_step=state.step,
            ) from None
        computed = time.perf_counter()
        # the reply: the defended (rows, d) d loss / d z~, and what the metrics policy shows
        response = answer.step_response(
            step=request.step,
            loss=reply.loss,
            step_metrics=reply.metrics,
            grad=reply.grad.numpy(),
            downlink=answer.run_downlink(state.config.downlink),
            run_seed=state.config.seed,
            metrics=self._ctx.metrics,
        )
        return _Computed(
            request.step, sha, outcome, response, body_bytes, started, decoded, computed
        )

    # ------------------------------------------------------------------ the commit

    def _commit(self, state: RunState, c: _Computed) -> None:
        """Apply the step and make it durable; the only place a step changes state."""
        state.trainer.apply_step()
        try:
            self._record(state, c)
        except BaseException:
            # The model moved but the step is not durable: forget the in-memory state so the
            # next call reloads the last checkpoint and party A rolls back to it.
            self._ctx.cache.drop(state.run_id, state)
            raise
        state.commit(c.step, c.request_sha, c.response)
        self._ctx.metrics.steps.labels("applied").inc()
        self._ctx.metrics.step_compute.observe(c.computed - c.decoded)
        self._ctx.metrics.bytes_received.labels("step").inc(c.body_bytes)
        self._ctx.metrics.bytes_sent.labels("step").inc(len(c.response))

    def _record(self, state: RunState, c: _Computed) -> None:
        """Log the step and, at checkpoint steps, save a checkpoint: one transaction."""
        with self._ctx.sessions() as session:
            self._ctx.ownership.fence(session, state)  # 503 run-moved if no longer ours
            store.log_step(
                session,
                run_id=state.run_id,
                step=c.step,
                loss=finite_or_none(c.outcome.loss),
                accuracy=finite_or_none(c.outcome.metrics.get("accuracy", float("nan"))),
                bytes_in=c.body_bytes,
                bytes_out=len(c.response),
                decode_ms=1000 * (c.decoded - c.started),
                compute_ms=1000 * (c.computed - c.decoded),
                total_ms=1000 * (time.perf_counter() - c.started),
            )
            if c.step % state.config.checkpoint_interval == 0 or c.step == state.config.steps:
                model_state, optimizer_state = state.trainer.state()
                store.save_checkpoint(
                    session,
                    run_id=state.run_id,
                    step=c.step,
                    model_state=model_state,
                    optimizer_state=optimizer_state,
                    request_sha256=c.request_sha,
                    response=c.response,
                    keep=self._ctx.checkpoints_kept,
                    interval=state.config.checkpoint_interval,
                )
            session.commit()
