"""Wire codec: exact round trips, hostile bytes only ever raise CodecError, sizes on the wire."""

import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shared.codec import (
    WIRE_VERSION,
    Activations,
    CodecError,
    DecodeLimits,
    EvaluateRequest,
    EvaluateResponse,
    PQActivations,
    PredictRequest,
    PredictResponse,
    RawActivations,
    StepRequest,
    StepResponse,
    chunk_rows,
    decode_evaluate_request,
    decode_evaluate_response,
    decode_predict_request,
    decode_predict_response,
    decode_step_request,
    decode_step_response,
    encode_evaluate_request,
    encode_evaluate_response,
    encode_predict_request,
    encode_predict_response,
    encode_step_request,
    encode_step_response,
    predict_ids_within,
)

DIGEST = bytes(range(8))

# ------------------------------------------------------------------------------------------
# factories and comparisons
# ------------------------------------------------------------------------------------------


def make_pq(
    *, B: int = 4, d: int = 12, q: int = 6, R: int = 2, L: int = 3, seed: int = 0
) -> PQActivations:
    rng = np.random.default_rng(seed)
    return PQActivations(
        codebook=rng.standard_normal((R, L, d // q)).astype(np.float32),
        codewords=rng.integers(0, L, size=(B, q)),
    )


def make_raw(*, B: int = 4, d: int = 12, seed: int = 0) -> RawActivations:
    rng = np.random.default_rng(seed)
    return RawActivations(activations=rng.standard_normal((B, d)).astype(np.float32))


def make_step_request(*chunks: Activations, step: int = 3) -> StepRequest:
    return StepRequest(step=step, batch_digest=DIGEST, chunks=chunks)


def make_step_response(*, B: int = 4, d: int = 12) -> StepResponse:
    grad = np.random.default_rng(1).standard_normal((B, d)).astype(np.float32)
    return StepResponse(step=7, loss=0.5, metrics={"accuracy": 0.75}, grad=grad)


def make_predict_response(*, n: int = 3, C: int = 4) -> PredictResponse:
    scores = np.random.default_rng(2).random((n, C)).astype(np.float32)
    return PredictResponse(ids=[f"id-{i}" for i in range(n)], scores=scores)


def same_floats(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def assert_float32_equal(decoded: np.ndarray, original: np.ndarray) -> None:
    assert decoded.dtype == np.float32
    assert decoded.flags.writeable
    np.testing.assert_array_equal(decoded, original)


def assert_same_activations(decoded: Activations, original: Activations) -> None:
    assert type(decoded) is type(original)
    if isinstance(original, PQActivations):
        assert isinstance(decoded, PQActivations)
        assert_float32_equal(decoded.codebook, original.codebook)
        assert decoded.codewords.dtype == np.int64
        np.testing.assert_array_equal(decoded.codewords, original.codewords)
        assert (decoded.B, decoded.d, decoded.q, decoded.R, decoded.L) == (
            original.B,
            original.d,
            original.q,
            original.R,
            original.L,
        )
    else:
        assert isinstance(decoded, RawActivations)
        assert_float32_equal(decoded.activations, original.activations)


def assert_same_chunks(decoded: object, original: tuple[Activations, ...]) -> None:
    assert isinstance(decoded, tuple)
    assert len(decoded) == len(original)
    for got, sent in zip(decoded, original, strict=True):
        assert_same_activations(got, sent)


def assert_same_metrics(decoded: dict[str, float], original: dict[str, float]) -> None:
    assert decoded.keys() == original.keys()
    assert all(same_floats(decoded[k], original[k]) for k in original)


def assert_same_message(decoded: object, original: object) -> None:
    assert type(decoded) is type(original)
    if isinstance(original, StepRequest):
        assert isinstance(decoded, StepRequest)
        assert (decoded.step, decoded.batch_digest) == (original.step, original.batch_digest)
        assert_same_chunks(decoded.chunks, original.chunks)
    elif isinstance(original, EvaluateRequest):
        assert isinstance(decoded, EvaluateRequest)
        assert decoded.ids_digest == original.ids_digest
        assert_same_chunks(decoded.chunks, original.chunks)
    elif isinstance(original, PredictRequest):
        assert isinstance(decoded, PredictRequest)
        assert decoded.ids == original.ids
        assert_same_chunks(decoded.chunks, original.chunks)
    elif isinstance(original, StepResponse):
        assert isinstance(decoded, StepResponse)
        assert decoded.step == original.step
        assert same_floats(decoded.loss, original.loss)
        assert_same_metrics(decoded.metrics, original.metrics)
        assert_float32_equal(decoded.grad, original.grad)
    elif isinstance(original, EvaluateResponse):
        assert isinstance(decoded, EvaluateResponse)
        assert decoded.n == original.n
        assert same_floats(decoded.loss, original.loss)
        assert_same_metrics(decoded.metrics, original.metrics)
    else:
        assert isinstance(original, PredictResponse)
        assert isinstance(decoded, PredictResponse)
        assert decoded.ids == original.ids
        assert_float32_equal(decoded.scores, original.scores)


# One row per message type: (message class, encoder, decoder).
CODECS: list[tuple[type, Callable[..., bytes], Callable[..., Any]]] = [
    (StepRequest, encode_step_request, decode_step_request),
    (StepResponse, encode_step_response, decode_step_response),
    (EvaluateRequest, encode_evaluate_request, decode_evaluate_request),
    (EvaluateResponse, encode_evaluate_response, decode_evaluate_response),
    (PredictRequest, encode_predict_request, decode_predict_request),
    (PredictResponse, encode_predict_response, decode_predict_response),
]
ENCODER = {cls: enc for cls, enc, _ in CODECS}
DECODER = {cls: dec for cls, _, dec in CODECS}


def round_trip(message: object, **options: str) -> object:
    return DECODER[type(message)](ENCODER[type(message)](message, **options))


# ------------------------------------------------------------------------------------------
# hypothesis strategies: valid messages of small random shapes
# ------------------------------------------------------------------------------------------

FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
FLOAT16 = st.floats(width=16, allow_nan=False, allow_infinity=False)


def float_arrays(shape: tuple[int, ...], *, half: bool = False) -> st.SearchStrategy[np.ndarray]:
    """float32 arrays; with half=True only values a float16 holds exactly."""
    dtype = np.float16 if half else np.float32
    elements = FLOAT16 if half else FLOAT32
    return hnp.arrays(dtype, shape, elements=elements).map(lambda a: a.astype(np.float32))


@st.composite
def pq_chunk(
    draw: st.DrawFn, *, q: int, R: int, s: int, L: int, half: bool = False
) -> PQActivations:
    """One PQ chunk of a given config (s = d // q), with its own rows and its own codebook."""
    B = draw(st.integers(1, 5))
    # draw a few codewords and tile them: L itself only matters for the code width
    codebook = np.resize(draw(float_arrays((R, min(L, 8), s), half=half)), (R, L, s))
    codewords = draw(hnp.arrays(np.int64, (B, q), elements=st.integers(0, L - 1)))
    return PQActivations(codebook=codebook, codewords=codewords)


@st.composite
def raw_chunk(draw: st.DrawFn, *, d: int, half: bool = False) -> RawActivations:
    B = draw(st.integers(1, 5))
    return RawActivations(activations=draw(float_arrays((B, d), half=half)))


@st.composite
def chunk_tuples(draw: st.DrawFn, *, half: bool = False) -> tuple[Activations, ...]:
    """1-3 chunks of one kind, one width d and (PQ) one q, R, L; rows and values per chunk."""
    count = draw(st.integers(1, 3))
    if draw(st.booleans()):
        q = draw(st.integers(1, 6))
        R = draw(st.sampled_from([r for r in range(1, q + 1) if q % r == 0]))
        s = draw(st.integers(1, 3))  # d // q
        # mostly small L, sometimes codes wider than a byte (up to 13 bits)
        L = draw(st.one_of(st.integers(1, 20), st.sampled_from([255, 256, 257, 1000, 4097])))
        chunk = pq_chunk(q=q, R=R, s=s, L=L, half=half)
    else:
        chunk = raw_chunk(d=draw(st.integers(1, 12)), half=half)
    return tuple(draw(chunk) for _ in range(count))


STEPS = st.integers(0, 2**63 - 1)
DIGESTS = st.binary(min_size=8, max_size=8)
IDS_TEXT = st.text(max_size=12)
REPORTED = st.floats(width=64)  # loss and metrics may be NaN or Inf
METRICS = st.dictionaries(st.text(max_size=8), REPORTED, max_size=4)


@st.composite
def predict_requests(draw: st.DrawFn, *, half: bool = False) -> PredictRequest:
    chunks = draw(chunk_tuples(half=half))
    rows = sum(chunk_rows(chunks))
    return PredictRequest(ids=draw(st.lists(IDS_TEXT, min_size=rows, max_size=rows)), chunks=chunks)


@st.composite
def step_responses(draw: st.DrawFn, *, half: bool = False) -> StepResponse:
    shape = (draw(st.integers(1, 5)), draw(st.integers(1, 12)))
    return StepResponse(
        step=draw(STEPS),
        loss=draw(REPORTED),
        metrics=draw(METRICS),
        grad=draw(float_arrays(shape, half=half)),
    )


@st.composite
def predict_responses(draw: st.DrawFn, *, half: bool = False) -> PredictResponse:
    n = draw(st.integers(1, 5))
    return PredictResponse(
        ids=draw(st.lists(IDS_TEXT, min_size=n, max_size=n)),
        scores=draw(float_arrays((n, draw(st.integers(1, 6))), half=half)),
    )


def messages(*, half: bool = False) -> st.SearchStrategy[Any]:
    chunks = chunk_tuples(half=half)
    return st.one_of(
        st.builds(StepRequest, step=STEPS, batch_digest=DIGESTS, chunks=chunks),
        st.builds(EvaluateRequest, ids_digest=DIGESTS, chunks=chunks),
        predict_requests(half=half),
        step_responses(half=half),
        st.builds(EvaluateResponse, n=STEPS, loss=REPORTED, metrics=METRICS),
        predict_responses(half=half),
    )


HALF_OPTIONS = {
    StepRequest: {"codebook_dtype": "float16", "activations_dtype": "float16"},
    EvaluateRequest: {"codebook_dtype": "float16", "activations_dtype": "float16"},
    PredictRequest: {"codebook_dtype": "float16", "activations_dtype": "float16"},
    StepResponse: {"grad_dtype": "float16"},
    EvaluateResponse: {},
    PredictResponse: {"scores_dtype": "float16"},
}

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------------------
# round trips
# ------------------------------------------------------------------------------------------


@FAST
@given(messages())
def test_every_message_round_trips_exactly(message: object):
    assert_same_message(round_trip(message), message)


@FAST
@given(messages(half=True))
def test_float16_wire_round_trips_values_float16_holds(message: object):
    assert_same_message(round_trip(message, **HALF_OPTIONS[type(message)]), message)


def test_float16_wire_halves_the_float_payload():
    # Prepare
    raw = make_raw(B=20, d=100)
    message = make_step_request(raw)

    # Act
    full = encode_step_request(message)
    half = encode_step_request(message, activations_dtype="float16")

    # Assert
    assert len(full) - len(half) == 20 * 100 * 2
    (decoded,) = decode_step_request(half).chunks
    assert isinstance(decoded, RawActivations)
    assert decoded.activations.dtype == np.float32
    np.testing.assert_allclose(decoded.activations, raw.activations, rtol=1e-3)


def test_codeword_widths_past_one_byte_round_trip():
    # Prepare: L = 300 needs 9 bits per codeword, L = 65536 the full 16
    for L in (300, 65_536):
        pq = make_pq(B=3, d=4, q=2, R=1, L=L)

        # Act
        decoded = round_trip(make_step_request(pq))

        # Assert
        assert isinstance(decoded, StepRequest)
        assert_same_chunks(decoded.chunks, (pq,))


def test_single_codeword_codebook_sends_no_codeword_bytes():
    # Prepare
    pq = make_pq(B=20, d=12, q=6, R=1, L=1)

    # Act
    encoded = encode_step_request(make_step_request(pq))

    # Assert
    assert msgpack.unpackb(encoded)["a"][0]["cw"] == b""
    (decoded,) = decode_step_request(encoded).chunks
    assert isinstance(decoded, PQActivations)
    np.testing.assert_array_equal(decoded.codewords, np.zeros((20, 6)))


# ------------------------------------------------------------------------------------------
# size on the wire
# ------------------------------------------------------------------------------------------


def test_femnist_step_request_is_about_three_kilobytes():
    # Prepare: the paper's FEMNIST point B=20, d=9216, q=1152, L=2, R=1
    pq = make_pq(B=20, d=9216, q=1152, R=1, L=2)
    message = make_step_request(pq, step=12_345)

    # Act
    encoded = encode_step_request(message)

    # Assert: codebook 1*2*8*4 = 64 bytes + codewords 20*1152 bits = 2880 bytes + headers
    assert 64 + 2880 < len(encoded) < 3100


def test_raw_step_request_is_its_float_payload_plus_a_small_header():
    message = make_step_request(make_raw(B=20, d=9216))
    assert 0 < len(encode_step_request(message)) - 20 * 9216 * 4 < 100


def test_documented_femnist_examples_are_exact():
    # Prepare: docs/PROTOCOL.md section 7; the horizontal step is 10 clients' batches of 20
    one = make_pq(B=20, d=9216, q=1152, R=1, L=2)
    ten = [make_pq(B=20, d=9216, q=1152, R=1, L=2, seed=client) for client in range(10)]
    raw = make_raw(B=20, d=9216)
    grad = make_step_response(B=20, d=9216)

    # Act / Assert
    assert len(encode_step_request(make_step_request(one, step=0))) == 3022
    assert len(encode_step_request(make_step_request(*ten, step=0))) == 29_923
    assert len(encode_step_request(make_step_request(raw, step=0))) == 737_341
    half = encode_step_request(make_step_request(raw, step=0), activations_dtype="float16")
    assert len(half) == 368_701
    assert len(encode_step_response(grad)) == 737_351


# ------------------------------------------------------------------------------------------
# hostile bytes: mutations and truncations only ever raise CodecError
# ------------------------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn) -> tuple[type, bytes]:
    message = draw(messages())
    encoded = bytearray(ENCODER[type(message)](message))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(encoded) - 1, 0)))
        if op == "flip" and encoded:
            encoded[at] ^= draw(st.integers(1, 255))
        elif op == "insert":
            encoded[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del encoded[at : at + draw(st.integers(1, 4))]
        else:
            del encoded[at:]
    return type(message), bytes(encoded)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_bytes_raise_codec_error_or_decode_to_a_valid_message(case: tuple[type, bytes]):
    # Prepare
    cls, data = case

    # Act / Assert: a flip inside float data may still be a valid message
    try:
        decoded = DECODER[cls](data)
    except CodecError:
        return
    assert isinstance(decoded, cls)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.data())
def test_every_proper_prefix_raises_codec_error(message: object, data: st.DataObject):
    encoded = ENCODER[type(message)](message)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(CodecError):
        DECODER[type(message)](encoded[:cut])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_raise_codec_error(data: bytes):
    for _, _, decode in CODECS:
        with pytest.raises(CodecError):
            decode(data)


@settings(max_examples=60, deadline=None)
@given(messages())
def test_a_message_fed_to_another_decoder_is_rejected_by_type(message: object):
    encoded = ENCODER[type(message)](message)
    for cls, _, decode in CODECS:
        if cls is not type(message):
            with pytest.raises(CodecError, match="expected message type"):
                decode(encoded)


# ------------------------------------------------------------------------------------------
# hostile bytes: one targeted test per malformation
# ------------------------------------------------------------------------------------------


def pq_step_bytes() -> bytes:
    return encode_step_request(make_step_request(make_pq()))


def raw_step_bytes() -> bytes:
    return encode_step_request(make_step_request(make_raw()))


def spliced_step_bytes(*chunks: Activations) -> bytes:
    """A step request whose "a" holds ``chunks`` as given, past StepRequest's own checks."""
    obj = msgpack.unpackb(encode_step_request(make_step_request(chunks[0])), raw=False)
    obj["a"] = [
        msgpack.unpackb(encode_step_request(make_step_request(chunk)), raw=False)["a"][0]
        for chunk in chunks
    ]
    return msgpack.packb(obj, use_bin_type=True)


def tamper(encoded: bytes, edit: Callable[[dict[str, Any]], object]) -> bytes:
    """Re-encode ``encoded`` after ``edit`` changed its decoded msgpack map in place."""
    obj = msgpack.unpackb(encoded, raw=False)
    edit(obj)
    return msgpack.packb(obj, use_bin_type=True)


# nested=True edits the first chunk of "a" instead of the top-level map
def setter(key: str, value: object, *, nested: bool = False) -> Callable[[dict[str, Any]], None]:
    def edit(obj: dict[str, Any]) -> None:
        (obj["a"][0] if nested else obj)[key] = value

    return edit


def deleter(key: str, *, nested: bool = False) -> Callable[[dict[str, Any]], None]:
    def edit(obj: dict[str, Any]) -> None:
        del (obj["a"][0] if nested else obj)[key]

    return edit


def nan_at_first_float(key: str, dtype: str, *, nested: bool = False) -> Callable[..., None]:
    def edit(obj: dict[str, Any]) -> None:
        target = obj["a"][0] if nested else obj
        values = np.frombuffer(target[key], dtype=dtype).copy()
        values[0] = np.nan
        target[key] = values.tobytes()

    return edit


def inf_at_last_float(key: str, dtype: str, *, nested: bool = False) -> Callable[..., None]:
    def edit(obj: dict[str, Any]) -> None:
        target = obj["a"][0] if nested else obj
        values = np.frombuffer(target[key], dtype=dtype).copy()
        values[-1] = -np.inf
        target[key] = values.tobytes()

    return edit


NOT_A_MESSAGE: list[tuple[str, bytes, str]] = [
    ("not msgpack", b"\xc1", "not a valid msgpack message"),
    ("empty", b"", "empty message"),
    ("not a map", msgpack.packb([1, 2, 3]), "expected a msgpack map, got list"),
    ("nil", msgpack.packb(None), "expected a msgpack map, got NoneType"),
    ("int map key", msgpack.packb({1: 2}), "map key"),
    ("ext type", msgpack.packb(msgpack.ExtType(5, b"x")), "not a valid msgpack message"),
]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [case[1:] for case in NOT_A_MESSAGE],
    ids=[case[0] for case in NOT_A_MESSAGE],
)
def test_bytes_that_are_no_message_raise_codec_error(data: bytes, fragment: str):
    with pytest.raises(CodecError) as raised:
        decode_step_request(data)
    assert fragment in str(raised.value)


PQ, RAW = "pq", "raw"  # which valid step request a case starts from
top, act = setter, lambda key, value: setter(key, value, nested=True)

# (id, base, edit of the decoded map, fragment of the CodecError message)
MALFORMED_STEP_REQUESTS: list[tuple[str, str, Callable[[dict[str, Any]], object], str]] = [
    # the envelope
    ("wrong version", PQ, top("v", 2), "unsupported wire version 2"),
    ("no version", PQ, deleter("v"), "missing wire version"),
    ("bool version", PQ, top("v", True), "'v' must be an int, got bool"),
    ("wrong type", PQ, top("t", "eval_req"), "expected message type 'step_req', got 'eval_req'"),
    ("no type", PQ, deleter("t"), "'t' must be a str"),
    ("missing field", PQ, deleter("s"), "step_req: missing field(s) ['s']"),
    ("extra field", PQ, top("zz", 1), "step_req: unexpected field(s) [\"'zz'\"]"),
    # wrong types
    ("str step", PQ, top("s", "3"), "step_req.s: expected int, got str"),
    ("bool step", PQ, top("s", True), "step_req.s: expected int, got bool"),
    ("float step", PQ, top("s", 3.0), "step_req.s: expected int, got float"),
    ("negative step", PQ, top("s", -1), "step_req.s: must be in [0,"),
    ("str digest", PQ, top("h", "01234567"), "step_req.h: expected bin, got str"),
    ("short digest", PQ, top("h", b"1234567"), "step_req.h: expected 8 bytes, got 7"),
    ("chunks not an array", PQ, top("a", {"k": "pq"}), "step_req.a: expected an array of"),
    ("no chunks", PQ, top("a", []), "step_req.a: must hold 1..4096 chunks, got 0"),
    ("chunk not a map", PQ, top("a", [1]), "step_req.a[0]: expected a map, got int"),
    ("unknown kind", PQ, act("k", "vq"), "step_req.a[0].k: unknown activation kind 'vq'"),
    ("bool B", PQ, act("B", True), "step_req.a[0].B: expected int, got bool"),
    ("extra pq field", PQ, act("x", b""), "step_req.a[0]: unexpected field(s)"),
    ("missing codebook", PQ, deleter("cb", nested=True), "step_req.a[0]: missing field(s) ['cb']"),
    ("unknown dtype", PQ, act("dt", "f8"), "step_req.a[0].dt: unknown float dtype 'f8'"),
    ("bin dtype", RAW, act("dt", b"f4"), "step_req.a[0].dt: expected str, got bin"),
    # absurd or inconsistent shapes
    ("zero B", PQ, act("B", 0), "step_req.a[0].B: must be in [1, 65536], got 0"),
    ("negative d", RAW, act("d", -12), "step_req.a[0].d: must be in [1, 1048576], got -12"),
    ("zero q", PQ, act("q", 0), "step_req.a[0].q: must be in [1,"),
    ("zero R", PQ, act("R", 0), "step_req.a[0].R: must be in [1,"),
    ("zero L", PQ, act("L", 0), "step_req.a[0].L: must be in [1,"),
    ("huge B", PQ, act("B", 2**40), "step_req.a[0].B: must be in [1, 65536]"),
    ("huge L", PQ, act("L", 65_537), "step_req.a[0].L: must be in [1, 65536]"),
    (
        "rows*d over limit",
        RAW,
        lambda o: o["a"][0].update(B=65_536, d=1025),
        "step_req.a: rows*d has 67174400 elements, over",
    ),
    ("q not dividing d", PQ, act("d", 13), "q=6 sub-vectors must divide d=13"),
    ("R not dividing q", PQ, act("R", 4), "R=4 codebooks must divide q=6"),
    ("bits not matching L", PQ, act("b", 3), "step_req.a[0].b: L=3 needs 2 bits"),
    ("B vs codeword bytes", PQ, act("B", 5), "step_req.a[0].cw: expected 8 bytes, got 6"),
    ("d vs raw bytes", RAW, act("d", 13), "(4, 13) of <f4 needs 208 bytes, got 192"),
    ("L vs codebook bytes", PQ, act("L", 4), "step_req.a[0].cb: declared shape (2, 4, 2)"),
    ("f2 tag on f4 bytes", RAW, act("dt", "f2"), "needs 96 bytes, got 192"),
    # values
    ("NaN in codebook", PQ, nan_at_first_float("cb", "<f4", nested=True), "a[0].cb: holds NaN"),
    ("Inf in raw", RAW, inf_at_last_float("x", "<f4", nested=True), "a[0].x: holds NaN or Inf"),
]


@pytest.mark.parametrize(
    ("base", "edit", "fragment"),
    [case[1:] for case in MALFORMED_STEP_REQUESTS],
    ids=[case[0] for case in MALFORMED_STEP_REQUESTS],
)
def test_malformed_step_request_raises_codec_error(
    base: str, edit: Callable[[dict[str, Any]], object], fragment: str
):
    # Prepare
    data = tamper(pq_step_bytes() if base == PQ else raw_step_bytes(), edit)

    # Act / Assert
    with pytest.raises(CodecError) as raised:
        decode_step_request(data)
    assert fragment in str(raised.value)


def test_truncated_and_trailing_bytes_raise_codec_error():
    encoded = pq_step_bytes()
    with pytest.raises(CodecError, match="not a valid msgpack message"):
        decode_step_request(encoded[:-1])
    with pytest.raises(CodecError, match="trailing bytes after the message"):
        decode_step_request(encoded + b"\x00")


def test_duplicate_keys_are_rejected():
    # Prepare: a map {"v": 1, "v": 1, ...} cannot be built with packb, so splice the bytes
    encoded = pq_step_bytes()
    obj = msgpack.unpackb(encoded, raw=False)
    head = msgpack.packb("v") + msgpack.packb(1)
    body = b"".join(msgpack.packb(k) + msgpack.packb(v, use_bin_type=True) for k, v in obj.items())
    data = bytes([0x80 | (len(obj) + 1)]) + head + body

    # Act / Assert
    with pytest.raises(CodecError, match="duplicate key"):
        decode_step_request(data)


def test_codeword_not_below_L_is_rejected():
    # Prepare: L = 3 packs 2 bits per code, so the pattern 11 (= 3) fits the stream
    encoded = tamper(pq_step_bytes(), lambda o: o["a"][0].update(cw=b"\xff" * 6))

    # Act / Assert
    with pytest.raises(CodecError, match=r"a\[0\]\.cw: codeword 3 >= L=3"):
        decode_step_request(encoded)


def test_non_zero_padding_bits_are_rejected():
    # Prepare: B=1, q=3, L=3 -> 6 bits of codes and 2 padding bits in one byte
    pq = make_pq(B=1, d=3, q=3, R=1, L=3)
    encoded = encode_step_request(make_step_request(pq))
    bad = tamper(encoded, lambda o: o["a"][0].update(cw=bytes([o["a"][0]["cw"][0] | 0b01])))

    # Act / Assert
    with pytest.raises(CodecError, match="padding bits"):
        decode_step_request(bad)


def test_nan_in_a_float16_codebook_is_rejected():
    # Prepare
    encoded = encode_step_request(make_step_request(make_pq()), codebook_dtype="float16")

    # Act
    bad = tamper(encoded, nan_at_first_float("cb", "<f2", nested=True))

    # Assert
    with pytest.raises(CodecError, match="NaN or Inf"):
        decode_step_request(bad)


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (nan_at_first_float("g", "<f4"), "step_res.g: holds NaN or Inf"),
        (inf_at_last_float("g", "<f4"), "step_res.g: holds NaN or Inf"),
        (setter("l", "0.5"), "step_res.l: expected float, got str"),
        (setter("l", True), "expected float, got bool"),
        (setter("m", [1.0]), "step_res.m: expected a map, got list"),
        (setter("m", {"acc": "high"}), "m['acc']: expected float, got str"),
        (setter("m", {f"m{i}": 0.0 for i in range(65)}), "65 metrics, over the limit 64"),
        (setter("B", 5), "step_res.g: declared shape (5, 12)"),
        (setter("d", 0), "step_res.d: must be in [1,"),
        (setter("dt", 4), "step_res.dt: expected str, got int"),
    ],
)
def test_malformed_step_response_raises_codec_error(edit: Callable[..., None], fragment: str):
    # Prepare
    data = tamper(encode_step_response(make_step_response()), edit)

    # Act / Assert
    with pytest.raises(CodecError) as raised:
        decode_step_response(data)
    assert fragment in str(raised.value)


def test_int_loss_and_metrics_are_read_as_floats():
    # some msgpack writers send 1.0 as the int 1
    data = tamper(
        encode_evaluate_response(EvaluateResponse(n=3, loss=1.0, metrics={})),
        lambda o: o.update(l=1, m={"acc": 1}),
    )
    decoded = decode_evaluate_response(data)
    assert (decoded.loss, decoded.metrics) == (1.0, {"acc": 1.0})
    assert type(decoded.loss) is float


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (setter("n", -1), "eval_res.n: must be in [0,"),
        (setter("n", None), "eval_res.n: expected int, got NoneType"),
        (deleter("m"), "missing field(s) ['m']"),
        (setter("m", {1: 0.5}), "map key"),
    ],
)
def test_malformed_evaluate_response_raises_codec_error(edit: Callable[..., None], fragment: str):
    data = tamper(encode_evaluate_response(EvaluateResponse(n=3, loss=0.1, metrics={})), edit)
    with pytest.raises(CodecError) as raised:
        decode_evaluate_response(data)
    assert fragment in str(raised.value)


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (setter("ids", ["a", "b", "c"]), "pred_req.ids: 3 ids for 4 activation rows"),
        (setter("ids", ["a", "b", "c", 4]), "ids must be str, got int"),
        (setter("ids", "abcd"), "expected an array of str, got str"),
        (setter("ids", []), "must hold 1..65536 ids, got 0"),
        (setter("ids", ["a", "b", "c", "x" * 300]), "max_str_len"),
    ],
)
def test_malformed_predict_request_raises_codec_error(edit: Callable[..., None], fragment: str):
    message = PredictRequest(ids=["a", "b", "c", "d"], chunks=(make_raw(),))
    data = tamper(encode_predict_request(message), edit)
    with pytest.raises(CodecError) as raised:
        decode_predict_request(data)
    assert fragment in str(raised.value)


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (setter("n", 2), "pred_res.n: n=2 rows of scores for 3 ids"),
        (setter("C", 0), "pred_res.C: must be in [1,"),
        (setter("C", 5), "pred_res.y: declared shape (3, 5)"),
        (nan_at_first_float("y", "<f4"), "pred_res.y: holds NaN or Inf"),
    ],
)
def test_malformed_predict_response_raises_codec_error(edit: Callable[..., None], fragment: str):
    data = tamper(encode_predict_response(make_predict_response()), edit)
    with pytest.raises(CodecError) as raised:
        decode_predict_response(data)
    assert fragment in str(raised.value)


def test_evaluate_request_checks_its_digest():
    message = EvaluateRequest(ids_digest=DIGEST, chunks=(make_pq(),))
    data = tamper(encode_evaluate_request(message), setter("h", b"\x00" * 9))
    with pytest.raises(CodecError, match="eval_req.h: expected 8 bytes, got 9"):
        decode_evaluate_request(data)


@pytest.mark.parametrize("data", ["text", None, 42])
def test_non_bytes_input_raises_codec_error(data: object):
    with pytest.raises(CodecError, match="expected bytes"):
        decode_step_request(data)  # type: ignore[arg-type]


def test_codec_error_is_a_value_error():
    assert issubclass(CodecError, ValueError)


# ------------------------------------------------------------------------------------------
# chunks: several independently quantized blocks of rows in one request
# ------------------------------------------------------------------------------------------


def test_chunks_with_their_own_codebooks_round_trip_in_order():
    # Prepare: the horizontal setting, 3 clients' batches of different sizes, one codebook each
    chunks = (make_pq(B=4, seed=0), make_pq(B=2, seed=1), make_pq(B=5, seed=2))
    message = EvaluateRequest(ids_digest=DIGEST, chunks=chunks)

    # Act
    decoded = round_trip(message)

    # Assert
    assert isinstance(decoded, EvaluateRequest)
    assert_same_chunks(decoded.chunks, chunks)
    assert (decoded.rows, decoded.d) == (11, 12)
    assert chunk_rows(decoded.chunks) == [4, 2, 5]


def test_chunk_rows_splits_the_gradient_back_in_chunk_order():
    # Prepare: party B answers with one (rows, d) gradient for the chunks concatenated in order
    request = make_step_request(make_raw(B=3, d=5), make_raw(B=1, d=5, seed=1))
    grad = np.arange(request.rows * request.d, dtype=np.float32).reshape(request.rows, request.d)
    response = decode_step_response(
        encode_step_response(StepResponse(step=3, loss=0.0, metrics={}, grad=grad))
    )

    # Act
    blocks = np.split(response.grad, np.cumsum(chunk_rows(request.chunks))[:-1])

    # Assert
    assert [block.shape for block in blocks] == [(3, 5), (1, 5)]
    np.testing.assert_array_equal(blocks[1], grad[3:])


def test_a_list_of_chunks_is_kept_as_a_tuple():
    message = PredictRequest(ids=["a", "b", "c", "d", "e"], chunks=[make_raw(B=4), make_raw(B=1)])
    assert isinstance(message.chunks, tuple)
    assert (message.rows, message.d) == (5, 12)


@pytest.mark.parametrize(
    ("build", "error", "fragment"),
    [
        (lambda: make_step_request(), ValueError, "at least one chunk"),
        (
            lambda: StepRequest(step=0, batch_digest=DIGEST, chunks=make_pq()),  # type: ignore[arg-type]
            TypeError,
            "got a bare PQActivations: wrap it in a tuple, chunks=(activations,)",
        ),
        (
            lambda: EvaluateRequest(ids_digest=DIGEST, chunks=make_raw()),  # type: ignore[arg-type]
            TypeError,
            "got a bare RawActivations: wrap it in a tuple",
        ),
        (lambda: make_step_request(make_raw(), "x"), TypeError, "chunks[1] must be PQActivations"),
        (
            lambda: StepRequest(step=0, batch_digest=DIGEST, chunks="x"),  # type: ignore[arg-type]
            TypeError,
            "chunks must be a tuple of activations, got str",
        ),
        (
            lambda: make_step_request(make_pq(), make_raw()),
            ValueError,
            "chunks[1]: a 'raw' chunk after a 'pq' chunk 0 (mixing is refused)",
        ),
        (
            lambda: make_step_request(make_raw(d=12), make_raw(d=12), make_raw(d=10)),
            ValueError,
            "chunks[2]: d=10 differs from d=12 of chunk 0",
        ),
        (
            lambda: make_step_request(make_pq(d=12, q=6), make_pq(d=12, q=4)),
            ValueError,
            "chunks[1]: q=4 differs from q=6 of chunk 0 (one quantizer config per run)",
        ),
        (
            lambda: make_step_request(make_pq(R=2), make_pq(R=3)),
            ValueError,
            "chunks[1]: R=3 differs from R=2 of chunk 0",
        ),
        (
            lambda: make_step_request(make_pq(L=3), make_pq(L=4)),
            ValueError,
            "chunks[1]: L=4 differs from L=3 of chunk 0",
        ),
        (
            lambda: PredictRequest(ids=["a"] * 7, chunks=(make_raw(B=4), make_raw(B=4))),
            ValueError,
            "7 ids for 8 activation rows",
        ),
    ],
)
def test_requests_refuse_chunks_that_do_not_fit_together(
    build: Callable[[], object], error: type[Exception], fragment: str
):
    with pytest.raises(error) as raised:
        build()
    assert fragment in str(raised.value)


# (id, bytes of a step request, fragment of the CodecError message)
MALFORMED_CHUNKS: list[tuple[str, Callable[[], bytes], str]] = [
    (
        "mixed kinds",
        lambda: spliced_step_bytes(make_pq(), make_raw()),
        "step_req.a[1].k: a 'raw' chunk after a 'pq' chunk 0 (mixing is refused)",
    ),
    (
        "mismatched d",
        lambda: spliced_step_bytes(make_raw(d=12), make_raw(d=10)),
        "step_req.a[1].d: d=10 differs from d=12 of chunk 0",
    ),
    (
        "mismatched q",
        lambda: spliced_step_bytes(make_pq(q=6, R=1), make_pq(q=4, R=1)),
        "step_req.a[1].q: q=4 differs from q=6 of chunk 0 (one quantizer config per run)",
    ),
    (
        "mismatched R",
        lambda: spliced_step_bytes(make_pq(R=2), make_pq(R=3)),
        "step_req.a[1].R: R=3 differs from R=2 of chunk 0",
    ),
    (
        "mismatched L in a third chunk",
        lambda: spliced_step_bytes(make_pq(L=3), make_pq(L=3, seed=1), make_pq(L=5)),
        "step_req.a[2].L: L=5 differs from L=3 of chunk 0",
    ),
    (
        "a malformed later chunk",
        lambda: tamper(
            spliced_step_bytes(make_pq(), make_pq(seed=1)), lambda o: o["a"][1].update(B=0)
        ),
        "step_req.a[1].B: must be in [1, 65536], got 0",
    ),
    (
        "too many chunks",
        lambda: spliced_step_bytes(*[make_raw(B=1, d=1)] * 4097),
        "step_req.a: must hold 1..4096 chunks, got 4097",
    ),
    (
        # L = 1 chunks send no codeword bytes, so their rows cost nothing on the wire
        "total rows over max_batch",
        lambda: tamper(
            spliced_step_bytes(make_pq(L=1), make_pq(L=1)),
            lambda o: [chunk.update(B=40_000) for chunk in o["a"]],
        ),
        "step_req.a: 80000 rows in 2 chunk(s), over the limit 65536",
    ),
    (
        # each chunk's B*d is under max_elements, the (rows, d) party B builds is not
        "total rows*d over max_elements",
        lambda: tamper(
            spliced_step_bytes(make_raw(), make_raw()),
            lambda o: [chunk.update(B=30_000, d=1200) for chunk in o["a"]],
        ),
        "step_req.a: rows*d has 72000000 elements, over the limit 67108864",
    ),
]


@pytest.mark.parametrize(
    ("build", "fragment"),
    [case[1:] for case in MALFORMED_CHUNKS],
    ids=[case[0] for case in MALFORMED_CHUNKS],
)
def test_chunks_that_do_not_fit_together_raise_codec_error(
    build: Callable[[], bytes], fragment: str
):
    # Prepare
    data = build()

    # Act / Assert
    with pytest.raises(CodecError) as raised:
        decode_step_request(data)
    assert fragment in str(raised.value)


def test_ids_must_match_the_rows_of_all_chunks():
    # Prepare
    message = PredictRequest(ids=list("abcdefg"), chunks=(make_raw(B=4), make_raw(B=3)))
    data = tamper(encode_predict_request(message), setter("ids", list("abcdef")))

    # Act / Assert
    assert decode_predict_request(encode_predict_request(message)).rows == 7
    with pytest.raises(CodecError, match="pred_req.ids: 6 ids for 7 activation rows"):
        decode_predict_request(data)


# ------------------------------------------------------------------------------------------
# limits: absurd declared shapes fail before anything large is allocated
# ------------------------------------------------------------------------------------------


def peak_allocation(action: Callable[[], object]) -> int:
    """Bytes of peak traced allocation while running ``action`` (numpy buffers included)."""
    tracemalloc.start()
    try:
        action()
    except CodecError:
        pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


@pytest.mark.parametrize(
    "edit",
    [
        # beyond the default limits
        lambda o: o["a"][0].update(B=2**40),
        # within per-field limits, L = 1 makes the codewords zero bytes for any B x q: only
        # the element limit stands between these 2**32 codes and a 32 GiB int64 array
        lambda o: o["a"][0].update(B=65_536, d=65_536, q=65_536, R=1, L=1, b=0, cw=b""),
    ],
)
def test_absurd_declared_shapes_fail_fast_without_allocating(edit: Callable[..., None]):
    # Prepare
    data = tamper(pq_step_bytes(), edit)

    # Act
    peak = peak_allocation(lambda: decode_step_request(data))

    # Assert
    with pytest.raises(CodecError):
        decode_step_request(data)
    assert peak < 64 * 1024


def test_shape_checks_hold_even_with_limits_lifted():
    # Prepare: limits so generous that only the byte count can catch B = 2**40
    lifted = DecodeLimits(max_batch=2**62, max_elements=2**62)
    data = tamper(raw_step_bytes(), lambda o: o["a"][0].update(B=2**40))

    # Act
    peak = peak_allocation(lambda: decode_step_request(data, limits=lifted))

    # Assert
    with pytest.raises(CodecError, match="needs 52776558133248 bytes, got 192"):
        decode_step_request(data, limits=lifted)
    assert peak < 64 * 1024


def test_custom_limits_are_enforced():
    # Prepare
    message = make_step_request(make_raw(B=20, d=10), step=0)
    # float16 keeps the 400-byte bin under msgpack's own bin limit (4 bytes per element)
    data = encode_step_request(message, activations_dtype="float16")

    # Act / Assert
    assert decode_step_request(data, limits=DecodeLimits(max_elements=200)).step == 0
    with pytest.raises(CodecError, match="must be in \\[1, 10\\], got 20"):
        decode_step_request(data, limits=DecodeLimits(max_batch=10))
    with pytest.raises(CodecError, match="rows\\*d has 200 elements, over the limit 199"):
        decode_step_request(data, limits=DecodeLimits(max_elements=199))


def test_chunk_limits_are_enforced():
    # Prepare: 3 chunks of 4 rows
    data = encode_step_request(make_step_request(*(make_raw(B=4, seed=i) for i in range(3))))

    # Act / Assert
    assert len(decode_step_request(data, limits=DecodeLimits(max_chunks=3)).chunks) == 3
    with pytest.raises(CodecError, match="step_req.a: must hold 1..2 chunks, got 3"):
        decode_step_request(data, limits=DecodeLimits(max_chunks=2))
    with pytest.raises(
        CodecError, match="step_req.a: 12 rows in 3 chunk\\(s\\), over the limit 10"
    ):
        decode_step_request(data, limits=DecodeLimits(max_batch=10))


def test_msgpack_array_bound_admits_both_ids_and_chunks():
    # Prepare: 6 ids in 1 chunk, and 1 row in each of 6 chunks
    ids = encode_predict_request(PredictRequest(ids=list("abcdef"), chunks=(make_raw(B=6),)))
    chunks = encode_step_request(make_step_request(*[make_raw(B=1)] * 6))

    # Act / Assert: msgpack's own array length limit is the larger of the two limits
    assert decode_predict_request(ids, limits=DecodeLimits(max_batch=6, max_chunks=1)).rows == 6
    assert decode_step_request(chunks, limits=DecodeLimits(max_batch=6, max_chunks=6)).rows == 6
    with pytest.raises(CodecError, match="max_array_len"):
        decode_step_request(chunks, limits=DecodeLimits(max_batch=5, max_chunks=5))


def test_many_chunks_of_many_rows_fail_before_any_payload_is_decoded():
    # Prepare: 4096 L = 1 chunks of 65 536 rows each; every chunk alone is within the limits,
    # together they declare 2**28 rows, and decoding their codewords would take 128 GiB
    one = make_pq(B=1, d=16, q=16, R=1, L=1)
    data = tamper(
        spliced_step_bytes(*[one] * 4096),
        lambda o: [chunk.update(B=65_536) for chunk in o["a"]],
    )

    # Act
    peak = peak_allocation(lambda: decode_step_request(data))

    # Assert: what remains is the parsed msgpack maps themselves
    with pytest.raises(CodecError, match="268435456 rows in 4096 chunk"):
        decode_step_request(data)
    assert peak < 8 * 2**20


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_batch": 0},
        {"max_dim": -1},
        {"max_L": 2**16 + 1},
        {"max_metrics": True},
        {"max_chunks": 0},
    ],
)
def test_decode_limits_must_be_sane(kwargs: dict[str, int]):
    with pytest.raises(ValueError, match="DecodeLimits"):
        DecodeLimits(**kwargs)


# ------------------------------------------------------------------------------------------
# encoders and messages refuse what cannot go on the wire (ValueError, never CodecError)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encode", "fragment"),
    [
        (
            lambda: encode_step_response(
                StepResponse(step=0, loss=0.0, metrics={}, grad=np.array([[np.nan]], np.float32))
            ),
            "grad holds NaN or Inf",
        ),
        (
            lambda: encode_step_request(
                make_step_request(RawActivations(np.full((2, 2), 1e6, dtype=np.float32))),
                activations_dtype="float16",
            ),
            "chunks[0].activations holds values beyond the float16 range",
        ),
        (
            lambda: encode_step_request(
                make_step_request(
                    make_pq(L=3),
                    PQActivations(
                        codebook=np.zeros((2, 3, 2), np.float32),
                        codewords=np.array([[0, 1, 2, 0, 1, 3]]),
                    ),
                )
            ),
            "chunks[1].codewords must be < L=3",
        ),
        (
            lambda: encode_step_request(
                make_step_request(
                    PQActivations(
                        codebook=np.zeros((1, 4, 2), np.float32), codewords=np.array([[0, -1]])
                    )
                )
            ),
            "chunks[0].codewords must lie in [0, L=4)",
        ),
        (
            lambda: encode_step_request(make_step_request(make_pq()), codebook_dtype="float64"),
            "must be 'float32' or 'float16'",
        ),
    ],
)
def test_encoders_refuse_unsendable_messages_with_value_error(
    encode: Callable[[], bytes], fragment: str
):
    with pytest.raises(ValueError) as raised:
        encode()
    assert not isinstance(raised.value, CodecError)
    assert fragment in str(raised.value)


@pytest.mark.parametrize(
    ("build", "error", "fragment"),
    [
        (lambda: RawActivations(np.zeros((2, 3))), TypeError, "must be float32"),
        (lambda: RawActivations(np.zeros((0, 3), np.float32)), ValueError, "non-empty"),
        (lambda: RawActivations(np.zeros(3, np.float32)), ValueError, "2 non-empty dimensions"),
        (
            lambda: PQActivations(np.zeros((1, 2, 2), np.float32), np.zeros((2, 3), np.float64)),
            TypeError,
            "integer dtype",
        ),
        (
            lambda: PQActivations(np.zeros((2, 2, 2), np.float32), np.zeros((2, 3), np.int64)),
            ValueError,
            "R=2 codebooks must divide q=3",
        ),
        (
            lambda: StepRequest(step=0, batch_digest=b"short", chunks=(make_raw(),)),
            ValueError,
            "8 bytes",
        ),
        (
            lambda: StepRequest(step=-1, batch_digest=DIGEST, chunks=(make_raw(),)),
            ValueError,
            "step",
        ),
        (
            lambda: StepRequest(step=True, batch_digest=DIGEST, chunks=(make_raw(),)),
            TypeError,
            "bool",
        ),
        (lambda: PredictRequest(ids="ab", chunks=(make_raw(B=2),)), TypeError, "sequence of str"),
        (lambda: EvaluateResponse(n=1, loss="x", metrics={}), TypeError, "real number"),
        (lambda: EvaluateResponse(n=1, loss=0.0, metrics={1: 0.0}), TypeError, "metric names"),
    ],
)
def test_messages_check_their_fields_on_construction(
    build: Callable[[], object], error: type[Exception], fragment: str
):
    with pytest.raises(error, match=fragment):
        build()


def test_messages_coerce_numpy_scalars_to_python_numbers():
    # Prepare / Act
    message = StepResponse(
        step=np.int64(3),
        loss=np.float32(0.25),
        metrics={"acc": np.float64(1)},
        grad=np.ones((1, 1), np.float32),
    )

    # Assert: msgpack can only pack plain Python numbers
    assert type(message.step) is int and type(message.loss) is float
    assert type(message.metrics["acc"]) is float
    assert decode_step_response(encode_step_response(message)).loss == 0.25


def test_envelope_carries_version_and_type_tag():
    obj = msgpack.unpackb(pq_step_bytes(), raw=False)
    assert (obj["v"], obj["t"]) == (WIRE_VERSION, "step_req")
    assert isinstance(obj["a"], list) and len(obj["a"]) == 1
    assert isinstance(obj["a"][0]["cb"], bytes) and isinstance(obj["a"][0]["cw"], bytes)


MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.data())
def test_any_field_replaced_by_any_value_raises_codec_error_or_decodes(
    message: object, data: st.DataObject
):
    # Prepare: structure-aware fuzzing, one field (top level or in a chunk of "a") gets an
    # arbitrary value, or an arbitrary value joins the chunks
    obj = msgpack.unpackb(ENCODER[type(message)](message), raw=False)
    chunks = obj.get("a", [])
    if chunks and data.draw(st.integers(0, 3)) == 0:
        chunks.insert(data.draw(st.integers(0, len(chunks))), data.draw(MSGPACK_VALUES))
    else:
        target = data.draw(st.sampled_from([obj, *chunks]))
        key = data.draw(st.sampled_from(sorted(target)))
        target[key] = data.draw(MSGPACK_VALUES)
    encoded = msgpack.packb(obj, use_bin_type=True)

    # Act / Assert
    try:
        decoded = DECODER[type(message)](encoded)
    except CodecError:
        return
    assert isinstance(decoded, type(message))


# ------------------------------------------------------------------------------------------
# the size formulas of docs/PROTOCOL.md, section 7
# ------------------------------------------------------------------------------------------


def int_width(x: int) -> int:
    return 1 if x < 128 else 2 if x < 256 else 3 if x < 2**16 else 5 if x < 2**32 else 9


def bin_size(n: int) -> int:
    """A msgpack bin (or str) of n bytes, header included."""
    return n + (2 if n < 256 else 3 if n < 2**16 else 5)


def str_size(text: str) -> int:
    n = len(text.encode())
    return n + 1 if n < 32 else bin_size(n)


def container_header(count: int) -> int:
    return 1 if count < 16 else 3


def chunk_size(a: Activations, w: int) -> int:
    if isinstance(a, PQActivations):
        cb = a.R * a.L * (a.d // a.q) * w
        cw = (a.B * a.q * (a.L - 1).bit_length() + 7) // 8
        shape = sum(map(int_width, (a.B, a.d, a.q, a.R, a.L)))
        return 31 + shape + bin_size(cb) + bin_size(cw)
    return 19 + int_width(a.B) + int_width(a.d) + bin_size(a.B * a.d * w)


def chunks_size(chunks: tuple[Activations, ...], w: int) -> int:
    return container_header(len(chunks)) + sum(chunk_size(chunk, w) for chunk in chunks)


def metrics_size(metrics: dict[str, float]) -> int:
    return container_header(len(metrics)) + sum(str_size(k) + 9 for k in metrics)


def ids_size(ids: list[str]) -> int:
    return container_header(len(ids)) + sum(map(str_size, ids))


def documented_size(m: object, w: int) -> int:
    if isinstance(m, StepRequest):
        return 31 + int_width(m.step) + chunks_size(m.chunks, w)
    if isinstance(m, EvaluateRequest):
        return 29 + chunks_size(m.chunks, w)
    if isinstance(m, PredictRequest):
        return 21 + ids_size(m.ids) + chunks_size(m.chunks, w)
    if isinstance(m, StepResponse):
        B, d = m.grad.shape
        shape = int_width(m.step) + int_width(B) + int_width(d)
        return 42 + shape + metrics_size(m.metrics) + bin_size(B * d * w)
    if isinstance(m, EvaluateResponse):
        return 30 + int_width(m.n) + metrics_size(m.metrics)
    assert isinstance(m, PredictResponse)
    n, C = m.scores.shape
    return 31 + ids_size(m.ids) + int_width(n) + int_width(C) + bin_size(n * C * w)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans().flatmap(lambda half: st.tuples(st.just(half), messages(half=half))))
def test_encoded_size_matches_the_documented_formula(case: tuple[bool, object]):
    half, message = case
    options = HALF_OPTIONS[type(message)] if half else {}
    encoded = ENCODER[type(message)](message, **options)
    assert len(encoded) == documented_size(message, 2 if half else 4)


@pytest.mark.parametrize(
    ("d", "rows_per_chunk", "codebook"),
    [(1, 1, None), (8, 1, None), (64, 32, None), (300, 7, None), (64, 32, (1, 512, 8)),
     (64, 16, (1, 256, 8)), (32, 1, (4, 16, 2)), (48, 5, (2, 4, 6))],
)  # fmt: skip
def test_a_predict_request_of_the_ids_the_cut_rule_allows_fits_the_body(
    d: int, rows_per_chunk: int, codebook: tuple[int, int, int] | None
) -> None:
    """PROTOCOL.md 12.8: ``predict_ids_within`` ids, raw float32 rows or PQ codewords with
    the whole (R, L, d/q) codebook in every chunk of ``rows_per_chunk`` rows (large ones
    too: more centroids than a chunk has rows), encode to at most the body's bytes."""
    body = 120_000
    c = 0 if codebook is None else codebook[0] * codebook[1] * codebook[2]
    n = predict_ids_within(body, [(d, c), (1, 0)], rows_per_chunk)
    rng = np.random.default_rng(d)
    chunks: list[Activations] = []
    for at in range(0, n, rows_per_chunk):
        rows = min(rows_per_chunk, n - at)
        if codebook is None:
            chunks.append(RawActivations(rng.standard_normal((rows, d)).astype(np.float32)))
        else:
            r, L, sub = codebook
            words = rng.integers(0, L, (rows, d // sub))
            book = rng.standard_normal((r, L, sub)).astype(np.float32)
            chunks.append(PQActivations(codebook=book, codewords=words))
    message = PredictRequest(ids=["ab" * 32] * n, chunks=chunks)
    assert n > 1 and len(encode_predict_request(message)) <= body
    assert predict_ids_within(body, [(10**9, 0)], 32) == 1  # never zero: one id at least
