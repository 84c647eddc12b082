"""The msgpack messages of docs/PROTOCOL.md sections 1-4 that party A sends and reads."""

from typing import Any

import msgpack
import numpy as np

__all__ = [
    "compressed_gradient",
    "decode",
    "read_step_request",
    "unpack_codewords",
    "evaluate_request",
    "pack_codewords",
    "pq_chunk",
    "predict_request",
    "raw_chunk",
    "step_request",
]

VERSION = 1
_DTYPES = {"f4": "<f4", "f2": "<f2"}


def pack_codewords(codewords: np.ndarray, L: int) -> bytes:
    """Section 3: the (B, q) codewords row-major, b = ceil(log2 L) bits each, most
    significant bit first, zero-padded to a whole byte; b = 0 (L = 1) is empty."""
    bits = (L - 1).bit_length()
    if bits == 0:
        return b""
    flat = codewords.astype(np.uint32).reshape(-1)
    stream = (flat[:, None] >> np.arange(bits - 1, -1, -1, dtype=np.uint32)) & 1
    return np.packbits(stream.astype(np.uint8).reshape(-1)).tobytes()  # pads with zeros


def pq_chunk(codebook: np.ndarray, codewords: np.ndarray) -> dict[str, Any]:
    """Section 2.3: codebook (R, L, d/q) float32, codewords (B, q) ints < L."""
    R, L, width = codebook.shape
    B, q = codewords.shape
    return {
        "k": "pq",
        "B": B,
        "d": q * width,
        "q": q,
        "R": R,
        "L": L,
        "b": (L - 1).bit_length(),
        "dt": "f4",
        "cb": np.ascontiguousarray(codebook, dtype="<f4").tobytes(),
        "cw": pack_codewords(codewords, L),
    }


def raw_chunk(x: np.ndarray) -> dict[str, Any]:
    """Section 2.4: (B, d) float32 activations."""
    B, d = x.shape
    return {"k": "raw", "B": B, "d": d, "dt": "f4", "x": np.ascontiguousarray(x, "<f4").tobytes()}


def _pack(fields: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb({"v": VERSION, **fields}, use_bin_type=True)
    return packed


def step_request(step: int, h: bytes, chunks: list[dict[str, Any]]) -> bytes:
    return _pack({"t": "step_req", "s": step, "h": h, "a": chunks})


def evaluate_request(h: bytes, chunks: list[dict[str, Any]]) -> bytes:
    return _pack({"t": "eval_req", "h": h, "a": chunks})


def predict_request(ids_hex: list[str], chunks: list[dict[str, Any]]) -> bytes:
    return _pack({"t": "pred_req", "ids": ids_hex, "a": chunks})


def decode(body: bytes, expected_type: str) -> dict[str, Any]:
    """One message of ``expected_type``; float arrays (``g``, ``y``) become float32 arrays."""
    message: dict[str, Any] = msgpack.unpackb(body, raw=False, strict_map_key=True)
    if message.get("v") != VERSION or message.get("t") != expected_type:
        raise ValueError(f"expected a version-1 {expected_type}, got {message.get('t')!r}")
    if "g" in message:  # StepResponse: (B, d) gradient
        shape = (message["B"], message["d"])
        message["g"] = _floats(message["g"], message["dt"], shape)
    elif "gr" in message:  # StepResponse with a compressed gradient (section 4.2.1)
        message["g"] = compressed_gradient(message.pop("gr"), message["B"], message["d"])
    if "y" in message:  # PredictResponse: (n, C) scores
        message["y"] = _floats(message["y"], message["dt"], (message["n"], message["C"]))
    return message


def compressed_gradient(gr: dict[str, Any], B: int, d: int) -> np.ndarray:
    """Section 4.2.1: the (B, d) float32 gradient of a ``gr`` map of kind bf16, int or topk
    (the default downlink of a new run is top-k, section 4.2.1)."""
    kind = gr["k"]
    if kind == "bf16":
        return _bfloat16(gr["g"]).reshape(B, d)
    if kind == "int":
        b = gr["b"]
        scale = np.frombuffer(gr["sc"], dtype="<f4")
        codes = _unpack(gr["g"], B * d, b).reshape(B, d).astype(np.float32)
        levels = 2 * codes - 1 if b == 1 else codes - ((1 << (b - 1)) - 1)
        return (levels * scale[:, None]).astype(np.float32)
    if kind == "topk":
        K = gr["K"]
        index = _unpack(gr["i"], B * K, (d - 1).bit_length()).reshape(B, K)
        if K > 1 and (np.diff(index, axis=1) <= 0).any():
            raise ValueError("top-k indices must be strictly ascending within a row")
        if (index >= d).any():
            raise ValueError(f"a top-k index >= d={d}")
        out = np.zeros((B, d), dtype=np.float32)
        np.put_along_axis(out, index, _bfloat16(gr["v"]).reshape(B, K), axis=1)
        return out
    raise ValueError(f"this client decodes gradient kinds bf16, int and topk, not {kind!r}")


def _bfloat16(data: bytes) -> np.ndarray:
    """Little-endian bfloat16: the high half of a float32."""
    return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def _unpack(data: bytes, count: int, bits: int) -> np.ndarray:
    """Section 3: ``count`` codes of ``bits`` bits, most significant bit first (int64)."""
    if bits == 0:
        return np.zeros(count, dtype=np.int64)
    if len(data) != (count * bits + 7) // 8:
        raise ValueError(f"{len(data)} bytes for {count} codes of {bits} bits")
    stream = np.unpackbits(np.frombuffer(data, dtype=np.uint8))[: count * bits]
    weights = 1 << np.arange(bits - 1, -1, -1, dtype=np.int64)
    codes: np.ndarray = (stream.reshape(count, bits) * weights).sum(axis=1)
    return codes


def _floats(data: bytes, tag: str, shape: tuple[int, int]) -> np.ndarray:
    return np.frombuffer(data, dtype=_DTYPES[tag]).astype(np.float32).reshape(shape)


def unpack_codewords(data: bytes, B: int, q: int, L: int) -> np.ndarray:
    """Section 3 backwards: (B, q) int64 codewords; padding bits must be zero, each < L."""
    bits = (L - 1).bit_length()
    if bits == 0:
        return np.zeros((B, q), dtype=np.int64)
    count = B * q
    if len(data) != (count * bits + 7) // 8:
        raise ValueError(f"{len(data)} codeword bytes for {count} codewords of {bits} bits")
    stream = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    if stream[count * bits :].any():
        raise ValueError("non-zero padding bits")
    weights = 1 << np.arange(bits - 1, -1, -1, dtype=np.int64)
    codewords: np.ndarray = (stream[: count * bits].reshape(count, bits) * weights).sum(axis=1)
    if (codewords >= L).any():
        raise ValueError(f"a codeword >= L={L}")
    return codewords.reshape(B, q)


def read_step_request(body: bytes) -> tuple[int, bytes, list[tuple[np.ndarray, np.ndarray]]]:
    """A ``pq`` StepRequest: (s, h, [(codebook (R, L, d/q) float32, codewords (B, q))])."""
    m: dict[str, Any] = msgpack.unpackb(body, raw=False, strict_map_key=True)
    if m.get("v") != VERSION or m.get("t") != "step_req" or set(m) != {"v", "t", "s", "h", "a"}:
        raise ValueError("not a version-1 step_req")
    chunks = []
    for c in m["a"]:
        if c["k"] != "pq" or c["b"] != (c["L"] - 1).bit_length():
            raise ValueError(f"expected a pq chunk, got {c['k']!r}")
        width = c["d"] // c["q"]
        codebook = _floats(c["cb"], c["dt"], (c["R"] * c["L"], width))
        codebook = codebook.reshape(c["R"], c["L"], width)
        chunks.append((codebook, unpack_codewords(c["cw"], c["B"], c["q"], c["L"])))
    return int(m["s"]), bytes(m["h"]), chunks
