"""Party B without HTTP: one thin front over rooms that each do one job.

    state.py      Caller, RunState (a run in memory), owned_row (the one ownership check)
    cache.py      RunCache: runs in memory, loaded once, looked up by owner and id
    loader.py     RunLoader: a run from the store into memory, at its newest checkpoint
    admission.py  Admission: a run config checked against the labels and the limits
    runs.py       Runs: create (quota, idempotency), list, show, finish, logs, recovery
    alignment.py  Alignment: PSI and aligning a run on the intersection
    steps.py      Steps: exactly-once training steps, each a transaction; resume
    turns.py      Turns: a step that overtook its predecessor waits for it (event loop)
    wire.py       request bodies to z~ (decode, dequantize); downlink.py: gradients back
    serving.py    Serving: evaluate and predict
    views.py      RunOut / AlignmentOut

The API (``party_b.api``) only translates HTTP to these calls, run in worker threads since
they do torch work, and renders ``ProblemError`` as problem+json; ``party_b.inprocess``
calls the same front without HTTP.
"""

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

from sqlalchemy.orm import Session, sessionmaker

from api_schemas import AlignmentOut, EvalResultOut, PsiInfo, RunCreate, RunOut, StepLogOut
from party_b.labels import LabelSource
from party_b.metrics import Metrics
from party_b.privacy import PrivacyPolicy
from party_b.service.admission import Admission
from party_b.service.alignment import Aligner, Alignment
from party_b.service.cache import RunCache
from party_b.service.loader import RunLoader
from party_b.service.runs import Runs
from party_b.service.serving import Serving
from party_b.service.state import Caller
from party_b.service.steps import Steps
from party_b.service.turns import HOLD_SECONDS, Offload, Turns
from party_b.service.wire import decode_limits
from party_b.settings import Limits

__all__ = ["Caller", "RunService"]


class RunService:
    """Every operation of party B's API, without HTTP; raises ``ProblemError``."""

    def __init__(
        self,
        *,
        sessions: sessionmaker[Session],
        labels: LabelSource,
        limits: Limits,
        metrics: Metrics,
        checkpoints_kept: int = 3,
        aligner: Aligner | None = None,
        privacy: PrivacyPolicy | None = None,
        step_hold: float | None = None,
    ) -> None:
        """``privacy``: the label-privacy policy every new run gets (default: off);
        ``step_hold``: the longest wait in seconds of a step that overtook its predecessor
        (default ``turns.HOLD_SECONDS``; 0 refuses it at once)."""
        privacy = privacy or PrivacyPolicy()
        privacy.check_labels(labels.task, labels.num_outputs)
        self.privacy = privacy
        self.sessions, self.labels, self.limits, self.metrics = sessions, labels, limits, metrics
        admission = Admission(labels, limits)
        self.loader = RunLoader(sessions=sessions, labels=labels, admission=admission)
        self.cache = cache = RunCache(self.loader, metrics)
        self.runs = Runs(
            sessions=sessions,
            labels=labels,
            limits=limits,
            admission=admission,
            cache=cache,
            checkpoints_kept=checkpoints_kept,
            privacy=privacy,
        )
        self.alignment = Alignment(
            sessions=sessions,
            labels=labels,
            limits=limits,
            metrics=metrics,
            admission=admission,
            checkpoints_kept=checkpoints_kept,
            aligner=aligner,
        )
        limits_of_bodies = decode_limits(limits)
        self.steps = Steps(
            sessions=sessions,
            labels=labels,
            cache=cache,
            metrics=metrics,
            decode_limits=limits_of_bodies,
            checkpoints_kept=checkpoints_kept,
        )
        self.turns = Turns(cache, metrics, HOLD_SECONDS if step_hold is None else step_hold)
        self.serving = Serving(
            sessions=sessions,
            labels=labels,
            cache=cache,
            metrics=metrics,
            decode_limits=limits_of_bodies,
        )

    def recover(self) -> list[tuple[str, str, int]]:
        return self.runs.recover()

    # runs
    def create_run(
        self, caller: Caller, spec: RunCreate, idempotency_key: str | None = None
    ) -> RunOut:
        return self.runs.create(caller, spec, idempotency_key)

    def list_runs(self, caller: Caller) -> list[RunOut]:
        return self.runs.list_runs(caller)

    def get_run(self, caller: Caller, run_id: str) -> RunOut:
        return self.runs.get(caller, run_id)

    def finish(self, caller: Caller, run_id: str) -> RunOut:
        return self.runs.finish(caller, run_id)

    def delete_run(self, caller: Caller, run_id: str) -> None:
        self.runs.delete(caller, run_id)

    def step_log(self, caller: Caller, run_id: str, start: int, limit: int) -> list[StepLogOut]:
        return self.runs.step_log(caller, run_id, start, limit)

    def eval_results(self, caller: Caller, run_id: str) -> list[EvalResultOut]:
        return self.runs.eval_results(caller, run_id)

    # alignment
    def psi_info(self, caller: Caller) -> PsiInfo:
        return self.alignment.psi_info(caller)

    def psi(self, caller: Caller, body: bytes) -> bytes:
        return self.alignment.psi(caller, body)

    def align(self, caller: Caller, run_id: str, hashed_hex: Sequence[str]) -> AlignmentOut:
        return self.alignment.align(caller, run_id, hashed_hex)

    # training
    def step(self, caller: Caller, run_id: str, body: bytes) -> bytes:
        return self.steps.step(caller, run_id, body)

    def step_turn(
        self, caller: Caller, run_id: str, body: bytes, offload: Offload
    ) -> AbstractAsyncContextManager[None]:
        """Around a step request, on the event loop: a step that overtook its predecessor
        waits for it there (turns.py); ``step`` then runs in a worker thread inside it."""
        return self.turns.turn(caller, run_id, body, offload)

    def resume(self, caller: Caller, run_id: str, from_step: int) -> RunOut:
        return self.steps.resume(caller, run_id, from_step)

    # serving
    def evaluate(self, caller: Caller, run_id: str, body: bytes, split: str = "eval") -> bytes:
        return self.serving.evaluate(caller, run_id, body, split)

    def predict(self, caller: Caller, run_id: str, body: bytes) -> bytes:
        return self.serving.predict(caller, run_id, body)
