"""Exactly-once training steps of a run with N >= 1 feature parties, each one a transaction.

Party B keeps, per run, the last applied step t and every feature party's request digest and
answer of it. A party's request for step t again (a retry after a lost answer) gets its own
stored answer, byte for byte, without a second update; a request for t with another message
is 409 ``step-replay-mismatch``; any step but t+1 is 409 ``step-out-of-order`` naming the
expected step (over HTTP, a step up to 16 ahead first waits for its predecessor:
``meetings``). Every ``checkpoint_interval`` steps the top model, optimizer state and that
step's digests and answers are written in one transaction *before* any answer leaves. After
a crash party B restarts from its newest checkpoint c; the parties, which keep matching
checkpoints, either resend step c (answered from the stored answers) or roll the run back to
a common checkpoint with ``resume``.

One step, in order::

    check, each party's request on its own (``Steps.check``):
        the run aligned and not finished                 409 run-state
        request = decode(body)                           400
        replay, or order                                 its stored answer, or 409
        digest and chunks of batch(t)                    409 / 422
        z~_p = dequantize(chunks), party p's quantizer   422
    apply, once every party's part is in and step t-1 applied (``Steps.apply``):
        Z = fuse(z~_1, ..., z~_N)                        the identity for one party
        outcome, reply = protected_step(Z, labels, ...)  422 if it diverges    } no state
        answers = each party's slice of the reply's      the party's downlink  } changed yet
                  gradient, encoded
        commit: trainer.apply_step(), log (+ checkpoint), state.commit(t, digests, answers)

Everything that can fail runs before the commit, the only place state changes; a failure
inside the commit (the database) forgets the run in memory (the next request reloads the
newest checkpoint), and the parties roll back with it. The commit first checks that this
copy still holds the run's lease (``ownership.fence``): one that another replica took over
meanwhile applies nothing, and the step goes once more on a fresh load
(``once_more_if_moved``).

A request's identity is its canonical digest (docs/PROTOCOL.md section 1: the same fields in
another key order are the same message); a checkpoint written before canonical digests
identified steps holds the SHA-256 of the bytes, which a resend of those bytes matches too.
"""

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from torch import Tensor

from api_schemas import ProblemType, RunOut, RunStatus
from party_b import store
from party_b.errors import ProblemError
from party_b.privacy.run import protected_step
from party_b.service import activations, answer
from party_b.service.context import ServiceContext
from party_b.service.fusion import fuse, slices
from party_b.service.loader import restore
from party_b.service.meetings import Agenda, Ticket, at_once, now
from party_b.service.ownership import Applied, once_more_if_moved
from party_b.service.runstate import Caller, RunState, owned_row, party_of
from party_b.service.views import finite_or_none, run_out
from party_b.store import parties as party_store
from party_b.top import DivergedError, StepOutcome
from shared import codec
from shared.schedule import batch_digest, step_seed

__all__ = ["MAX_AHEAD", "Part", "Steps"]

log = logging.getLogger("fedlite.party_b")

# Party A's largest pipeline_depth (party_a/config.py): a step further ahead cannot have been
# sent beside its predecessor, so it is refused at once.
MAX_AHEAD = 16


@dataclass(frozen=True)
class Part:
    """One feature party's checked request for a step."""

    z: Tensor  # (rows, d_p) its z~
    digest: bytes  # its canonical digest: the request's identity
    body: bytes  # as sent (a checkpoint from before canonical digests holds its SHA-256)
    checked_seconds: float  # decoding and checking it


class Steps:
    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    def check(self, caller: Caller, run_id: str, body: bytes) -> bytes | Ticket:
        """One party's step request, checked on its own (PROTOCOL.md 10.5, 1-6): its stored
        answer if the step was applied with it, the answer at once when the step needs no
        other party and its predecessor is applied, else its ticket to the step's meeting."""
        started = time.perf_counter()
        state = self._ctx.cache.owned(caller, run_id)
        index = party_of(state.plan, run_id, caller)
        if state.finished:
            raise ProblemError.run_state("run is finished; it takes no more steps")
        request = activations.decode(codec.decode_step_request, body, self._ctx.decode_limits)
        digest, t = codec.canonical_digest(body), request.step
        with state.lock:
            stored = self._stored_answer(state, index, t, digest, body)
            applied, behind = state.step, state.behind
        if stored is not None:
            return stored
        self._in_order(state, t, applied, behind)
        z = self._activations(state, index, request)
        part = Part(z, digest, body, time.perf_counter() - started)
        name = state.plan.names[index]
        agenda = self._agenda(caller, run_id, state, t)
        return at_once(Ticket(("step", str(t)), name, part, digest, agenda), bytes)

    def step(self, caller: Caller, run_id: str, body: bytes) -> bytes:
        """``check`` for a caller that cannot wait (party A in party B's process, a
        benchmark): a step ahead of its predecessor is 409 ``step-out-of-order`` at once."""
        return now(self.check(caller, run_id, body))

    def apply(
        self, caller: Caller, run_id: str, t: int, parts: dict[str, Part]
    ) -> dict[str, object]:
        """Apply step ``t`` once, with every party's part; each party's answer (or, for a
        party whose part the applied step's request was not, 409 step-replay-mismatch)."""
        return once_more_if_moved(lambda: self._apply(caller, run_id, t, parts))

    def resume(self, caller: Caller, run_id: str, from_step: int) -> RunOut:
        """Roll the whole run back to one of its checkpoints (a party resumes from its own
        copy; every other party follows, PROTOCOL.md 12.7)."""
        return once_more_if_moved(lambda: self._resume(caller, run_id, from_step))

    # ------------------------------------------------------------------ before the commit

    def _stored_answer(
        self, state: RunState, index: int, t: int, digest: bytes, body: bytes
    ) -> bytes | None:
        """The stored answer of a step sent again by party ``index`` (``digest``: of its
        request, ``body``); None for another step (caller holds state.lock). 409 when the
        step was applied with another request."""
        if t != state.step:
            return None
        stored = store.unpack_answers(
            state.last_request_sha, state.last_response, len(state.plan.names)
        )
        if stored is None:
            return None
        applied_with, answered = stored[index]
        if applied_with != digest and applied_with != hashlib.sha256(body).digest():
            self._ctx.metrics.steps.labels("rejected").inc()
            raise _replay_mismatch(state, index, t)
        self._ctx.metrics.steps.labels("replayed").inc()
        return answered

    def _in_order(self, state: RunState, t: int, applied: int, behind: bool) -> None:
        """409 unless ``t`` is the next step or (in a run that is not behind, where it may
        wait for its predecessor) up to MAX_AHEAD steps ahead; 409 past the run's last step."""
        # behind: loaded from a checkpoint older than steps the run had applied (a crash, a
        # takeover); the parties are past it and roll back, so no step waits for another
        ahead = 1 if behind else MAX_AHEAD
        if not applied < t <= applied + ahead:
            self._ctx.metrics.steps.labels("rejected").inc()
            raise ProblemError(
                ProblemType.STEP_OUT_OF_ORDER,
                f"step {t} is from the {'future' if t > applied else 'past'}: party B has "
                f"applied step {applied} and expects {applied + 1}",
                expected_step=applied + 1,
                applied_step=applied,
            )
        if t > state.config.steps:
            raise ProblemError.run_state(
                f"the run has {state.config.steps} steps; finish it instead", applied_step=applied
            )

    def _activations(self, state: RunState, index: int, request: codec.StepRequest) -> Tensor:
        """Party ``index``'s z~ of the step, after the digest (409) and shape (422) checks."""
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
        return activations.dequantize(state.plan, index, request.chunks, rows=sum(expected))

    def _agenda(self, caller: Caller, run_id: str, state: RunState, t: int) -> Agenda:
        def applied() -> int | None:
            live = self._ctx.cache.peek_owned(caller, run_id)
            return live.step if live is not None else None

        def ready() -> bool:  # (a run no longer in memory: the computation loads it)
            step = applied()
            return step is None or step >= t - 1

        return Agenda(
            what=f"step {t}",
            parties=state.plan.names,
            compute=partial(self.apply, caller, run_id, t),
            wait=self._ctx.wait_of(state.plan),
            ready=ready,
            applied=applied,
            step=t,
        )

    # ------------------------------------------------------------------ the step

    def _apply(
        self, caller: Caller, run_id: str, t: int, parts: dict[str, Part]
    ) -> dict[str, object]:
        state = self._ctx.cache.owned(caller, run_id)
        names = state.plan.names
        with state.lock:
            if state.finished:
                raise ProblemError.run_state("run is finished; it takes no more steps")
            if state.step == t:  # applied meanwhile (a resend took another way in)
                return {p: self._answered(state, names.index(p), t, parts[p]) for p in parts}
            if state.step != t - 1:  # rolled back meanwhile
                raise ProblemError(
                    ProblemType.STEP_OUT_OF_ORDER,
                    f"party B has applied step {state.step} and expects {state.step + 1}",
                    expected_step=state.step + 1,
                    applied_step=state.step,
                )
            started = time.perf_counter()
            outcome, answers = self._answers(state, t, [parts[p].z for p in names])
            computed = time.perf_counter() - started
            applied = (t, *store.pack_answers([parts[p].digest for p in names], answers))
            self._commit(state, applied, outcome, [parts[p] for p in names], answers, computed)
        self._count([parts[p] for p in names], answers, computed)
        return dict(zip(names, answers, strict=True))

    def _answered(self, state: RunState, index: int, t: int, part: Part) -> object:
        try:
            stored = self._stored_answer(state, index, t, part.digest, part.body)
        except ProblemError as refused:
            return refused
        return stored if stored is not None else _replay_mismatch(state, index, t)

    def _answers(
        self, state: RunState, t: int, zs: Sequence[Tensor]
    ) -> tuple[StepOutcome, list[bytes]]:
        """The fused step's outcome and every party's encoded answer; changes no state."""
        plan = state.plan
        rows = state.label_rows[state.batch(t).positions]
        side = self._ctx.labels.side(rows) if state.trainer.model.side_features else None
        try:
            # the run's label-privacy policy: what the parties may learn of the labels
            outcome, reply = protected_step(
                state.trainer,
                fuse(zs, plan.fusion),
                self._ctx.labels.targets(rows),
                side,
                rows=rows,
                labels=self._ctx.labels,
                step=t,
                dropout_seed=step_seed(state.config.seed, t, "dropout-top"),
                privacy=state.privacy,
            )
        except DivergedError as exc:
            raise ProblemError(
                ProblemType.TRAINING_DIVERGED,
                f"step {t}: {exc}; the step was not applied (lower the learning rates?)",
                applied_step=state.step,
            ) from None
        # each party's slice of the defended (rows, D) d loss / d Z, and what the policy shows
        grads = slices(reply.grad, plan.widths, plan.fusion)
        answers = [
            answer.step_response(
                step=t,
                loss=reply.loss,
                step_metrics=reply.metrics,
                grad=grad.contiguous().numpy(),
                downlink=plan.downlinks[i],
                run_seed=state.config.seed,
                metrics=self._ctx.metrics,
                purpose=plan.downlink_purpose(name),
            )
            for i, (name, grad) in enumerate(zip(plan.names, grads, strict=True))
        ]
        return outcome, answers

    # ------------------------------------------------------------------ the commit

    def _commit(
        self,
        state: RunState,
        applied: Applied,
        outcome: StepOutcome,
        parts: list[Part],
        answers: list[bytes],
        computed: float,
    ) -> None:
        """Apply the step and make it durable; the only place a step changes state.
        ``computed``: the seconds its computation took."""
        started = time.perf_counter()
        state.trainer.apply_step()
        try:
            self._record(state, applied, outcome, (parts, answers), (computed, started))
        except BaseException:
            # The model moved but the step is not durable: forget the in-memory state so the
            # next call reloads the last checkpoint and the parties roll back to it.
            self._ctx.cache.drop(state.run_id, state)
            raise
        state.commit(*applied)

    def _record(
        self,
        state: RunState,
        applied: Applied,
        outcome: StepOutcome,
        traffic: tuple[list[Part], list[bytes]],
        times: tuple[float, float],
    ) -> None:
        """The step log (per party too, in a run with parties) and, at checkpoint steps, a
        checkpoint: one transaction. ``traffic``: every party's part and answer; ``times``:
        the computation's seconds and when the commit started. The log's times: the slowest
        party's check, the computation and the commit (party B's own time, not a party's
        wait for the others)."""
        t, (parts, answers), (computed, started) = applied[0], traffic, times
        checked = max(p.checked_seconds for p in parts)
        with self._ctx.transaction() as connection:
            self._ctx.ownership.fence(connection, state)  # 503 run-moved if no longer ours
            store.log_step(
                connection,
                run_id=state.run_id,
                step=t,
                loss=finite_or_none(outcome.loss),
                accuracy=finite_or_none(outcome.metrics.get("accuracy", float("nan"))),
                bytes_in=sum(len(p.body) for p in parts),
                bytes_out=sum(len(a) for a in answers),
                decode_ms=1000 * checked,
                compute_ms=1000 * computed,
                total_ms=1000 * (checked + computed + time.perf_counter() - started),
            )
            if state.plan.named:
                each = zip(state.plan.names, parts, answers, strict=True)
                party_store.log_party_traffic(
                    connection, state.run_id, t, [(n, len(p.body), len(a)) for n, p, a in each]
                )
            if t % state.config.checkpoint_interval == 0 or t == state.config.steps:
                self._ctx.ownership.save(connection, state, applied)

    def _count(self, parts: list[Part], answers: list[bytes], seconds: float) -> None:
        metrics = self._ctx.metrics
        metrics.steps.labels("applied").inc()
        metrics.step_compute.observe(seconds)
        metrics.bytes_received.labels("step").inc(sum(len(p.body) for p in parts))
        metrics.bytes_sent.labels("step").inc(sum(len(a) for a in answers))

    # ------------------------------------------------------------------ rolling back

    def _resume(self, caller: Caller, run_id: str, from_step: int) -> RunOut:
        state = self._ctx.cache.owned(caller, run_id)
        party_of(state.plan, run_id, caller)
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
            log.info(
                "run %s rolled back to step %d at %s's request", run_id, from_step, caller.name
            )
            return run_out(session, run, state, self._ctx.labels)


def _replay_mismatch(state: RunState, index: int, t: int) -> ProblemError:
    whose = "" if len(state.plan.names) == 1 else f" of party {state.plan.names[index]!r}"
    return ProblemError(
        ProblemType.STEP_REPLAY_MISMATCH,
        f"step {t} was applied with a different request{whose}; its state diverged from party B's",
        applied_step=state.step,
    )
