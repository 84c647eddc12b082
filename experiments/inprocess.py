"""Party A talking to party B's service in the same process: the same code, minus HTTP.

:class:`InProcessTransport` implements party A's ``Transport`` by calling
``party_b.service.RunService`` directly and turning its ``ProblemError`` into the typed
exception party A would have parsed from problem+json, so the trainer cannot tell the
difference. Sweeps use it for speed; the HTTP path is the same service behind FastAPI.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from api_schemas import AlignmentOut, PsiInfo, RunCreate, RunOut
from party_a.errors import problem_from_body
from party_b import auth
from party_b.errors import ProblemError
from party_b.labels import LabelSource
from party_b.metrics import Metrics
from party_b.service import Caller, RunService
from party_b.settings import Limits
from party_b.store import make_engine, make_session_factory

__all__ = ["InProcessTransport", "in_process_party_b"]

T = TypeVar("T")


# Whole evaluation sets travel in one request (Shakespeare's held-out 5 % is ~32,000 token
# rows); the HTTP party B of the spot checks gets the same limits through its environment.
EXPERIMENT_LIMITS = Limits(max_batch=1 << 20, max_aligned_ids=1 << 24)


def in_process_party_b(labels: LabelSource, database: Path) -> tuple[RunService, Caller]:
    """A party B service on its own SQLite file, and a caller with a registered token."""
    engine = make_engine(f"sqlite:///{database}")
    sessions = make_session_factory(engine)
    with sessions() as session:
        auth.register_token(session, "experiments", "experiments-token-0000")
        row = auth.authenticate(session, "experiments-token-0000")
        assert row is not None
    service = RunService(
        sessions=sessions, labels=labels, limits=EXPERIMENT_LIMITS, metrics=Metrics()
    )
    return service, Caller(token_id=row.id, name=row.name)


class InProcessTransport:
    def __init__(self, service: RunService, caller: Caller) -> None:
        self.service = service
        self.caller = caller

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(self.caller, *args)
        except ProblemError as exc:
            body = {"type": str(exc.type), "title": exc.title, "detail": exc.detail}
            raise problem_from_body(exc.status, {**body, **exc.extensions}) from None

    def psi_info(self) -> PsiInfo:
        return self._call(self.service.psi_info)

    def psi(self, body: bytes) -> bytes:
        return self._call(self.service.psi, body)

    def create_run(self, spec: RunCreate, idempotency_key: str | None = None) -> RunOut:
        return self._call(self.service.create_run, spec, idempotency_key)

    def get_run(self, run_id: str) -> RunOut:
        return self._call(self.service.get_run, run_id)

    def align(self, run_id: str, hashed_ids: list[str]) -> AlignmentOut:
        return self._call(self.service.align, run_id, hashed_ids)

    def step(self, run_id: str, body: bytes) -> bytes:
        return self._call(self.service.step, run_id, body)

    def resume(self, run_id: str, from_step: int) -> RunOut:
        return self._call(self.service.resume, run_id, from_step)

    def evaluate(self, run_id: str, body: bytes, split: str = "eval") -> bytes:
        return self._call(self.service.evaluate, run_id, body, split)

    def predict(self, run_id: str, body: bytes) -> bytes:
        return self._call(self.service.predict, run_id, body)

    def finish(self, run_id: str) -> RunOut:
        return self._call(self.service.finish, run_id)
