"""Wire codec: msgpack ``encode_*`` / ``decode_*`` pairs for the training messages.

Party A sends cut-layer activations as one or more chunks of rows, each quantized on its own
(a product-quantization codebook plus bit-packed codewords, or raw floats for the SplitFed
baseline); party B answers with the loss and the gradient w.r.t. the activations it
dequantized, one gradient row per activation row, chunks concatenated in order.
docs/PROTOCOL.md describes the bytes field by field; this module and ``shared.wire`` (the
envelope, the safe reader, arrays and activation chunks under every message) are its
reference implementation. The message classes and the wire names are re-exported here, so
``from shared import codec`` is all a party needs.

Exceptions::

    ValueError
     ├── CodecError   every decode_* raises it, and only it, for any malformed input
     └── RangeError   an encoder asked for float16 got finite values beyond its range

Encoders raise plain ``ValueError`` (never ``CodecError``) for a message that cannot go on
the wire, e.g. a NaN gradient: that is a bug on the sending side, not a malformed message,
and must not be answered as one. ``RangeError`` marks the one case a sender can recover
from, by choosing a wider dtype.

In memory every float array is float32 and codewords are int64; on the wire, codebooks,
raw activations, gradients and scores may be float16 (encoder keyword options). Decoders
always return writable float32 arrays.
"""

from collections.abc import Sequence

from shared.types import DIGEST_BYTES, MAX_STEP, WireFloat
from shared.wire.activations import (
    Activations,
    CodewordCoding,
    PQActivations,
    RawActivations,
    chunk_rows,
    chunks_from_wire,
    chunks_to_wire,
)
from shared.wire.arrays import RangeError, float_bin
from shared.wire.downlink import DownlinkSpec, decode_gradient, encode_gradient, gradient_keys
from shared.wire.envelope import (
    WIRE_VERSION,
    MessageType,
    canonical_digest,
    open_message,
    pack,
    peek_step,
)
from shared.wire.messages import (
    EvaluateRequest,
    EvaluateResponse,
    PredictRequest,
    PredictResponse,
    StepRequest,
    StepResponse,
    ids_from_wire,
    metrics_from_wire,
)
from shared.wire.reader import DEFAULT_LIMITS, CodecError, DecodeLimits, malformed

__all__ = [
    "DEFAULT_LIMITS",
    "WIRE_VERSION",
    "Activations",
    "CodecError",
    "CodewordCoding",
    "DecodeLimits",
    "DownlinkSpec",
    "EvaluateRequest",
    "EvaluateResponse",
    "PQActivations",
    "PredictRequest",
    "PredictResponse",
    "RangeError",
    "RawActivations",
    "StepRequest",
    "StepResponse",
    "WireFloat",
    "canonical_digest",
    "chunk_rows",
    "decode_evaluate_request",
    "decode_evaluate_response",
    "decode_predict_request",
    "decode_predict_response",
    "decode_step_request",
    "decode_step_response",
    "encode_evaluate_request",
    "encode_evaluate_response",
    "encode_predict_request",
    "encode_predict_response",
    "encode_step_request",
    "encode_step_response",
    "peek_step",
    "predict_ids_within",
]


# ------------------------------------------------------------------------------------------
# StepRequest
# ------------------------------------------------------------------------------------------


def encode_step_request(
    message: StepRequest,
    *,
    codebook_dtype: WireFloat = "float32",
    activations_dtype: WireFloat = "float32",
    codewords: CodewordCoding = "packed",
) -> bytes:
    """Serialize a StepRequest. ``codebook_dtype`` and ``codewords`` ("packed", or "ans":
    rANS-coded where smaller, docs/PROTOCOL.md 3.1) apply to PQ, ``activations_dtype`` to raw."""
    return pack(
        MessageType.STEP_REQUEST,
        {
            "s": message.step,
            "h": message.batch_digest,
            "a": chunks_to_wire(
                message.chunks,
                codebook_dtype=codebook_dtype,
                activations_dtype=activations_dtype,
                codewords=codewords,
            ),
        },
    )


def decode_step_request(data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> StepRequest:
    """Parse and validate a StepRequest; raises CodecError for any malformed input."""
    f = open_message(data, MessageType.STEP_REQUEST, frozenset({"s", "h", "a"}), limits)
    step = f.get_int("s", 0, MAX_STEP)
    digest = f.get_bin("h", DIGEST_BYTES)
    chunks = chunks_from_wire(f, "a", limits)
    with malformed(f.where):
        return StepRequest(step=step, batch_digest=digest, chunks=chunks)


# ------------------------------------------------------------------------------------------
# StepResponse
# ------------------------------------------------------------------------------------------


def encode_step_response(
    message: StepResponse,
    *,
    grad_dtype: WireFloat = "float32",
    downlink: DownlinkSpec | None = None,
    seed: int = 0,
) -> bytes:
    """Serialize a StepResponse, the gradient in ``downlink`` (default: ``grad_dtype``).

    ``seed`` drives the representation's randomness (stochastic rounding, k-means): the
    same message, spec and seed give the same bytes. Raises ``RangeError`` when the
    gradient is finite but does not fit a 16-bit float representation.
    """
    spec = downlink if downlink is not None else DownlinkSpec(kind=grad_dtype)
    B, d = message.grad.shape
    return pack(
        MessageType.STEP_RESPONSE,
        {
            "s": message.step,
            "l": message.loss,
            "m": message.metrics,
            "B": B,
            "d": d,
            **encode_gradient(message.grad, spec, seed),
        },
    )


def decode_step_response(data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> StepResponse:
    """Parse and validate a StepResponse; raises CodecError for any malformed input."""
    common = frozenset({"s", "l", "m", "B", "d"})
    f = open_message(
        data, MessageType.STEP_RESPONSE, lambda obj: common | gradient_keys(obj), limits
    )
    step = f.get_int("s", 0, MAX_STEP)
    loss = f.get_float("l")
    metrics = metrics_from_wire(f, "m", limits)
    B = f.get_int("B", 1, limits.max_batch)
    d = f.get_int("d", 1, limits.max_dim)
    grad = decode_gradient(f, B, d, limits)
    with malformed(f.where):
        return StepResponse(step=step, loss=loss, metrics=metrics, grad=grad)


# ------------------------------------------------------------------------------------------
# EvaluateRequest
# ------------------------------------------------------------------------------------------


def encode_evaluate_request(
    message: EvaluateRequest,
    *,
    codebook_dtype: WireFloat = "float32",
    activations_dtype: WireFloat = "float32",
) -> bytes:
    """Serialize an EvaluateRequest (dtype options as in ``encode_step_request``)."""
    return pack(
        MessageType.EVALUATE_REQUEST,
        {
            "h": message.ids_digest,
            "a": chunks_to_wire(
                message.chunks,
                codebook_dtype=codebook_dtype,
                activations_dtype=activations_dtype,
            ),
        },
    )


def decode_evaluate_request(
    data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS
) -> EvaluateRequest:
    """Parse and validate an EvaluateRequest; raises CodecError for any malformed input."""
    f = open_message(data, MessageType.EVALUATE_REQUEST, frozenset({"h", "a"}), limits)
    digest = f.get_bin("h", DIGEST_BYTES)
    chunks = chunks_from_wire(f, "a", limits)
    with malformed(f.where):
        return EvaluateRequest(ids_digest=digest, chunks=chunks)


# ------------------------------------------------------------------------------------------
# EvaluateResponse
# ------------------------------------------------------------------------------------------


def encode_evaluate_response(message: EvaluateResponse) -> bytes:
    """Serialize an EvaluateResponse."""
    return pack(
        MessageType.EVALUATE_RESPONSE,
        {"n": message.n, "l": message.loss, "m": message.metrics},
    )


def decode_evaluate_response(
    data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS
) -> EvaluateResponse:
    """Parse and validate an EvaluateResponse; raises CodecError for any malformed input."""
    f = open_message(data, MessageType.EVALUATE_RESPONSE, frozenset({"n", "l", "m"}), limits)
    n = f.get_int("n", 0, MAX_STEP)
    loss = f.get_float("l")
    metrics = metrics_from_wire(f, "m", limits)
    with malformed(f.where):
        return EvaluateResponse(n=n, loss=loss, metrics=metrics)


# ------------------------------------------------------------------------------------------
# PredictRequest
# ------------------------------------------------------------------------------------------


# A PredictRequest's bytes, at most (docs/PROTOCOL.md 12.8): per id the key (a msgpack str
# of 64 hex characters, 66 bytes), a chunk's header (about 25 bytes, the worst case being a
# chunk of one row) and its row, at most d float32 values (raw; PQ codewords take less); per
# chunk of the run's batch_size rows its codebook, if any (R*L*d/q float32 values, every
# chunk carrying the whole frozen codebook); per request the envelope (1 KiB of headroom).
PREDICT_BYTES_PER_ID = 66 + 32
PREDICT_FRAME_BYTES = 1024


def predict_ids_within(body_bytes: int, parties: Sequence[tuple[int, int]], batch_size: int) -> int:
    """Ids per predict request such that every party's request fits a body of
    ``body_bytes`` (party B's ``max_body_bytes``); at least 1.

    ``parties``: each feature party's ``(d, c)``, its cut width and its codebook's floats
    (``R * L * d / q``; 0 for raw activations); ``batch_size``: rows per chunk (the run's).
    A request of n ids takes at most n (98 + 4 d) + ceil(n / B) 4 c + 1024 bytes, which is
    at most n (98 + 4 d + 4 c / B) + 4 c + 1024: n is the largest that keeps this within
    ``body_bytes`` for every party. The feature parties of a run cut a long list by this one
    rule, from the same numbers (``PsiInfo.max_body_bytes``, the run's ``parties`` and
    ``batch_size``), so that their requests name the same ids whatever each sends."""
    fits = []
    for d, c in parties:
        room = body_bytes - PREDICT_FRAME_BYTES - 4 * c
        fits.append(room * batch_size // ((PREDICT_BYTES_PER_ID + 4 * d) * batch_size + 4 * c))
    return max(1, min(fits, default=1))


def encode_predict_request(
    message: PredictRequest,
    *,
    codebook_dtype: WireFloat = "float32",
    activations_dtype: WireFloat = "float32",
) -> bytes:
    """Serialize a PredictRequest (dtype options as in ``encode_step_request``)."""
    return pack(
        MessageType.PREDICT_REQUEST,
        {
            "ids": message.ids,
            "a": chunks_to_wire(
                message.chunks,
                codebook_dtype=codebook_dtype,
                activations_dtype=activations_dtype,
            ),
        },
    )


def decode_predict_request(data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> PredictRequest:
    """Parse and validate a PredictRequest; raises CodecError for any malformed input."""
    f = open_message(data, MessageType.PREDICT_REQUEST, frozenset({"ids", "a"}), limits)
    ids = ids_from_wire(f, "ids", limits)
    chunks = chunks_from_wire(f, "a", limits)
    rows = sum(chunk_rows(chunks))
    if len(ids) != rows:
        raise CodecError(f"{f.where}.ids: {len(ids)} ids for {rows} activation rows")
    with malformed(f.where):
        return PredictRequest(ids=ids, chunks=chunks)


# ------------------------------------------------------------------------------------------
# PredictResponse
# ------------------------------------------------------------------------------------------


def encode_predict_response(
    message: PredictResponse, *, scores_dtype: WireFloat = "float32"
) -> bytes:
    """Serialize a PredictResponse, the scores as ``scores_dtype`` on the wire."""
    tag, scores = float_bin(message.scores, scores_dtype, "scores")
    n, C = message.scores.shape
    return pack(
        MessageType.PREDICT_RESPONSE,
        {"ids": message.ids, "n": n, "C": C, "dt": tag, "y": scores},
    )


def decode_predict_response(
    data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS
) -> PredictResponse:
    """Parse and validate a PredictResponse; raises CodecError for any malformed input."""
    keys = frozenset({"ids", "n", "C", "dt", "y"})
    f = open_message(data, MessageType.PREDICT_RESPONSE, keys, limits)
    ids = ids_from_wire(f, "ids", limits)
    n = f.get_int("n", 1, limits.max_batch)
    C = f.get_int("C", 1, limits.max_classes)
    if n != len(ids):
        raise CodecError(f"{f.where}.n: n={n} rows of scores for {len(ids)} ids")
    f.check_elements("n*C", n * C, limits)
    scores = f.get_float_array("y", f.get_dtype("dt"), (n, C))
    with malformed(f.where):
        return PredictResponse(ids=ids, scores=scores)
