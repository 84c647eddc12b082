"""Cut-layer activations on the wire: chunks of rows, each product-quantized or raw.

A request carries one or more chunks, each quantized on its own with its own codebook (or
sent raw for the SplitFed baseline); the chunks' rows, concatenated in order, are the
request's ``(rows, d)`` activations. docs/PROTOCOL.md section 2 describes the bytes.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeAlias

import numpy as np
import torch
from numpy.typing import NDArray

from shared.pq import PQCode
from shared.types import CodewordCoding, WireFloat
from shared.wire import ans
from shared.wire.arrays import check_float32, float_bin
from shared.wire.bitpack import MAX_BITS, bits_for, pack_codes, packed_nbytes, unpack_codes
from shared.wire.reader import CodecError, DecodeLimits, Fields, malformed, type_name

__all__ = [
    "Activations",
    "Chunked",
    "CodewordCoding",
    "PQActivations",
    "RawActivations",
    "as_chunks",
    "chunk_rows",
    "chunks_from_wire",
    "chunks_to_wire",
]

# Activation kind tags ("k").
_PQ: Final = "pq"
_RAW: Final = "raw"
_PQ_KEYS: Final = frozenset({"k", "B", "d", "q", "R", "L", "b", "dt", "cb", "cw"})
# A PQ chunk's codewords: bit-packed ("cw", section 3) or rANS-coded ("cf" + "ca", 3.1).
_PQ_ANS_KEYS: Final = (_PQ_KEYS - {"cw"}) | {"cf", "ca"}
_RAW_KEYS: Final = frozenset({"k", "B", "d", "dt", "x"})
# "ans": each PQ chunk's codewords rANS-coded where that is smaller than bit-packed.


@dataclass(frozen=True, eq=False)
class PQActivations:
    """Product-quantized cut-layer activations of one batch.

    Row ``b`` of the ``(B, d)`` activations is cut into ``q`` sub-vectors of width ``d // q``;
    sub-vector ``j`` is replaced by codeword ``codewords[b, j]`` of the codebook of its group
    (``R`` groups of ``q // R`` consecutive sub-vectors share one codebook).
    """

    codebook: NDArray[np.float32]  # (R, L, d // q)
    codewords: NDArray[np.integer[Any]]  # (B, q), each in [0, L)

    def __post_init__(self) -> None:
        check_float32(self.codebook, "codebook", ndim=3)
        if not isinstance(self.codewords, np.ndarray):
            raise TypeError(f"codewords must be a numpy array, got {type(self.codewords).__name__}")
        dtype = self.codewords.dtype
        if dtype == np.bool_ or not np.issubdtype(dtype, np.integer):
            raise TypeError(f"codewords must have an integer dtype, got {dtype}")
        if self.codewords.ndim != 2 or 0 in self.codewords.shape:
            raise ValueError(f"codewords must be (B, q) with B, q >= 1, got {self.codewords.shape}")
        if self.q % self.R:
            raise ValueError(f"R={self.R} codebooks must divide q={self.q} sub-vectors")
        if self.L > 1 << MAX_BITS:
            raise ValueError(f"L={self.L} codewords exceed the 16-bit maximum {1 << MAX_BITS}")

    @property
    def B(self) -> int:
        """Batch size (rows)."""
        return int(self.codewords.shape[0])

    @property
    def q(self) -> int:
        """Sub-vectors per row."""
        return int(self.codewords.shape[1])

    @property
    def R(self) -> int:
        """Codebooks (groups of sub-vectors)."""
        return int(self.codebook.shape[0])

    @property
    def L(self) -> int:
        """Codewords per codebook."""
        return int(self.codebook.shape[1])

    @property
    def d(self) -> int:
        """Width of a dequantized activation row: q sub-vectors of ``codebook.shape[2]``."""
        return int(self.codebook.shape[2]) * self.q

    @classmethod
    def from_code(cls, code: PQCode) -> "PQActivations":
        """The quantizer's output as the wire carries it (numpy views of its tensors)."""
        return cls(code.codebook.numpy(), code.codewords.numpy())

    def to_code(self) -> PQCode:
        """What ``GroupedProductQuantizer.decode`` takes (tensors sharing this memory)."""
        return PQCode(torch.from_numpy(self.codebook), torch.from_numpy(self.codewords))


@dataclass(frozen=True, eq=False)
class RawActivations:
    """Uncompressed cut-layer activations (the SplitFed baseline)."""

    activations: NDArray[np.float32]  # (B, d)

    def __post_init__(self) -> None:
        check_float32(self.activations, "activations", ndim=2)

    @property
    def B(self) -> int:
        """Batch size (rows)."""
        return int(self.activations.shape[0])

    @property
    def d(self) -> int:
        """Width of an activation row."""
        return int(self.activations.shape[1])


Activations: TypeAlias = PQActivations | RawActivations


def chunk_rows(chunks: Sequence[Activations]) -> list[int]:
    """Rows ``B`` of each chunk, in order.

    A StepResponse's ``(rows, d)`` gradient holds the chunks' rows concatenated in order, so
    ``np.split(grad, np.cumsum(chunk_rows(chunks))[:-1])`` gives one ``(B, d)`` block per chunk.
    """
    return [chunk.B for chunk in chunks]


class Chunked:
    """The activations of a request: one or more chunks of rows, each quantized on its own.

    Chunks let one request carry rows quantized independently, each with its own codebook: an
    evaluation set larger than a training batch goes as several chunks quantized exactly like
    training batches, and in the horizontal setting each client's batch is one chunk. The
    chunks' rows, concatenated in order, are the request's ``(rows, d)`` activations. All
    chunks are of one kind and width ``d``, and PQ chunks share ``q``, ``R`` and ``L`` (one
    run uses one quantizer config).
    """

    chunks: tuple[Activations, ...]

    @property
    def rows(self) -> int:
        """Total rows over all chunks."""
        return sum(chunk_rows(self.chunks))

    @property
    def d(self) -> int:
        """Width of an activation row (the same in every chunk)."""
        return self.chunks[0].d


class _ChunkConfig(NamedTuple):
    """What every chunk of a request must share with chunk 0. q, R, L are 0 for raw chunks."""

    k: str  # kind: "pq" or "raw"
    d: int  # width of a row
    q: int  # sub-vectors per row
    R: int  # codebooks
    L: int  # codewords per codebook


def _config_of(chunk: Activations) -> _ChunkConfig:
    if isinstance(chunk, PQActivations):
        return _ChunkConfig(_PQ, chunk.d, chunk.q, chunk.R, chunk.L)
    return _ChunkConfig(_RAW, chunk.d, 0, 0, 0)


def _first_mismatch(configs: Sequence[_ChunkConfig]) -> tuple[int, str, str] | None:
    """(chunk index, wire key, problem) of the first chunk not configured like chunk 0."""
    first = configs[0]
    for i, config in enumerate(configs[1:], start=1):
        if config.k != first.k:
            return i, "k", f"a {config.k!r} chunk after a {first.k!r} chunk 0 (mixing is refused)"
        for key, mine, theirs in zip(config._fields[1:], config[1:], first[1:], strict=True):
            if mine != theirs:
                why = "one (rows, d) matrix" if key == "d" else "one quantizer config per run"
                return i, key, f"{key}={mine} differs from {key}={theirs} of chunk 0 ({why})"
    return None


def as_chunks(chunks: object) -> tuple[Activations, ...]:
    """``chunks`` checked as a non-empty tuple of activations that fit together."""
    if isinstance(chunks, PQActivations | RawActivations):
        raise TypeError(
            f"chunks must be a tuple of activations, got a bare {type(chunks).__name__}: "
            "wrap it in a tuple, chunks=(activations,)"
        )
    if not isinstance(chunks, tuple | list):
        raise TypeError(f"chunks must be a tuple of activations, got {type(chunks).__name__}")
    if not chunks:
        raise ValueError("chunks must hold at least one chunk of activations")
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, PQActivations | RawActivations):
            raise TypeError(
                f"chunks[{i}] must be PQActivations or RawActivations, got {type(chunk).__name__}"
            )
    out: tuple[Activations, ...] = tuple(chunks)
    mismatch = _first_mismatch([_config_of(chunk) for chunk in out])
    if mismatch is not None:
        i, _, problem = mismatch
        raise ValueError(f"chunks[{i}]: {problem}")
    return out


# ------------------------------------------------------------------------------------------
# Encoding
# ------------------------------------------------------------------------------------------


def chunks_to_wire(
    chunks: Sequence[Activations],
    *,
    codebook_dtype: WireFloat,
    activations_dtype: WireFloat,
    codewords: CodewordCoding = "packed",
) -> list[dict[str, Any]]:
    """The wire maps of ``chunks``, in order (``codebook_dtype`` and ``codewords`` for PQ,
    ``activations_dtype`` for raw)."""
    return [
        _activations_to_wire(
            chunk,
            f"chunks[{i}]",
            codebook_dtype=codebook_dtype,
            activations_dtype=activations_dtype,
            coding=codewords,
        )
        for i, chunk in enumerate(chunks)
    ]


def _activations_to_wire(
    activations: Activations,
    name: str,
    *,
    codebook_dtype: WireFloat,
    activations_dtype: WireFloat,
    coding: CodewordCoding,
) -> dict[str, Any]:
    if isinstance(activations, PQActivations):
        L = activations.L
        bits = bits_for(L)
        codewords = activations.codewords
        if L != 1 << bits and int(codewords.max()) >= L:  # below 2**bits pack_codes checks
            raise ValueError(f"{name}.codewords must be < L={L}, got {int(codewords.max())}")
        try:
            packed = pack_codes(codewords, bits)
        except ValueError as exc:
            raise ValueError(f"{name}.codewords must lie in [0, L={L}): {exc}") from None
        tag, codebook = float_bin(activations.codebook, codebook_dtype, f"{name}.codebook")
        payload: dict[str, bytes] = {"cw": packed}
        if coding == "ans":  # bit-packed stays where rANS would not be smaller
            codes = np.asarray(activations.codewords, np.int64)
            coded = ans.smaller_than_packed(codes, activations.R, L)
            payload = payload if coded is None else {"cf": coded[0], "ca": coded[1]}
        return {
            "k": _PQ,
            "B": activations.B,
            "d": activations.d,
            "q": activations.q,
            "R": activations.R,
            "L": L,
            "b": bits,
            "dt": tag,
            "cb": codebook,
            **payload,
        }
    tag, raw = float_bin(activations.activations, activations_dtype, f"{name}.activations")
    return {"k": _RAW, "B": activations.B, "d": activations.d, "dt": tag, "x": raw}


# ------------------------------------------------------------------------------------------
# Decoding
# ------------------------------------------------------------------------------------------


class _ChunkHeader(NamedTuple):
    """One chunk's declared sizes, checked, before its payload is read."""

    fields: Fields
    config: _ChunkConfig
    B: int  # rows
    bits: int  # bits per codeword; 0 for raw chunks


def chunks_from_wire(f: Fields, key: str, limits: DecodeLimits) -> tuple[Activations, ...]:
    """The chunks in field ``key``, in order.

    Two passes: every chunk's declared sizes are checked, alone and against the other chunks'
    (one config, total rows), before any chunk's payload is decoded, so a message cannot make
    the decoder allocate more than the limits allow by spreading rows over many chunks.
    """
    where = f"{f.where}.{key}"
    value = f.get_raw(key)
    if not isinstance(value, list):
        raise CodecError(f"{where}: expected an array of activation maps, got {type_name(value)}")
    if not 1 <= len(value) <= limits.max_chunks:
        raise CodecError(f"{where}: must hold 1..{limits.max_chunks} chunks, got {len(value)}")
    headers = [_chunk_header(obj, f"{where}[{i}]", limits) for i, obj in enumerate(value)]
    mismatch = _first_mismatch([header.config for header in headers])
    if mismatch is not None:
        i, field, problem = mismatch
        raise CodecError(f"{where}[{i}].{field}: {problem}")
    rows = sum(header.B for header in headers)
    if rows > limits.max_batch:
        raise CodecError(
            f"{where}: {rows} rows in {len(headers)} chunk(s), over the limit {limits.max_batch}"
        )
    # the receiver concatenates the chunks into one (rows, d) array; B*q codes <= B*d
    elements = rows * headers[0].config.d
    if elements > limits.max_elements:
        raise CodecError(
            f"{where}: rows*d has {elements} elements, over the limit {limits.max_elements}"
        )
    return tuple(_chunk_from_wire(header) for header in headers)


def _chunk_header(obj: object, where: str, limits: DecodeLimits) -> _ChunkHeader:
    if not isinstance(obj, dict):
        raise CodecError(f"{where}: expected a map, got {type_name(obj)}")
    kind = obj.get("k")
    if kind == _RAW:
        f = Fields(obj, where, _RAW_KEYS)
        B = f.get_int("B", 1, limits.max_batch)
        d = f.get_int("d", 1, limits.max_dim)
        return _ChunkHeader(f, _ChunkConfig(_RAW, d, 0, 0, 0), B, 0)
    if kind != _PQ:
        raise CodecError(f"{where}.k: unknown activation kind {kind!r} (expected 'pq' or 'raw')")
    f = Fields(obj, where, _PQ_ANS_KEYS if "ca" in obj else _PQ_KEYS)
    B = f.get_int("B", 1, limits.max_batch)
    d = f.get_int("d", 1, limits.max_dim)
    q = f.get_int("q", 1, limits.max_q)
    R = f.get_int("R", 1, limits.max_groups)
    L = f.get_int("L", 1, limits.max_L)
    bits = f.get_int("b", 0, MAX_BITS)
    if d % q:
        raise CodecError(f"{where}: q={q} sub-vectors must divide d={d}")
    if q % R:
        raise CodecError(f"{where}: R={R} codebooks must divide q={q} sub-vectors")
    if bits != bits_for(L):
        raise CodecError(f"{where}.b: L={L} needs {bits_for(L)} bits per codeword, got {bits}")
    f.check_elements("codebook R*L*(d/q)", R * L * (d // q), limits)
    return _ChunkHeader(f, _ChunkConfig(_PQ, d, q, R, L), B, bits)


def _chunk_from_wire(header: _ChunkHeader) -> Activations:
    f, (kind, d, q, R, L), B = header.fields, header.config, header.B
    if kind == _RAW:
        activations = f.get_float_array("x", f.get_dtype("dt"), (B, d))
        with malformed(f.where):
            return RawActivations(activations=activations)
    codebook = f.get_float_array("cb", f.get_dtype("dt"), (R, L, d // q))
    if "ca" in f.keys:
        return _ans_chunk(f, codebook, B, q, R, L)
    packed = f.get_bin("cw", packed_nbytes(B * q, header.bits))
    try:
        codes = unpack_codes(packed, B * q, header.bits)
    except ValueError as exc:
        raise CodecError(f"{f.where}.cw: {exc}") from None
    if L != 1 << header.bits and codes.size:  # with L == 2**bits every pattern is a codeword
        largest = int(codes.max())
        if largest >= L:
            raise CodecError(f"{f.where}.cw: codeword {largest} >= L={L}")
    with malformed(f.where):
        return PQActivations(codebook=codebook, codewords=codes.reshape(B, q).astype(np.int64))


def _ans_chunk(
    f: Fields, codebook: NDArray[np.floating[Any]], B: int, q: int, R: int, L: int
) -> PQActivations:
    """A PQ chunk whose codewords are rANS-coded (section 3.1): table ``cf``, stream ``ca``.

    Each decoded codeword has a non-zero frequency in a table of L entries, so it is < L."""
    table = f.get_bin("cf", 2 * R * L)
    try:
        codes = ans.decode(table, f.get_bin("ca"), B, q, R, L)
    except ValueError as exc:
        raise CodecError(f"{f.where}.ca: {exc}") from None
    with malformed(f.where):
        return PQActivations(codebook=codebook, codewords=codes)
