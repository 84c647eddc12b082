"""Compressed gradient representations of a StepResponse: the ``gr`` map, one kind per map.

Every function here maps a finite float32 ``(B, d)`` gradient to a msgpack map and back.
``shared.wire.downlink`` chooses the kind from a run's ``DownlinkSpec``; docs/PROTOCOL.md
section 3 describes the bytes. The float32 and float16 representations are not here: they
are the original ``dt`` / ``g`` fields of a StepResponse, whose bytes are unchanged.

Kinds (``k``)::

    "bf16"  bfloat16: the high 16 bits of each float32, round to nearest even      16 bits
    "int"   b-bit integer levels times a float32 scale per row (b in 1, 2, 4, 8)     b bits
    "topk"  the K largest-magnitude entries of each row: packed indices, bf16 values
    "pq"    the project's grouped product quantizer applied to the gradient rows

Encoding is a pure function of (gradient, parameters, seed): the stochastic rounding of the
integer kinds and the k-means of "pq" draw from the seed only, so a step encoded again gives
the same bytes.
"""

from typing import Any, Final

import numpy as np
import torch
from numpy.typing import NDArray

from shared.pq.quantizer import GroupedProductQuantizer, PQCode, PQConfig
from shared.wire.arrays import RangeError, all_finite, float_bin
from shared.wire.bitpack import bits_for, pack_codes, packed_nbytes, unpack_codes
from shared.wire.reader import CodecError, DecodeLimits, Fields

__all__ = [
    "INT_BITS",
    "bf16_bytes",
    "bf16_from_bytes",
    "gradient_from_wire",
    "int_to_wire",
    "pq_to_wire",
    "topk_to_wire",
    "bf16_to_wire",
]

INT_BITS: Final = (1, 2, 4, 8)  # widths of the "int" kind
_KEYS: Final = {
    "bf16": frozenset({"k", "g"}),
    "int": frozenset({"k", "b", "sc", "g"}),
    "topk": frozenset({"k", "K", "i", "v"}),
    "pq": frozenset({"k", "q", "R", "L", "b", "dt", "cb", "cw"}),
}


# ------------------------------------------------------------------------------------------
# bfloat16
# ------------------------------------------------------------------------------------------


def bf16_bytes(array: NDArray[np.float32], name: str) -> bytes:
    """Little-endian bfloat16 of a finite float32 array, rounded to nearest even.

    Raises ``RangeError`` when a finite value rounds up past the bfloat16 range (|x| above
    about 3.39e38): the sender falls back to float32.
    """
    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round half to even on bit 16
    half = rounded.astype("<u2")
    if int((half & 0x7FFF).max(initial=0)) >= 0x7F80:
        raise RangeError(f"{name} holds values beyond the bfloat16 range")
    return half.tobytes()


def bf16_from_bytes(data: bytes, count: int) -> NDArray[np.float32]:
    """``count`` float32 values from little-endian bfloat16 bytes (exact: zero low bits)."""
    half = np.frombuffer(data, dtype="<u2", count=count)
    return (half.astype(np.uint32) << 16).view(np.float32)


def bf16_to_wire(grad: NDArray[np.float32]) -> dict[str, Any]:
    """The "bf16" map of a (B, d) gradient: 2 bytes per value, row-major."""
    return {"k": "bf16", "g": bf16_bytes(grad, "grad")}


# ------------------------------------------------------------------------------------------
# b-bit integers with a scale per row
# ------------------------------------------------------------------------------------------


def _levels(bits: int) -> int:
    """m: codes stand for the integers -m..m (b >= 2) or for -1, +1 (b == 1)."""
    return 1 if bits == 1 else (1 << (bits - 1)) - 1


def int_to_wire(grad: NDArray[np.float32], bits: int, seed: int) -> dict[str, Any]:
    """The "int" map: per row a float32 scale s and b-bit codes c; value = s * level(c).

    b >= 2: level(c) = c - m with m = 2**(b-1) - 1 and s = max|row| / m, so the levels are
    -m..m (code 2**b - 1 is never used); b == 8 rounds to nearest, b = 2 and 4 round
    stochastically (unbiased: E[decoded] = grad) with uniforms drawn from ``seed``.
    b == 1 is the scaled sign: level(c) = 2c - 1, c = 1 where g > 0, s = mean|row| (the
    least-squares scale of a sign vector; unbiased 1-bit rounding has several times its error).
    """
    if bits not in INT_BITS:
        raise ValueError(f"int gradients take {INT_BITS} bits, got {bits}")
    if bits == 1:
        scale = np.abs(grad).mean(axis=1, dtype=np.float64).astype(np.float32)  # (B,)
        codes = (grad > 0).astype(np.int64)
    else:
        m = _levels(bits)
        scale = (np.abs(grad).max(axis=1) / m).astype(np.float32)  # (B,)
        safe = np.where(scale > 0, scale, np.float32(1))[:, None]
        x = np.clip(grad / safe, -m, m)  # (B, d) in [-m, m]
        if bits == 8:
            levels = np.rint(x)
        else:
            uniforms = np.random.default_rng(seed).random(grad.shape, dtype=np.float32)
            levels = np.floor(x + uniforms)
        codes = np.clip(levels + m, 0, 2 * m).astype(np.int64)
    tag, scales = float_bin(scale, "float32", "grad scales")
    return {"k": "int", "b": bits, "sc": scales, "g": pack_codes(codes, bits)}


def _int_from_wire(f: Fields, B: int, d: int) -> NDArray[np.float32]:
    bits = f.get_int("b", 1, 8)
    if bits not in INT_BITS:
        raise f.fail("b", f"must be one of {INT_BITS}, got {bits}")
    scale = f.get_float_array("sc", np.dtype("<f4"), (B,))
    if float(scale.min()) < 0:
        raise f.fail("sc", "scales must be >= 0")
    codes = _unpack(f, "g", B * d, bits).reshape(B, d)
    m = _levels(bits)
    if bits > 1 and int(codes.max()) > 2 * m:
        raise f.fail("g", f"code {int(codes.max())} > {2 * m} (levels are -{m}..{m})")
    levels = codes.astype(np.float32) * 2 - 1 if bits == 1 else codes.astype(np.float32) - m
    out: NDArray[np.float32] = levels * scale[:, None]
    return out


# ------------------------------------------------------------------------------------------
# top-k per row
# ------------------------------------------------------------------------------------------


def topk_to_wire(grad: NDArray[np.float32], k: int) -> dict[str, Any]:
    """The "topk" map: per row the ``k`` largest |values| (ties: the lower index), the rest 0.

    ``i``: B*K indices, each row's ascending, bit-packed at bits_for(d) bits; ``v``: their
    values as bfloat16, in the same order.
    """
    B, d = grad.shape
    if not 1 <= k <= d:
        raise ValueError(f"topk needs 1 <= k <= d={d}, got k={k}")
    # a stable sort on -|g| puts ties in index order, so the choice is deterministic
    chosen = np.argsort(-np.abs(grad), axis=1, kind="stable")[:, :k]
    chosen.sort(axis=1)
    values = np.take_along_axis(grad, chosen, axis=1)
    return {
        "k": "topk",
        "K": k,
        "i": pack_codes(chosen, bits_for(d)),
        "v": bf16_bytes(values, "grad values"),
    }


def _topk_from_wire(f: Fields, B: int, d: int) -> NDArray[np.float32]:
    k = f.get_int("K", 1, d)
    index = _unpack(f, "i", B * k, bits_for(d)).reshape(B, k).astype(np.int64)
    if k > 1 and bool((np.diff(index, axis=1) <= 0).any()):
        raise f.fail("i", "each row's indices must be strictly ascending")
    if int(index.max()) >= d:
        raise f.fail("i", f"index {int(index.max())} >= d={d}")
    values = _bf16_field(f, "v", B * k).reshape(B, k)
    out = np.zeros((B, d), dtype=np.float32)
    np.put_along_axis(out, index, values, axis=1)
    return out


# ------------------------------------------------------------------------------------------
# product quantization
# ------------------------------------------------------------------------------------------


def pq_to_wire(
    grad: NDArray[np.float32], config: PQConfig, seed: int, *, codebook_dtype: str
) -> dict[str, Any]:
    """The "pq" map: the gradient rows quantized like activations (one codebook for all
    rows); ``cb`` (R, L, d/q) floats tagged by ``dt``, ``cw`` the B*q codewords packed at
    bits_for(L) bits. The k-means is seeded by ``seed``."""
    d = grad.shape[1]
    quantizer = GroupedProductQuantizer(d, config)
    code = quantizer.encode(torch.from_numpy(np.ascontiguousarray(grad)), seed=seed)
    bits = bits_for(config.L)
    tag, codebook = float_bin(
        code.codebook.numpy(),
        "float16" if codebook_dtype == "float16" else "float32",
        "grad codebook",
    )
    return {
        "k": "pq",
        "q": config.q,
        "R": config.R,
        "L": config.L,
        "b": bits,
        "dt": tag,
        "cb": codebook,
        "cw": pack_codes(code.codewords.numpy(), bits),
    }


def _pq_from_wire(f: Fields, B: int, d: int, limits: DecodeLimits) -> NDArray[np.float32]:
    q = f.get_int("q", 1, min(d, limits.max_q))
    R = f.get_int("R", 1, limits.max_groups)
    L = f.get_int("L", 1, limits.max_L)
    bits = f.get_int("b", 0, 16)
    if d % q or q % R:
        raise CodecError(f"{f.where}: q={q} must divide d={d} and R={R} must divide q")
    if bits != bits_for(L):
        raise f.fail("b", f"L={L} needs {bits_for(L)} bits per codeword, got {bits}")
    f.check_elements("codebook R*L*(d/q)", R * L * (d // q), limits)
    codebook = f.get_float_array("cb", f.get_dtype("dt"), (R, L, d // q))
    codes = _unpack(f, "cw", B * q, bits).reshape(B, q)
    if codes.size and int(codes.max()) >= L:
        raise f.fail("cw", f"codeword {int(codes.max())} >= L={L}")
    quantizer = GroupedProductQuantizer(d, PQConfig(q=q, L=L, R=R))
    code = PQCode(torch.from_numpy(codebook), torch.from_numpy(codes.astype(np.int64)))
    decoded: NDArray[np.float32] = quantizer.decode(code).numpy()
    return decoded


# ------------------------------------------------------------------------------------------
# decoding
# ------------------------------------------------------------------------------------------


def gradient_from_wire(obj: object, where: str, B: int, d: int, limits: DecodeLimits) -> Any:
    """The (B, d) float32 gradient of a ``gr`` map; CodecError for anything malformed.

    The caller has checked B*d against the limits.
    """
    if not isinstance(obj, dict):
        raise CodecError(f"{where}: expected a map, got {type(obj).__name__}")
    kind = obj.get("k")
    if not isinstance(kind, str) or kind not in _KEYS:
        raise CodecError(f"{where}.k: unknown gradient kind {kind!r} (expected {list(_KEYS)})")
    f = Fields(obj, where, _KEYS[kind])
    if kind == "bf16":
        grad = _bf16_field(f, "g", B * d).reshape(B, d)
    elif kind == "int":
        grad = _int_from_wire(f, B, d)
    elif kind == "topk":
        grad = _topk_from_wire(f, B, d)
    else:
        grad = _pq_from_wire(f, B, d, limits)
    if not all_finite(grad):
        raise CodecError(f"{where}: the decoded gradient holds NaN or Inf values")
    return np.ascontiguousarray(grad, dtype=np.float32)


def _unpack(f: Fields, key: str, count: int, bits: int) -> NDArray[np.uint16]:
    packed = f.get_bin(key, packed_nbytes(count, bits))
    try:
        return unpack_codes(packed, count, bits)
    except ValueError as exc:
        raise f.fail(key, str(exc)) from None


def _bf16_field(f: Fields, key: str, count: int) -> NDArray[np.float32]:
    data = f.get_bin(key, 2 * count)
    values = bf16_from_bytes(data, count)
    if not all_finite(values):
        raise f.fail(key, "holds NaN or Inf values")
    return values
