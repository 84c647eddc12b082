"""Runs as records: create (quota, idempotency key), list, show, finish, logs, recovery."""

import logging
import secrets
import threading
import uuid
from contextlib import nullcontext
from functools import partial

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api_schemas import EvalResultOut, ProblemType, RunCreate, RunOut, RunStatus, StepLogOut
from party_b import audit, store
from party_b.errors import ProblemError
from party_b.privacy import PrivacyPolicy
from party_b.privacy.accounting import charge
from party_b.privacy.draws import TableIdentity, table_draw
from party_b.privacy.policy import default_budget
from party_b.privacy.run import RunPrivacy
from party_b.service.context import ServiceContext
from party_b.service.loader import stored_model_sha256
from party_b.service.meetings import Agenda, Ticket, at_once
from party_b.service.ownership import once_more_if_moved
from party_b.service.runstate import Caller, RunState, owned_row, party_of
from party_b.service.views import run_out
from shared.training import state_sha256

__all__ = ["Runs"]

log = logging.getLogger("fedlite.party_b")


class Runs:
    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx
        self._create_lock = threading.Lock()  # a quota check and its insert, one at a time
        self._table = TableIdentity(ctx.labels)  # which label table new runs train on

    def recover(self) -> list[tuple[str, str, int]]:
        """Report where every training run resumes after a restart: [(id, name, step)].

        Models load lazily on first use; this only reads checkpoint steps and drops step-log
        rows past them (steps applied after the last checkpoint died with the old process),
        of the runs no replica holds: on a database that replicas share, a run held by
        another replica is its holder's business, and the one that takes it over drops them
        (``RunLoader``).
        """
        resumed = []
        with self._ctx.sessions() as session:
            # one SQLite file has one party B: a lease in it is a dead process's
            shared = session.get_bind().dialect.name != "sqlite"
            for run in store.runs_in_status(session, RunStatus.TRAINING.value):
                steps = store.checkpoint_steps(session, run.id)
                last = steps[-1] if steps else 0
                if shared and not store.is_free(session, run.id):
                    continue  # another replica's (or a dead one's: its taker drops them)
                store.forget_after(session, run.id, last)
                resumed.append((run.id, run.name, last))
                log.warning(
                    "run %s (%s) resumes from checkpoint at step %d", run.id, run.name, last
                )
            session.commit()
        return resumed

    def create(self, caller: Caller, spec: RunCreate, idempotency_key: str | None = None) -> RunOut:
        """A new run; with ``idempotency_key``, a repeat of the same request gets the same run."""
        top = self._ctx.admission.check(spec)
        policy = self._ctx.privacy
        # the label table's draw (made, and committed, by the first run that needs it): every
        # run on the table trains on its randomized labels
        draw = table_draw(self._ctx.sessions, policy, self._table)
        run = store.Run(
            id=uuid.uuid4().hex,
            owner_id=caller.token_id,
            name=spec.name,
            status=RunStatus.CREATED.value,
            config=spec.model_dump(mode="json"),
            alignment_key=secrets.token_hex(32),
            num_classes=self._ctx.labels.num_outputs,
            side_features=int(top.get("side_features", 0)),
        )
        with self._create_lock, self._ctx.sessions() as session:
            store.lock_owner(session, caller.token_id)  # the same across replicas
            if idempotency_key is not None:
                earlier = self._created_with(session, caller, spec, idempotency_key)
                if earlier is not None:
                    return earlier
            self._check_quota(session, caller)
            store.add_run(session, run, idempotency_key)
            privacy = RunPrivacy.new(policy, draw.key if draw is not None else None)
            store.add_run_privacy(session, run.id, privacy.policy.to_stored(), privacy.secret)
            # the run's label-DP epsilon (its draw's, once per token), against the token's
            # budget: 403 and nothing stored
            charge(
                session,
                owner_id=caller.token_id,
                run_id=run.id,
                policy=policy,
                draw=draw.row if draw is not None else None,
                default_budget=default_budget(self._ctx.limits.epsilon_budget, policy),
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
            audit.record(self._ctx.sessions, caller, "create-run", run.id, name=spec.name)
            return run_out(session, run, None, self._ctx.labels)

    def list_runs(self, caller: Caller) -> list[RunOut]:
        with self._ctx.sessions() as session:
            runs = store.runs_of(session, caller.token_id)
            return [run_out(session, run, self._current(run.id), self._ctx.labels) for run in runs]

    def _current(self, run_id: str) -> RunState | None:
        """The run's copy in memory, unless another replica has taken the run over since."""
        state = self._ctx.cache.peek(run_id)
        return state if state is not None and self._ctx.ownership.current(state) else None

    def get(self, caller: Caller, run_id: str) -> RunOut:
        """The run; for an aligned one also its top model's checksum at the reported step."""
        with self._ctx.sessions() as session:
            run = owned_row(session, caller, run_id)
            if run.status == RunStatus.CREATED.value:
                return run_out(session, run, None, self._ctx.labels)
        # a read takes no lease (it never loads the run): this replica's copy if it holds
        # the run, else the newest checkpoint (party_b.service.cache.current_copy)
        state = self._ctx.cache.current_copy(caller, run_id)
        if state is None:
            with self._ctx.sessions() as session:
                out = run_out(session, owned_row(session, caller, run_id), None, self._ctx.labels)
                out.model_sha256 = stored_model_sha256(session, run_id, out.step)
                return out
        with state.lock, self._ctx.sessions() as session:  # step and checksum of one moment
            out = run_out(session, owned_row(session, caller, run_id), state, self._ctx.labels)
            out.model_sha256 = state_sha256(state.trainer.model.state_dict())
            return out

    def finish(self, caller: Caller, run_id: str) -> RunOut | Ticket:
        """No more steps; the final model is checkpointed and keeps serving evaluate and
        predict. A run with several feature parties finishes once every party has finished
        after its last step (a meeting: PROTOCOL.md 12.7); at once with one party."""
        with self._ctx.sessions() as session:
            run = owned_row(session, caller, run_id)
            if run.status == RunStatus.FINISHED.value:
                return run_out(session, run, self._ctx.cache.peek(run_id), self._ctx.labels)
            if run.status != RunStatus.TRAINING.value:
                raise ProblemError.run_state(f"run is {run.status}; align and train it first")
        state = self._ctx.cache.owned(caller, run_id)
        plan = state.plan
        index = party_of(plan, run_id, caller)
        if plan.named:
            _at_last_step(state)
        agenda = Agenda(
            "the end of the run",
            plan.names,
            partial(self._close, caller, run_id),
            wait=self._ctx.wait_of(plan),
            applied=lambda: state.step,
        )
        return at_once(Ticket(("finish",), plan.names[index], caller, b"finish", agenda), RunOut)

    def _close(self, caller: Caller, run_id: str, parts: dict[str, Caller]) -> dict[str, RunOut]:
        """Finish a training run: checkpoint its model (fenced), no more steps; every
        finishing party's answer (and its audit row)."""
        out = once_more_if_moved(lambda: self._close_once(caller, run_id, list(parts.values())))
        return dict.fromkeys(parts, out)

    def _close_once(self, caller: Caller, run_id: str, callers: list[Caller]) -> RunOut:
        state = self._ctx.cache.owned(caller, run_id)
        with state.lock, self._ctx.sessions() as session:
            run = owned_row(session, caller, run_id)
            if run.status == RunStatus.TRAINING.value:
                if state.plan.named:
                    _at_last_step(state)  # a rollback after the parties came
                self._ctx.ownership.checkpoint(session, state)  # 503 run-moved if not ours
                run.status = RunStatus.FINISHED.value
                session.commit()
                state.finished = True
                self._ctx.cache.retire(run_id, state)
                for finisher in callers:
                    audit.record(self._ctx.sessions, finisher, "finish", run_id, step=state.step)
            return run_out(session, run, state, self._ctx.labels)

    def delete(self, caller: Caller, run_id: str) -> None:
        """Delete the caller's run and all its stored state; it no longer counts against
        ``max_runs_per_token``. A request of the run in flight finishes first (its lock)."""
        with self._ctx.sessions() as session:
            owned_row(session, caller, run_id)  # 404 for another caller's run, as for none
        state = self._ctx.cache.peek(run_id)
        with state.lock if state is not None else nullcontext(), self._ctx.sessions() as session:
            owned_row(session, caller, run_id)  # a concurrent delete: 404
            store.delete_run(session, run_id)
            session.commit()
            self._ctx.cache.drop(run_id)
        audit.record(self._ctx.sessions, caller, "delete", run_id)

    def step_log(self, caller: Caller, run_id: str, start: int, limit: int) -> list[StepLogOut]:
        with self._ctx.sessions() as session:
            owned_row(session, caller, run_id)
            stored = store.run_privacy(session, run_id)
            policy = PrivacyPolicy.from_stored(stored.policy if stored else None)
            rows = store.step_log(session, run_id, start, limit)
            out = [StepLogOut.model_validate(r, from_attributes=True) for r in rows]
            # party A reads here what its step replies carried, no more (the dashboard,
            # party B's own view, reads the store directly)
            for row in out:
                row.loss = row.loss if policy.metrics != "none" else None
                row.accuracy = row.accuracy if policy.metrics == "all" else None
            return out

    def eval_results(self, caller: Caller, run_id: str) -> list[EvalResultOut]:
        with self._ctx.sessions() as session:
            owned_row(session, caller, run_id)
            rows = store.eval_results(session, run_id)
            return [EvalResultOut.model_validate(r, from_attributes=True) for r in rows]

    def _check_quota(self, session: Session, caller: Caller) -> None:
        open_runs = store.count_open_runs(session, caller.token_id, RunStatus.FINISHED.value)
        if open_runs >= self._ctx.limits.max_runs_per_token:
            raise ProblemError(
                ProblemType.TOO_MANY_RUNS,
                f"this token already has {open_runs} unfinished runs "
                f"(limit {self._ctx.limits.max_runs_per_token}); finish or delete one first",
            )

    def _created_with(
        self, session: Session, caller: Caller, spec: RunCreate, key: str
    ) -> RunOut | None:
        run = store.run_created_with_key(session, caller.token_id, key)
        if run is None:
            return None
        if run.config != spec.model_dump(mode="json"):
            raise ProblemError(
                ProblemType.IDEMPOTENCY_KEY_REUSED,
                f"run {run.id} was created with this Idempotency-Key and another configuration",
            )
        return run_out(session, run, self._ctx.cache.peek(run.id), self._ctx.labels)


def _at_last_step(state: RunState) -> None:
    """A run with several feature parties finishes after its last step only (the others
    still step before): 409 naming where it is."""
    if state.step < state.config.steps:
        raise ProblemError(
            ProblemType.STEP_OUT_OF_ORDER,
            f"finish after the last step: party B has applied step {state.step} of "
            f"{state.config.steps} and expects {state.step + 1}",
            expected_step=state.step + 1,
            applied_step=state.step,
        )
