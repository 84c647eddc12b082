"""Party A talking to party B's service in the same process: the same code, minus HTTP.

:class:`InProcessTransport` has the calls of party A's ``Transport`` (``party_a.transport``) and
makes them on a :class:`~party_b.service.Service` directly. Where party B would answer
problem+json, it hands the same problem (status and body) to ``problem``, which turns it into
the exception the caller expects: for party A's trainer, ``party_a.errors.problem_from_body``
(so the trainer cannot tell the difference from HTTP)::

    service, caller = in_process_party_b(labels, Path("party_b.sqlite"))
    transport = InProcessTransport(service, caller, problem=problem_from_body)

Experiments, tests and benchmarks use it for speed; the HTTP path is the same service behind
``party_b.api``. (Party B imports nothing of party A's: the translation is passed in.)
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from api_schemas import AlignmentOut, PsiInfo, RunCreate, RunOut
from party_b import auth
from party_b.errors import ProblemError
from party_b.labels import LabelSource
from party_b.metrics import Metrics
from party_b.privacy import PrivacyPolicy
from party_b.service import Caller, Service, Ticket, build_service
from party_b.service.meetings import now
from party_b.settings import Limits
from party_b.store import make_engine, make_session_factory, sole

__all__ = ["InProcessTransport", "ProblemRaiser", "in_process_party_b"]

T = TypeVar("T")

# (HTTP status, problem+json body) -> the exception to raise
ProblemRaiser = Callable[[int, dict[str, Any]], Exception]

_TOKEN = "in-process-token-0000"


def in_process_party_b(
    labels: LabelSource,
    database: Path,
    *,
    limits: Limits | None = None,
    privacy: PrivacyPolicy | None = None,
) -> tuple[Service, Caller]:
    """A party B service on its own SQLite file, and a caller with a registered token;
    ``privacy``: the label-privacy policy of its new runs (default off)."""
    url = f"sqlite:///{database}"
    sole.hold(url)  # this process serves the file, as fedlite-b serve does
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    with sessions() as session:
        auth.register_token(session, "in-process", _TOKEN)
        row = auth.authenticate(session, _TOKEN)
        assert row is not None
    service = build_service(
        sessions=sessions,
        labels=labels,
        limits=limits or Limits(),
        metrics=Metrics(),
        privacy=privacy,
    )
    return service, Caller(token_id=row.id, name=row.name)


class InProcessTransport:
    def __init__(self, service: Service, caller: Caller, *, problem: ProblemRaiser) -> None:
        self.service = service
        self.caller = caller
        self._problem = problem

    def _call(self, fn: Callable[..., T | Ticket], *args: Any) -> T:
        """``fn(caller, *args)``, answered now: this caller does not wait in a meeting (a
        step ahead of its predecessor is 409, as with ``FEDLITE_B_STEP_HOLD_SECONDS=0``)."""
        try:
            return now(fn(self.caller, *args))
        except ProblemError as exc:
            raise self._problem(exc.status, exc.body()) from None

    def psi_info(self) -> PsiInfo:
        return self._call(self.service.alignment.psi_info)

    def psi(self, body: bytes) -> bytes:
        return self._call(self.service.alignment.psi, body)

    def create_run(self, spec: RunCreate, idempotency_key: str | None = None) -> RunOut:
        return self._call(self.service.runs.create, spec, idempotency_key)

    def get_run(self, run_id: str) -> RunOut:
        return self._call(self.service.runs.get, run_id)

    def align(self, run_id: str, hashed_ids: list[str]) -> AlignmentOut:
        return self._call(self.service.alignment.align, run_id, hashed_ids)

    def align_keys(self, run_id: str, body: bytes) -> bytes:
        return self._call(self.service.alignment.align_keys, run_id, body)

    def step(self, run_id: str, body: bytes) -> bytes:
        return self._call(self.service.steps.step, run_id, body)

    def resume(self, run_id: str, from_step: int) -> RunOut:
        return self._call(self.service.steps.resume, run_id, from_step)

    def evaluate(self, run_id: str, body: bytes, split: str = "eval") -> bytes:
        return self._call(self.service.serving.evaluate, run_id, body, split)

    def predict(self, run_id: str, body: bytes) -> bytes:
        return self._call(self.service.serving.predict, run_id, body)

    def finish(self, run_id: str) -> RunOut:
        return self._call(self.service.runs.finish, run_id)
