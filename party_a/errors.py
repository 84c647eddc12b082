"""Exceptions of party A's client side.

::

    FedliteError
     ├── ConfigError            a config file, flag, URL or certificate that cannot work
     │    └── RunNotFound           no run of that name in party A's state (never created)
     ├── TransportError         party B unreachable after every retry
     ├── ProtocolError          a response that is not what the protocol promises
     └── ProblemResponse        party B answered with problem+json (type, status, detail)
          ├── Unauthorized          401 (reason: token, expired, certificate)
          ├── Forbidden             403 the token's scope does not cover the call
          ├── NotFound              404
          ├── StepOutOfOrder        409 step-out-of-order (expected_step, applied_step)
          ├── StepReplayMismatch    409 step-replay-mismatch
          ├── BatchMismatch         409 batch-mismatch
          ├── CheckpointNotFound    409 checkpoint-not-found (checkpoints)
          ├── RunStateConflict      409 run-state
          ├── PartiesIncomplete     409 parties-incomplete (missing_parties, waiting_for)
          ├── CallOutOfOrder        409 call-out-of-order (expected_call, finishing_parties)
          └── TrainingDiverged      422 training-diverged
"""

from typing import Any

__all__ = [
    "BatchMismatch",
    "CallOutOfOrder",
    "CheckpointNotFound",
    "ConfigError",
    "FedliteError",
    "Forbidden",
    "NotFound",
    "PartiesIncomplete",
    "ProblemResponse",
    "ProtocolError",
    "RunNotFound",
    "RunStateConflict",
    "StepOutOfOrder",
    "StepReplayMismatch",
    "TrainingDiverged",
    "TransportError",
    "Unauthorized",
    "problem_from_body",
]


class FedliteError(Exception):
    """Base of everything party A raises on purpose."""


class ConfigError(FedliteError):
    """Waiting will not fix it: never retried; the CLIs exit with code 2."""


class RunNotFound(ConfigError):
    """Party A's state has no run ``name`` for ``server``; evaluate, predict and finish
    refuse rather than create an untrained run at party B."""

    def __init__(self, name: str, server: str) -> None:
        super().__init__(f"no run named {name!r} for party B at {server} in party A's state")
        self.name = name
        self.server = server


class TransportError(FedliteError):
    pass


class ProtocolError(FedliteError):
    pass


class ProblemResponse(FedliteError):
    """party B's problem+json, with its members available as attributes and in ``extra``."""

    def __init__(self, status: int, type_: str, title: str, detail: str, extra: dict[str, Any]):
        super().__init__(f"party B: {title} ({status}): {detail}")
        self.status = status
        self.type = type_
        self.title = title
        self.detail = detail
        self.extra = extra


class Unauthorized(ProblemResponse):
    """Party B does not accept the credential; only its operator can change that."""


class Forbidden(ProblemResponse):
    """The token is valid but its scope does not cover the call (``needs`` says which)."""


class NotFound(ProblemResponse):
    pass


class StepOutOfOrder(ProblemResponse):
    @property
    def applied_step(self) -> int:
        return int(self.extra.get("applied_step", -1))


class StepReplayMismatch(ProblemResponse):
    pass


class BatchMismatch(ProblemResponse):
    pass


class CheckpointNotFound(ProblemResponse):
    pass


class RunStateConflict(ProblemResponse):
    pass


class TrainingDiverged(ProblemResponse):
    pass


class PartiesIncomplete(ProblemResponse):
    """Party B waited for other feature parties of the run, in vain so far: send again."""

    @property
    def missing_parties(self) -> list[str]:
        return [str(p) for p in self.extra.get("missing_parties", [])]

    @property
    def waiting_for(self) -> str:
        return str(self.extra.get("waiting_for", ""))


class CallOutOfOrder(ProblemResponse):
    """Another call must come first (a run with several feature parties: the others are
    finishing it, so this party finishes before it evaluates or predicts)."""

    @property
    def expected_call(self) -> str:
        return str(self.extra.get("expected_call", ""))


def _by_type() -> dict[str, type[ProblemResponse]]:
    # imported here: api_schemas loads pydantic, which `fedlite-a --help` does not need
    from api_schemas.problems import ProblemType

    return {
        ProblemType.UNAUTHORIZED: Unauthorized,
        ProblemType.FORBIDDEN: Forbidden,
        ProblemType.NOT_FOUND: NotFound,
        ProblemType.STEP_OUT_OF_ORDER: StepOutOfOrder,
        ProblemType.STEP_REPLAY_MISMATCH: StepReplayMismatch,
        ProblemType.BATCH_MISMATCH: BatchMismatch,
        ProblemType.CHECKPOINT_NOT_FOUND: CheckpointNotFound,
        ProblemType.RUN_STATE: RunStateConflict,
        ProblemType.TRAINING_DIVERGED: TrainingDiverged,
        ProblemType.PARTIES_INCOMPLETE: PartiesIncomplete,
        ProblemType.CALL_OUT_OF_ORDER: CallOutOfOrder,
    }


def problem_from_body(status: int, body: dict[str, Any]) -> ProblemResponse:
    """The typed exception for a decoded problem+json body."""
    type_ = str(body.get("type", "about:blank"))
    extra = {k: v for k, v in body.items() if k not in ("type", "title", "status", "detail")}
    cls = _by_type().get(type_, ProblemResponse)
    return cls(status, type_, str(body.get("title", "")), str(body.get("detail", "")), extra)
