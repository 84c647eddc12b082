"""RFC 9457 problem details: the one error shape on the wire.

Every error party B sends is ``application/problem+json`` whose ``type`` is one of the stable
URNs below; clients switch on ``type``, never on the human-readable ``title``/``detail``.
"""

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

PROBLEM_CONTENT_TYPE = "application/problem+json"
MSGPACK_CONTENT_TYPE = "application/msgpack"

_PREFIX = "urn:fedlite:problem:"


class ProblemType(StrEnum):
    """Stable problem types. Adding one is fine; renaming one breaks clients."""

    UNAUTHORIZED = _PREFIX + "unauthorized"  # 401: no, malformed or revoked token
    NOT_FOUND = _PREFIX + "not-found"  # 404: no such route, or a run the token cannot see
    METHOD_NOT_ALLOWED = _PREFIX + "method-not-allowed"  # 405
    MALFORMED_MESSAGE = _PREFIX + "malformed-message"  # 400: msgpack body failed to decode
    INVALID_REQUEST = _PREFIX + "invalid-request"  # 422: JSON body or parameters invalid
    SHAPE_MISMATCH = _PREFIX + "shape-mismatch"  # 422: activations do not fit the run
    LIMIT_EXCEEDED = _PREFIX + "limit-exceeded"  # 422: over an operator limit (B, d, q, L, ...)
    TOO_MANY_RUNS = _PREFIX + "too-many-runs"  # 429: the token's run quota is used up
    PAYLOAD_TOO_LARGE = _PREFIX + "payload-too-large"  # 413: body over the size limit
    UNSUPPORTED_MEDIA_TYPE = _PREFIX + "unsupported-media-type"  # 415: wrong Content-Type
    STEP_OUT_OF_ORDER = _PREFIX + "step-out-of-order"  # 409: not the next step (see expected_step)
    STEP_REPLAY_MISMATCH = _PREFIX + "step-replay-mismatch"  # 409: applied step resent, other body
    BATCH_MISMATCH = _PREFIX + "batch-mismatch"  # 409: batch digest differs from party B's batch
    RUN_STATE = _PREFIX + "run-state"  # 409: operation not allowed in the run's current status
    CHECKPOINT_NOT_FOUND = _PREFIX + "checkpoint-not-found"  # 409: resume to a step not kept
    TRAINING_DIVERGED = _PREFIX + "training-diverged"  # 422: NaN/Inf loss; step not applied
    UNKNOWN_IDS = _PREFIX + "unknown-ids"  # 422: prediction ids party B does not hold
    IDEMPOTENCY_KEY_REUSED = _PREFIX + "idempotency-key-reused"  # 422: same key, other body
    INTERNAL = _PREFIX + "internal"  # 500: a bug on party B's side, never caller input


class Problem(BaseModel):
    """An RFC 9457 problem details object; extension members are allowed (e.g. expected_step)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
