"""RFC 9457 problem details: the one error shape on the wire.

Every error party B sends is ``application/problem+json`` whose ``type`` is one of the stable
URNs below; clients switch on ``type``, never on the human-readable ``title``/``detail``.
Each type has one HTTP status and one title (``PROBLEMS``), bound here and nowhere else.
"""

from enum import StrEnum
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

PROBLEM_CONTENT_TYPE = "application/problem+json"
MSGPACK_CONTENT_TYPE = "application/msgpack"

_PREFIX = "urn:fedlite:problem:"


class ProblemType(StrEnum):
    """Stable problem types. Adding one is fine; renaming one breaks clients."""

    UNAUTHORIZED = _PREFIX + "unauthorized"  # no, malformed, revoked or expired token
    FORBIDDEN = _PREFIX + "forbidden"  # a valid token whose scope does not cover the route
    NOT_FOUND = _PREFIX + "not-found"  # no such route, or a run the token cannot see
    METHOD_NOT_ALLOWED = _PREFIX + "method-not-allowed"
    MALFORMED_MESSAGE = _PREFIX + "malformed-message"  # msgpack body failed to decode
    INVALID_REQUEST = _PREFIX + "invalid-request"  # JSON body or parameters invalid
    SHAPE_MISMATCH = _PREFIX + "shape-mismatch"  # activations do not fit the run
    ACTIVATIONS_OUT_OF_RANGE = _PREFIX + "activations-out-of-range"  # finite, but overflow
    LIMIT_EXCEEDED = _PREFIX + "limit-exceeded"  # over an operator limit (B, d, q, L, ...)
    TOO_MANY_RUNS = _PREFIX + "too-many-runs"  # the token's run quota is used up
    PAYLOAD_TOO_LARGE = _PREFIX + "payload-too-large"  # body over the size limit
    UNSUPPORTED_MEDIA_TYPE = _PREFIX + "unsupported-media-type"  # wrong Content-Type
    STEP_OUT_OF_ORDER = _PREFIX + "step-out-of-order"  # not the next step (see expected_step)
    STEP_REPLAY_MISMATCH = _PREFIX + "step-replay-mismatch"  # applied step resent, other body
    BATCH_MISMATCH = _PREFIX + "batch-mismatch"  # batch digest differs from party B's batch
    RUN_STATE = _PREFIX + "run-state"  # operation not allowed in the run's current status
    CHECKPOINT_NOT_FOUND = _PREFIX + "checkpoint-not-found"  # resume to a step not kept
    TRAINING_DIVERGED = _PREFIX + "training-diverged"  # NaN/Inf loss; step not applied
    UNKNOWN_IDS = _PREFIX + "unknown-ids"  # prediction ids party B does not hold
    PARTIES_INCOMPLETE = _PREFIX + "parties-incomplete"  # other feature parties not there yet
    CALL_OUT_OF_ORDER = _PREFIX + "call-out-of-order"  # another call first: expected_call
    IDEMPOTENCY_KEY_REUSED = _PREFIX + "idempotency-key-reused"  # same key, other body
    PRIVACY_BUDGET_EXCEEDED = _PREFIX + "privacy-budget-exceeded"  # token's label-DP budget
    PRIVACY_REFUSED = _PREFIX + "privacy-refused"  # the run's privacy policy forbids it
    INTERNAL = _PREFIX + "internal"  # a bug or damaged state on party B's side, never input
    RUN_MOVED = _PREFIX + "run-moved"  # another replica of party B took the run over; resend
    UNAVAILABLE = _PREFIX + "unavailable"  # draining, starting or without its database: retry


class ProblemKind(NamedTuple):
    status: int  # the HTTP status every problem of this type is sent with
    title: str  # the same short summary for every occurrence (RFC 9457 section 3.1.3)


PROBLEMS: dict[ProblemType, ProblemKind] = {
    ProblemType.UNAUTHORIZED: ProblemKind(401, "Unauthorized"),
    ProblemType.FORBIDDEN: ProblemKind(403, "Forbidden"),
    ProblemType.NOT_FOUND: ProblemKind(404, "Not found"),
    ProblemType.METHOD_NOT_ALLOWED: ProblemKind(405, "Method not allowed"),
    ProblemType.MALFORMED_MESSAGE: ProblemKind(400, "Malformed message"),
    ProblemType.INVALID_REQUEST: ProblemKind(422, "Invalid request"),
    ProblemType.SHAPE_MISMATCH: ProblemKind(422, "Activations do not fit the run"),
    ProblemType.ACTIVATIONS_OUT_OF_RANGE: ProblemKind(422, "Activations out of range"),
    ProblemType.LIMIT_EXCEEDED: ProblemKind(422, "Over a server limit"),
    ProblemType.TOO_MANY_RUNS: ProblemKind(429, "Too many open runs"),
    ProblemType.PAYLOAD_TOO_LARGE: ProblemKind(413, "Payload too large"),
    ProblemType.UNSUPPORTED_MEDIA_TYPE: ProblemKind(415, "Unsupported media type"),
    ProblemType.STEP_OUT_OF_ORDER: ProblemKind(409, "Step out of order"),
    ProblemType.STEP_REPLAY_MISMATCH: ProblemKind(409, "Step already applied with another body"),
    ProblemType.BATCH_MISMATCH: ProblemKind(409, "Batch mismatch"),
    ProblemType.RUN_STATE: ProblemKind(409, "Not allowed in the run's status"),
    ProblemType.CHECKPOINT_NOT_FOUND: ProblemKind(409, "No such checkpoint"),
    ProblemType.TRAINING_DIVERGED: ProblemKind(422, "Training diverged"),
    ProblemType.UNKNOWN_IDS: ProblemKind(422, "Unknown ids"),
    ProblemType.PARTIES_INCOMPLETE: ProblemKind(409, "Waiting for other parties"),
    ProblemType.CALL_OUT_OF_ORDER: ProblemKind(409, "Another call first"),
    ProblemType.IDEMPOTENCY_KEY_REUSED: ProblemKind(422, "Idempotency key reused"),
    ProblemType.PRIVACY_BUDGET_EXCEEDED: ProblemKind(403, "Privacy budget exceeded"),
    ProblemType.PRIVACY_REFUSED: ProblemKind(403, "Refused by the run's privacy policy"),
    ProblemType.INTERNAL: ProblemKind(500, "Internal error"),
    ProblemType.RUN_MOVED: ProblemKind(503, "Run taken over by another replica"),
    ProblemType.UNAVAILABLE: ProblemKind(503, "Service unavailable"),
}


class Problem(BaseModel):
    """An RFC 9457 problem details object; extension members are allowed (e.g. expected_step)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
