"""The room of runs with several feature parties (docs/PROTOCOL.md section 12): the work
behind the party routes, in worker threads.

Every request is first *checked* on its own (``check_*``): what would be refused is refused
at once, in the order of its one-party counterpart (400 malformed, 409 order or digest, 422
shapes); a replayed step gets its stored answer. What passes becomes a ``Ticket``: a part
for a meeting (``party_b.service.meetings``) and the meeting's ``Agenda``, whose ``compute``
runs here once every party's part is in:

    _align      the common keys of every party's alignment; split; start the run
    _step       fuse the parties' z~, one protected step of the top model, each party's
                slice of the gradient in its own downlink, commit (log, traffic,
                checkpoint with every party's sha and answer), as steps.py does for one
    _evaluate   fuse, evaluate, log once
    _predict    fuse, predict
    _finish     the run is finished (once every party has applied the last step)

A party token's scope names the run and the party; the run's owner is the caller the rest
of party B knows (``Caller``), so the cache, its ownership check and the store see a run
with parties as any other.
"""

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from torch import Tensor

from api_schemas import AlignmentOut, ProblemType, PsiInfo, RunCreate, RunOut, RunStatus
from party_b import store
from party_b.errors import ProblemError
from party_b.party_tokens import PartyScope
from party_b.privacy.run import protected_step
from party_b.service import activations, answer
from party_b.service.alignment import Alignment
from party_b.service.context import ServiceContext
from party_b.service.fusion import PartyPlan, fuse, pack_answers, slices, unpack_answers
from party_b.service.meetings import Agenda, Key
from party_b.service.runs import Runs
from party_b.service.runstate import Caller, RunState, owned_row
from party_b.service.serving import Serving, out_of_range
from party_b.service.steps import Steps
from party_b.service.turns import MAX_AHEAD
from party_b.service.views import alignment_out, finite_or_none, run_out
from party_b.store import parties as party_store
from party_b.top import DivergedError, StepOutcome
from shared import codec
from shared.alignment import hmac_ids, order_by_raw_id
from shared.schedule import batch_digest, step_seed

__all__ = ["Parties", "Ticket"]

_PLANS_KEPT = 256


@dataclass(frozen=True)
class Ticket:
    """A checked request: its part of the meeting ``key``, and the meeting's agenda."""

    key: Key
    part: Any
    sha: bytes  # the request's identity: the same bytes again join the same part
    agenda: Agenda


@dataclass(frozen=True)
class _StepPart:
    z: Tensor  # (rows, d_p) this party's z~
    sha: bytes
    body_bytes: int


@dataclass(frozen=True)
class _ServePart:
    z: Tensor  # (rows, d_p)
    raw: bool  # sent unquantized
    body_bytes: int


class Parties:
    def __init__(
        self, ctx: ServiceContext, runs: Runs, steps: Steps, alignment: Alignment, serving: Serving
    ) -> None:
        self._ctx = ctx
        self._runs = runs
        self._steps = steps
        self._alignment = alignment
        self._serving = serving
        self._lock = threading.Lock()  # guards the two caches below
        self._owners: dict[str, int] = {}  # run id -> its owner's token id (never changes)
        self._plans: OrderedDict[str, PartyPlan] = OrderedDict()

    # ================================================================== who and what

    def caller(self, scope: PartyScope) -> Caller:
        """The run's owner, as whom party B's other rooms know the run; 404 if it is gone."""
        with self._lock:
            owner = self._owners.get(scope.run_id)
        if owner is None:
            with self._ctx.sessions() as session:
                run = store.run_by_id(session, scope.run_id)
                parties = RunCreate.from_stored(run.config).parties if run else None
                if run is None or parties is None:
                    raise ProblemError.not_found(f"no run {scope.run_id!r}")
                owner = run.owner_id
            with self._lock:
                self._owners[scope.run_id] = owner
        return Caller(token_id=owner, name=f"{scope.party}@{scope.run_id}")

    def _state(self, scope: PartyScope) -> tuple[RunState, PartyPlan, int]:
        """The aligned run in memory, its plan, and the index of the scope's party."""
        state = self._ctx.cache.owned(self.caller(scope), scope.run_id)
        plan = self._plan(state.run_id, state.config)
        if scope.party not in plan.names:
            raise ProblemError.not_found(f"no party {scope.party!r} in run {scope.run_id!r}")
        return state, plan, plan.index(scope.party)

    def _plan(self, run_id: str, spec: RunCreate) -> PartyPlan:
        with self._lock:
            plan = self._plans.get(run_id)
            if plan is not None:
                self._plans.move_to_end(run_id)
                return plan
        plan = PartyPlan.of(spec)
        with self._lock:
            self._plans[run_id] = plan
            while len(self._plans) > _PLANS_KEPT:
                self._plans.popitem(last=False)
        return plan

    def view(self, scope: PartyScope) -> RunOut:
        """The run as its owner sees it (with the top model's checksum once aligned)."""
        return self._runs.get(self.caller(scope), scope.run_id)

    def psi_info(self, scope: PartyScope) -> PsiInfo:
        return self._alignment.psi_info(self.caller(scope))

    def psi(self, scope: PartyScope, body: bytes) -> bytes:
        return self._alignment.psi(self.caller(scope), body)

    def traffic(self, run_id: str) -> dict[str, tuple[int, int, int]]:
        """party -> (steps, bytes in, bytes out) of the run's applied steps (the dashboard)."""
        with self._ctx.sessions() as session:
            return party_store.party_traffic(session, run_id)

    # ================================================================== alignment

    def check_alignment(
        self, scope: PartyScope, hashed_hex: Sequence[str]
    ) -> AlignmentOut | Ticket:
        """A party's aligned keys: the ones party B holds with a label become its part; a run
        aligned already answers a party whose keys include every aligned key (a retry)."""
        if len(hashed_hex) > self._ctx.limits.max_aligned_ids:
            raise ProblemError.limit(
                f"{len(hashed_hex)} ids, over the limit {self._ctx.limits.max_aligned_ids}"
            )
        caller = self.caller(scope)
        offered = {bytes.fromhex(h) for h in hashed_hex}
        with self._ctx.sessions() as session:
            run = owned_row(session, caller, scope.run_id)
            plan = self._plan(run.id, RunCreate.from_stored(run.config))
            if run.status != RunStatus.CREATED.value:
                blob = run.aligned_ids or b""
                aligned = [blob[i : i + 32] for i in range(0, len(blob), 32)]
                if set(aligned) <= offered:
                    return alignment_out(run, aligned)
                raise ProblemError.run_state("run is already aligned with a different id set")
            mine = frozenset(self._trainable(run.alignment_key) & offered)
        sha = hashlib.sha256(b"".join(sorted(mine))).digest()
        agenda = Agenda("the alignment", plan.names, partial(self._align, scope))
        return Ticket(("align",), mine, sha, agenda)

    def _trainable(self, alignment_key: str) -> set[bytes]:
        """Aligned keys of the ids party B holds with a label (rows without one are only
        ever served)."""
        own = hmac_ids(bytes.fromhex(alignment_key), self._ctx.labels.ids)
        labeled = self._ctx.labels.labeled
        if labeled is None:
            return set(own)
        return {k for k, ok in zip(own, labeled, strict=True) if ok}

    def _align(self, scope: PartyScope, parts: dict[str, frozenset[bytes]]) -> dict[str, Any]:
        """The run aligned on the keys every party holds, ordered by party B's raw ids."""
        caller = self.caller(scope)
        with self._ctx.sessions() as session:
            run = owned_row(session, caller, scope.run_id)
            if run.status == RunStatus.CREATED.value:
                common = frozenset.intersection(*parts.values())
                own = hmac_ids(bytes.fromhex(run.alignment_key), self._ctx.labels.ids)
                aligned = order_by_raw_id(self._ctx.labels.ids, own, set(common))
                self._alignment.start(session, run, aligned)  # 422 if too few
                session.commit()
            blob = run.aligned_ids or b""
            out = alignment_out(run, [blob[i : i + 32] for i in range(0, len(blob), 32)])
        return dict.fromkeys(parts, out)

    # ================================================================== steps

    def check_step(self, scope: PartyScope, body: bytes) -> bytes | Ticket:
        """A party's step request, checked as PROTOCOL.md 10.5 checks one (400, the stored
        answer of a replay, 409, 422) before it waits for the other parties' parts."""
        state, plan, index = self._state(scope)
        request = activations.decode(codec.decode_step_request, body, self._ctx.decode_limits)
        sha = hashlib.sha256(body).digest()
        with state.lock:
            applied, finished = state.step, state.finished
            stored = unpack_answers(state.last_request_sha, state.last_response, len(plan.names))
        t = request.step
        if t == applied and stored is not None:
            if sha != stored[index][0]:
                self._ctx.metrics.steps.labels("rejected").inc()
                raise ProblemError(
                    ProblemType.STEP_REPLAY_MISMATCH,
                    f"step {t} was applied with another request of party {scope.party!r}; its "
                    "state diverged from party B's",
                    applied_step=applied,
                )
            self._ctx.metrics.steps.labels("replayed").inc()
            return stored[index][1]
        if finished:
            raise ProblemError.run_state("run is finished; it takes no more steps")
        if not applied < t <= applied + MAX_AHEAD:
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
        z = self._step_rows(state, plan, index, request)
        part = _StepPart(z, sha, len(body))
        return Ticket(("step", str(t)), part, sha, self._step_agenda(scope, plan, t))

    def _step_rows(
        self, state: RunState, plan: PartyPlan, index: int, request: codec.StepRequest
    ) -> Tensor:
        """The party's z~ of the step, after the digest (409) and shape (422) checks."""
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
        return activations.dequantize_rows(
            plan.widths[index],
            plan.dequantizers[index],
            request.chunks,
            expected_rows=sum(expected),
            who=f"party {plan.names[index]!r}",
        )

    def _step_agenda(self, scope: PartyScope, plan: PartyPlan, t: int) -> Agenda:
        caller = self.caller(scope)

        def applied() -> int | None:
            state = self._ctx.cache.peek_owned(caller, scope.run_id)
            return state.step if state is not None else None

        return Agenda(
            what=f"step {t}",
            parties=plan.names,
            compute=partial(self._step, scope, t),
            ready=lambda: applied() == t - 1,
            applied=applied,
            step=t,
        )

    def _step(self, scope: PartyScope, t: int, parts: dict[str, _StepPart]) -> dict[str, Any]:
        """Apply step ``t`` once, with every party's part; each party's answer."""
        state, plan, _index = self._state(scope)
        with state.lock:
            if state.finished:
                raise ProblemError.run_state("run is finished; it takes no more steps")
            if state.step != t - 1:  # rolled back meanwhile
                raise ProblemError(
                    ProblemType.STEP_OUT_OF_ORDER,
                    f"party B has applied step {state.step} and expects {state.step + 1}",
                    expected_step=state.step + 1,
                    applied_step=state.step,
                )
            decoded = time.perf_counter()
            outcome, answers = self._answers(state, plan, t, parts)
            computed = time.perf_counter()
            shas, packed = pack_answers([parts[p].sha for p in plan.names], answers)
            state.trainer.apply_step()
            try:
                self._record(state, plan, t, outcome, parts, answers, (shas, packed))
            except BaseException:
                self._ctx.cache.drop(state.run_id)  # moved but not durable: reload
                raise
            state.commit(t, shas, packed)
        metrics = self._ctx.metrics
        metrics.steps.labels("applied").inc()
        metrics.step_compute.observe(computed - decoded)
        metrics.bytes_received.labels("step").inc(sum(p.body_bytes for p in parts.values()))
        metrics.bytes_sent.labels("step").inc(sum(len(a) for a in answers))
        return dict(zip(plan.names, answers, strict=True))

    def _answers(
        self, state: RunState, plan: PartyPlan, t: int, parts: dict[str, _StepPart]
    ) -> tuple[StepOutcome, list[bytes]]:
        """The fused step's outcome and every party's encoded answer; changes no state."""
        rows = state.label_rows[state.batch(t).positions]
        side = self._ctx.labels.side(rows) if state.trainer.model.side_features else None
        fused = fuse([parts[p].z for p in plan.names], plan.fusion)
        try:
            outcome, reply = protected_step(
                state.trainer,
                fused,
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

    def _record(
        self,
        state: RunState,
        plan: PartyPlan,
        t: int,
        outcome: StepOutcome,
        parts: dict[str, _StepPart],
        answers: list[bytes],
        packed: tuple[bytes, bytes],
    ) -> None:
        """The step log, every party's traffic and, at checkpoint steps, a checkpoint with
        every party's request hash and answer: one transaction."""
        traffic = [
            (name, parts[name].body_bytes, len(reply))
            for name, reply in zip(plan.names, answers, strict=True)
        ]
        with self._ctx.sessions() as session:
            self._ctx.ownership.fence(session, state)  # 503 run-moved if no longer ours
            store.log_step(
                session,
                run_id=state.run_id,
                step=t,
                loss=finite_or_none(outcome.loss),
                accuracy=finite_or_none(outcome.metrics.get("accuracy", float("nan"))),
                bytes_in=sum(i for _p, i, _o in traffic),
                bytes_out=sum(o for _p, _i, o in traffic),
                decode_ms=0.0,
                compute_ms=0.0,
                total_ms=0.0,
            )
            party_store.log_party_traffic(session, state.run_id, t, traffic)
            if t % state.config.checkpoint_interval == 0 or t == state.config.steps:
                model_state, optimizer_state = state.trainer.state()
                store.save_checkpoint(
                    session,
                    run_id=state.run_id,
                    step=t,
                    model_state=model_state,
                    optimizer_state=optimizer_state,
                    request_sha256=packed[0],
                    response=packed[1],
                    keep=self._ctx.checkpoints_kept,
                    interval=state.config.checkpoint_interval,
                )
            session.commit()

    def resume(self, scope: PartyScope, from_step: int) -> RunOut:
        """Roll the whole run back to a checkpoint (every party follows, PROTOCOL.md 12.7)."""
        state, _plan, _index = self._state(scope)
        return self._steps.roll_back(self.caller(scope), scope.run_id, state, from_step)

    # ================================================================== finish

    def check_finish(self, scope: PartyScope) -> RunOut | Ticket:
        """A party that applied the last step; the run finishes once every party has."""
        caller = self.caller(scope)
        with self._ctx.sessions() as session:
            run = owned_row(session, caller, scope.run_id)
            if run.status == RunStatus.FINISHED.value:
                return run_out(session, run, self._ctx.cache.peek(scope.run_id))
            if run.status != RunStatus.TRAINING.value:
                raise ProblemError.run_state(f"run is {run.status}; align and train it first")
        state, plan, _index = self._state(scope)
        self._at_last_step(state)
        agenda = Agenda(
            "the end of the run",
            plan.names,
            partial(self._finish, scope),
            applied=lambda: state.step,
        )
        return Ticket(("finish",), None, b"finish", agenda)

    @staticmethod
    def _at_last_step(state: RunState) -> None:
        if state.step < state.config.steps:
            raise ProblemError(
                ProblemType.STEP_OUT_OF_ORDER,
                f"finish after the last step: party B has applied step {state.step} of "
                f"{state.config.steps} and expects {state.step + 1}",
                expected_step=state.step + 1,
                applied_step=state.step,
            )

    def _finish(self, scope: PartyScope, parts: dict[str, None]) -> dict[str, Any]:
        state, _plan, _index = self._state(scope)
        with state.lock:
            self._at_last_step(state)  # a rollback after the parts came in
        out = self._runs.close(self.caller(scope), scope.run_id)
        return dict.fromkeys(parts, out)

    # ================================================================== serving

    def check_evaluate(self, scope: PartyScope, body: bytes, split: str) -> Ticket:
        """A party's part of an evaluation of ``split`` (PROTOCOL.md 10.6's checks)."""
        if split not in ("eval", "train"):
            raise ProblemError.invalid(f"split must be 'eval' or 'train', got {split!r}")
        state, plan, index = self._state(scope)
        request = activations.decode(codec.decode_evaluate_request, body, self._ctx.decode_limits)
        positions = state.positions_of(split)
        if len(positions) == 0:
            raise ProblemError.invalid(f"the run has no {split} samples")
        if request.ids_digest != batch_digest([state.aligned[p] for p in positions]):
            raise ProblemError(
                ProblemType.BATCH_MISMATCH,
                f"the evaluation ids' digest does not match party B's {len(positions)} "
                f"{split} samples",
            )
        part = self._serve_part(
            plan, index, request.chunks, state.rows_per_sample * len(positions), len(body)
        )
        agenda = Agenda(
            f"the evaluation of {split}", plan.names, partial(self._evaluate, scope, split)
        )
        key = ("eval", split, request.ids_digest.hex())
        return Ticket(key, part, hashlib.sha256(body).digest(), agenda)

    def _serve_part(
        self,
        plan: PartyPlan,
        index: int,
        chunks: Sequence[codec.Activations],
        rows: int,
        body_bytes: int,
    ) -> _ServePart:
        z = activations.dequantize_rows(
            plan.widths[index],
            plan.dequantizers[index],
            chunks,
            expected_rows=rows,
            allow_raw=True,
            who=f"party {plan.names[index]!r}",
        )
        return _ServePart(z, not activations.is_quantized(chunks), body_bytes)

    def _evaluate(
        self, scope: PartyScope, split: str, parts: dict[str, _ServePart]
    ) -> dict[str, Any]:
        state, plan, _index = self._state(scope)
        with state.lock:
            rows = state.label_rows[state.positions_of(split)]
            side = self._ctx.labels.side(rows) if state.trainer.model.side_features else None
            fused = fuse([parts[p].z for p in plan.names], plan.fusion)
            with out_of_range():
                outcome = state.trainer.evaluate(fused, self._ctx.labels.targets(rows), side)
            # "eval+raw": some party sent its activations unquantized
            logged = f"{split}+raw" if any(p.raw for p in parts.values()) else split
            with self._ctx.sessions() as session:
                store.log_evaluation(
                    session,
                    run_id=state.run_id,
                    step=state.step,
                    split=logged,
                    n=outcome.n,
                    loss=finite_or_none(outcome.loss),
                    metrics={k: finite_or_none(v) for k, v in outcome.metrics.items()},
                )
                session.commit()
        response = codec.encode_evaluate_response(
            codec.EvaluateResponse(n=outcome.n, loss=outcome.loss, metrics=outcome.metrics)
        )
        self._count("evaluate", parts, response)
        return dict.fromkeys(parts, response)

    def check_predict(self, scope: PartyScope, body: bytes) -> Ticket:
        """A party's part of a prediction: every party sends the same ids in the same order
        (its own activations); the ids name the meeting."""
        state, plan, index = self._state(scope)
        if state.rows_per_sample != 1:
            raise ProblemError.invalid(
                f"predict gives one score per sample; this run's model makes "
                f"{state.rows_per_sample} activation rows per sample (one per token)"
            )
        request = activations.decode(codec.decode_predict_request, body, self._ctx.decode_limits)
        with state.lock:
            self._serving.rows_of(state, request.ids)  # 422 unknown-ids, at once
        part = self._serve_part(plan, index, request.chunks, request.rows, len(body))
        ids_digest = hashlib.sha256("\n".join(request.ids).encode()).hexdigest()
        agenda = Agenda(
            f"the prediction of {len(request.ids)} ids",
            plan.names,
            partial(self._predict, scope, request.ids),
        )
        return Ticket(("predict", ids_digest), part, hashlib.sha256(body).digest(), agenda)

    def _predict(
        self, scope: PartyScope, ids: list[str], parts: dict[str, _ServePart]
    ) -> dict[str, Any]:
        state, plan, _index = self._state(scope)
        with state.lock:
            side = None
            if state.config.use_side_features and state.trainer.model.side_features:
                side = self._ctx.labels.side(self._serving.rows_of(state, ids))
            fused = fuse([parts[p].z for p in plan.names], plan.fusion)
            with out_of_range():
                scores = state.trainer.predict(fused, side)
        response = codec.encode_predict_response(
            codec.PredictResponse(ids=ids, scores=scores.numpy())
        )
        self._count("predict", parts, response)
        return dict.fromkeys(parts, response)

    def _count(self, route: str, parts: dict[str, _ServePart], response: bytes) -> None:
        self._ctx.metrics.bytes_received.labels(route).inc(
            sum(p.body_bytes for p in parts.values())
        )
        self._ctx.metrics.bytes_sent.labels(route).inc(len(response) * len(parts))
