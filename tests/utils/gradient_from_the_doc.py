"""A StepResponse's gradient decoded from docs/PROTOCOL.md sections 3, 4.2 and 4.2.1 alone.

An outside implementer's view: msgpack and struct, no numpy and nothing from shared/.
tests/contract/test_conformance.py runs it on every downlink vector.
"""

import struct
from typing import Any

import msgpack


def unpack_bits(data: bytes, count: int, bits: int) -> list[int]:
    """Section 3: ``count`` codes of ``bits`` bits, most significant bit first."""
    number = int.from_bytes(data, "big")
    total = len(data) * 8
    mask = (1 << bits) - 1
    return (
        [(number >> (total - (i + 1) * bits)) & mask for i in range(count)] if bits else [0] * count
    )


def f32(x: float) -> float:
    """x rounded to float32 (the product of two float32s is exact in a Python float)."""
    value: float = struct.unpack("<f", struct.pack("<f", x))[0]
    return value


def bfloat16(data: bytes) -> list[float]:
    halves = struct.unpack(f"<{len(data) // 2}H", data)
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]


def floats(data: bytes, tag: str) -> list[float]:
    code = {"f4": "f", "f2": "e"}[tag]
    return list(struct.unpack(f"<{len(data) // struct.calcsize(code)}{code}", data))


def gradient(message: bytes) -> list[list[float]]:
    """The (B, d) gradient of an encoded StepResponse, as rows of Python floats."""
    m: dict[str, Any] = msgpack.unpackb(message, raw=False)
    B, d = m["B"], m["d"]
    if "gr" not in m:
        flat = floats(m["g"], m["dt"])
    else:
        flat = _compressed(m["gr"], B, d)
    return [flat[r * d : (r + 1) * d] for r in range(B)]


def _compressed(gr: dict[str, Any], B: int, d: int) -> list[float]:
    kind = gr["k"]
    if kind == "bf16":
        return bfloat16(gr["g"])
    if kind == "int":
        b, scales = gr["b"], floats(gr["sc"], "f4")
        codes = unpack_bits(gr["g"], B * d, b)
        m = (1 << (b - 1)) - 1
        level = (lambda c: 2 * c - 1) if b == 1 else (lambda c: c - m)
        return [f32(scales[i // d] * level(c)) for i, c in enumerate(codes)]
    if kind == "topk":
        K = gr["K"]
        index = unpack_bits(gr["i"], B * K, (d - 1).bit_length())
        values = bfloat16(gr["v"])
        out = [0.0] * (B * d)
        for n, (i, v) in enumerate(zip(index, values, strict=True)):
            out[(n // K) * d + i] = v
        return out
    assert kind == "pq"
    q, R, L = gr["q"], gr["R"], gr["L"]
    s = d // q
    codebook = floats(gr["cb"], gr["dt"])  # (R, L, s) row-major
    codes = unpack_bits(gr["cw"], B * q, (L - 1).bit_length())
    out = []
    for n, c in enumerate(codes):
        group = (n % q) // (q // R)
        start = (group * L + c) * s
        out += codebook[start : start + s]
    return out
