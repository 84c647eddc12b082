"""Downlink representations: parse, round trip, determinism, byte accounting, hostile input."""

import msgpack
import numpy as np
import pytest

from shared import codec
from shared.codec import CodecError
from shared.wire.downlink import DownlinkSpec, encode_gradient, roundtrip

SPECS = [
    "float32",
    "float16",
    "bfloat16",
    "int8",
    "int4",
    "int2",
    "int1",
    "topk:k=5",
    "pq:q=8,L=4",
    "pq:q=4,L=2,R=2,cb=f2",
]


def _grad(B: int = 6, d: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, d)) * 1e-3).astype(np.float32)


def _response(grad: np.ndarray) -> codec.StepResponse:
    return codec.StepResponse(step=3, loss=0.5, metrics={"accuracy": 0.25}, grad=grad)


@pytest.mark.parametrize("text", SPECS)
def test_spec_strings_round_trip(text: str) -> None:
    spec = DownlinkSpec.from_string(text)
    assert DownlinkSpec.from_string(spec.to_string()) == spec
    assert spec.to_string() == text


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("int3", "bits"),
        ("gzip", "unknown downlink"),
        ("topk", "k >= 1"),
        ("topk:k=0", "k >= 1"),
        ("topk:q=4", "takes k"),
        ("pq:q=4", "L"),
        ("pq:q=4,L=2,R=3", "R=3"),
        ("float16:k=1", "unknown downlink"),
        ("pq:q=4,L=2,cb=f8", "cb"),
    ],
)
def test_bad_spec_strings_are_refused_with_a_reason(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        DownlinkSpec.from_string(text)


@pytest.mark.parametrize("text", SPECS)
def test_every_representation_round_trips_through_a_step_response(text: str) -> None:
    spec = DownlinkSpec.from_string(text)
    grad = _grad()
    data = codec.encode_step_response(_response(grad), downlink=spec, seed=7)
    decoded = codec.decode_step_response(data)

    assert decoded.grad.shape == grad.shape and decoded.grad.dtype == np.float32
    np.testing.assert_array_equal(decoded.grad, roundtrip(grad, spec, 7))
    assert (decoded.step, decoded.loss, decoded.metrics) == (3, 0.5, {"accuracy": 0.25})
    error = np.linalg.norm(decoded.grad - grad) / np.linalg.norm(grad)
    bounds = {"float32": 0, "float16": 1e-3, "bfloat16": 4e-3, "int8": 0.02, "int1": 0.8}
    assert error <= bounds.get(text, 1.0)


@pytest.mark.parametrize("text", SPECS)
def test_same_gradient_and_seed_give_the_same_bytes(text: str) -> None:
    spec = DownlinkSpec.from_string(text)
    first = codec.encode_step_response(_response(_grad()), downlink=spec, seed=11)
    again = codec.encode_step_response(_response(_grad()), downlink=spec, seed=11)
    assert first == again


@pytest.mark.parametrize("text", ["int4", "int2", "pq:q=8,L=4"])
def test_the_seed_is_what_varies_the_random_representations(text: str) -> None:
    spec = DownlinkSpec.from_string(text)
    grad = _grad(B=8, d=32)
    assert roundtrip(grad, spec, 1).tobytes() != roundtrip(grad, spec, 2).tobytes()


def test_stochastic_rounding_is_unbiased() -> None:
    grad = _grad(B=1, d=64)
    spec = DownlinkSpec.from_string("int2")
    mean = np.mean([roundtrip(grad, spec, seed) for seed in range(400)], axis=0)
    scale = np.abs(grad).max()
    assert np.abs(mean - grad).max() < 0.15 * scale  # 400 draws: a few standard errors


def test_the_original_representations_keep_their_bytes() -> None:
    grad = _grad()
    for dtype in ("float32", "float16"):
        spec = DownlinkSpec.from_string(dtype)
        assert codec.encode_step_response(
            _response(grad), downlink=spec
        ) == codec.encode_step_response(_response(grad), grad_dtype=dtype)  # type: ignore[arg-type]
    tag = "f2"
    data = msgpack.unpackb(codec.encode_step_response(_response(grad), grad_dtype="float16"))
    assert list(data) == ["v", "t", "s", "l", "m", "B", "d", "dt", "g"] and data["dt"] == tag


@pytest.mark.parametrize(
    ("text", "payload_bytes"),
    [
        ("float32", 6 * 16 * 4),
        ("bfloat16", 6 * 16 * 2),
        ("int8", 6 * 16 + 6 * 4),
        ("int2", 6 * 16 // 4 + 6 * 4),
        ("int1", 6 * 16 // 8 + 6 * 4),
        ("topk:k=5", (6 * 5 * 4 + 7) // 8 + 6 * 5 * 2),  # 4-bit indices for d=16
        ("pq:q=8,L=4", 4 * 2 * 4 + 6 * 8 * 2 // 8),
    ],
)
def test_payload_bytes_are_what_the_protocol_counts(text: str, payload_bytes: int) -> None:
    fields = encode_gradient(_grad(), DownlinkSpec.from_string(text), 0)
    inner = fields.get("gr", fields)
    blobs = sum(len(v) for v in inner.values() if isinstance(v, bytes))
    assert blobs == payload_bytes


def test_topk_keeps_the_largest_entries_exactly_up_to_bfloat16() -> None:
    grad = np.array([[0.0, -5.0, 1.0, 4.0, -0.5]], dtype=np.float32)
    out = roundtrip(grad, DownlinkSpec.from_string("topk:k=2"), 0)
    np.testing.assert_array_equal(out, [[0.0, -5.0, 0.0, 4.0, 0.0]])


def test_one_bit_is_the_sign_times_the_mean_magnitude() -> None:
    grad = np.array([[1.0, -3.0, 0.0, 2.0]], dtype=np.float32)
    out = roundtrip(grad, DownlinkSpec.from_string("int1"), 0)
    np.testing.assert_array_equal(out, [[1.5, -1.5, -1.5, 1.5]])


def test_a_zero_gradient_survives_every_representation() -> None:
    zero = np.zeros((3, 8), dtype=np.float32)
    for text in ["int8", "int1", "topk:k=2", "pq:q=4,L=2", "bfloat16"]:
        assert not roundtrip(zero, DownlinkSpec.from_string(text), 0).any(), text


def test_a_gradient_wider_than_the_spec_allows_is_refused_by_the_encoder() -> None:
    with pytest.raises(ValueError, match="q=8 must divide d=12"):
        encode_gradient(_grad(d=12), DownlinkSpec.from_string("pq:q=8,L=2"), 0)
    with pytest.raises(ValueError, match="keeps more"):
        encode_gradient(_grad(d=4), DownlinkSpec.from_string("topk:k=5"), 0)


def _tampered(text: str, **changes: object) -> bytes:
    data = codec.encode_step_response(_response(_grad()), downlink=DownlinkSpec.from_string(text))
    message = msgpack.unpackb(data)
    message["gr"].update(changes)
    return bytes(msgpack.packb(message, use_bin_type=True))


@pytest.mark.parametrize(
    ("text", "changes", "fragment"),
    [
        ("int2", {"b": 3}, "must be one of"),
        ("int2", {"g": b"\xff" * 24}, "code 3 > 2"),
        ("int2", {"sc": np.full(6, -1, "<f4").tobytes()}, ">= 0"),
        ("int8", {"g": b"\x00"}, "expected 96 bytes"),
        ("topk:k=5", {"K": 17}, "must be in"),
        ("topk:k=5", {"i": bytes(15)}, "strictly ascending"),
        ("bfloat16", {"g": b"\x80\x7f" * 96}, "NaN or Inf"),
        ("pq:q=8,L=4", {"q": 5}, "must divide"),
        ("pq:q=8,L=4", {"b": 3}, "needs 2 bits"),
        ("pq:q=8,L=4", {"k": "zstd"}, "unknown gradient kind"),
        ("pq:q=8,L=4", {"extra": 1}, "unexpected field"),
    ],
)
def test_malformed_compressed_gradients_are_codec_errors(
    text: str, changes: dict[str, object], fragment: str
) -> None:
    with pytest.raises(CodecError, match=fragment):
        codec.decode_step_response(_tampered(text, **changes))


def test_a_message_with_both_gradient_forms_is_refused() -> None:
    data = codec.encode_step_response(_response(_grad()), downlink=DownlinkSpec.from_string("int8"))
    message = msgpack.unpackb(data)
    message["g"] = b""
    with pytest.raises(CodecError, match="unexpected field"):
        codec.decode_step_response(msgpack.packb(message, use_bin_type=True))


def _i(x: int) -> int:
    return 1 if x < 128 else 2 if x < 256 else 3 if x < 65536 else 5


def _hdr(n: int) -> int:
    return 2 if n <= 255 else 3 if n <= 65535 else 5


def _documented_size(text: str, B: int, d: int) -> int:
    """docs/PROTOCOL.md section 7: a StepResponse with {"accuracy": ...} at step 3."""
    spec = DownlinkSpec.from_string(text)
    head = 1 + 10 + len("accuracy") + _i(3) + _i(B) + _i(d)
    if spec.kind in ("float32", "float16"):
        P = B * d * (4 if spec.kind == "float32" else 2)
        return 42 + head + _hdr(P) + P
    if spec.kind == "bfloat16":
        G = 10 + _hdr(2 * B * d) + 2 * B * d
    elif spec.kind == "int":
        P = -(-B * d * spec.bits // 8)
        G = 15 + _hdr(4 * B) + 4 * B + _hdr(P) + P
    elif spec.kind == "topk":
        P_i, P_v = -(-B * spec.k * (d - 1).bit_length() // 8), 2 * B * spec.k
        G = 14 + _i(spec.k) + _hdr(P_i) + P_i + _hdr(P_v) + P_v
    else:
        P_cb = spec.R * spec.L * (d // spec.q) * (2 if spec.cb == "f2" else 4)
        P_cw = -(-B * spec.q * (spec.L - 1).bit_length() // 8)
        G = 27 + _i(spec.q) + _i(spec.R) + _i(spec.L) + _hdr(P_cb) + P_cb + _hdr(P_cw) + P_cw
    return 37 + head + G


@pytest.mark.parametrize("text", [*SPECS, "topk:k=200", "pq:q=64,L=300,R=2"])
@pytest.mark.parametrize(("B", "d"), [(6, 16), (40, 256), (200, 128)])
def test_the_documented_sizes_are_the_encoded_lengths(text: str, B: int, d: int) -> None:
    if d % 64 and "q=64" in text:
        pytest.skip("q=64 needs d divisible by 64")
    spec = DownlinkSpec.from_string(text)
    if spec.kind == "topk" and spec.k > d:
        pytest.skip("k > d")
    if spec.kind == "pq" and spec.L > B * spec.q // spec.R:
        pytest.skip("more codewords than points")
    grad = _grad(B=B, d=d)
    data = codec.encode_step_response(_response(grad), downlink=spec, seed=1)
    assert len(data) == _documented_size(text, B, d)
