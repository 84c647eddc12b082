"""Wire codec: msgpack ``encode_*`` / ``decode_*`` pairs for every message between the parties.

Party A sends cut-layer activations as one or more chunks of rows, each chunk quantized on
its own (a product-quantization codebook plus bit-packed codewords, or raw floats for the
SplitFed baseline); party B answers with the loss and the gradient w.r.t. the activations it
dequantized, one gradient row per activation row, chunks concatenated in order.
docs/PROTOCOL.md describes the bytes field by field; this module is its reference
implementation.

Every message is one msgpack map carrying the wire version (``"v"``) and a type tag
(``"t"``). Arrays travel as msgpack ``bin`` holding little-endian IEEE floats, with their
dtype and shape as explicit fields. There is no pickle anywhere, and decoders treat their
input as hostile: every declared shape is bounded by ``DecodeLimits`` and matched against
the byte length it implies, in Python ints, before numpy touches the payload.

Exceptions::

    ValueError
     └── CodecError   every decode_* raises it, and only it, for any malformed input

Encoders raise plain ``ValueError`` (never ``CodecError``) for a message that cannot go on
the wire, e.g. a NaN gradient: that is a bug on the sending side, not a malformed message,
and must not be answered as one.

In memory every float array is float32 and codewords are int64; on the wire, codebooks,
raw activations, gradients and scores may be float16 (encoder keyword options). Decoders
always return writable float32 arrays.
"""

import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, TypeAlias

import msgpack
import numpy as np
from numpy.typing import NDArray

from shared.bitpack import MAX_BITS, bits_for, pack_codes, packed_nbytes, unpack_codes

__all__ = [
    "WIRE_VERSION",
    "Activations",
    "CodecError",
    "DEFAULT_LIMITS",
    "DecodeLimits",
    "EvaluateRequest",
    "EvaluateResponse",
    "PQActivations",
    "PredictRequest",
    "PredictResponse",
    "RawActivations",
    "StepRequest",
    "StepResponse",
    "WireFloat",
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
]

WIRE_VERSION: Final = 1

DIGEST_BYTES: Final = 8  # batch / id-set digests are opaque 8-byte strings
MAX_STEP: Final = 2**63 - 1  # steps and counts fit a signed 64-bit int on any peer
_U32_MAX: Final = 2**32 - 1  # msgpack's largest str / bin / array / map length

# Float dtype of an array on the wire. Always little-endian, whatever the host.
WireFloat: TypeAlias = Literal["float32", "float16"]
_WIRE_TAG: Final[dict[str, str]] = {"float32": "f4", "float16": "f2"}
_TAG_DTYPE: Final[dict[str, np.dtype[np.floating[Any]]]] = {
    "f4": np.dtype("<f4"),
    "f2": np.dtype("<f2"),
}

# Message type tags ("t").
_STEP_REQ: Final = "step_req"
_STEP_RES: Final = "step_res"
_EVAL_REQ: Final = "eval_req"
_EVAL_RES: Final = "eval_res"
_PRED_REQ: Final = "pred_req"
_PRED_RES: Final = "pred_res"

# Activation kind tags ("k").
_PQ: Final = "pq"
_RAW: Final = "raw"


class CodecError(ValueError):
    """Bytes that are not a well-formed message of the expected type (any reason)."""


@dataclass(frozen=True)
class DecodeLimits:
    """Upper bounds a decoder enforces on declared sizes before allocating anything.

    A compressed message is tiny next to what it expands to (``L == 1`` codewords take zero
    bytes for any B x q), so the limits bound the decoded size, not the message size.
    """

    max_batch: int = 65_536  # rows: of a request (summed over its chunks), a gradient, scores
    max_dim: int = 1_048_576  # d: width of one activation row
    max_q: int = 65_536  # q: sub-vectors per row
    max_groups: int = 65_536  # R: codebooks per chunk
    max_L: int = 65_536  # L: codewords per codebook; 65536 is the 16-bit bitpack maximum
    max_classes: int = 1_048_576  # C: scores per row of a prediction
    max_elements: int = 64 * 2**20  # elements of one array: rows*d, R*L*(d/q), n*C
    max_str_bytes: int = 256  # UTF-8 bytes of any string: ids, metric names, tags
    max_metrics: int = 64  # entries of a metrics map
    max_chunks: int = 4096  # independently quantized chunks of one request

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DecodeLimits.{name} must be a positive int, got {value!r}")
        if self.max_L > 1 << MAX_BITS:
            raise ValueError(f"DecodeLimits.max_L must be <= {1 << MAX_BITS} (16-bit codes)")


DEFAULT_LIMITS: Final = DecodeLimits()


# ------------------------------------------------------------------------------------------
# Messages
# ------------------------------------------------------------------------------------------
# Frozen dataclasses checked on construction (types, ranks, shape consistency). Value checks
# that cost a pass over the data (finite floats, codewords < L) happen once, in the encoder
# or decoder. eq=False: numpy arrays have no single truth value, so == would raise.


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
        _check_float32(self.codebook, "codebook", ndim=3)
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


@dataclass(frozen=True, eq=False)
class RawActivations:
    """Uncompressed cut-layer activations (the SplitFed baseline)."""

    activations: NDArray[np.float32]  # (B, d)

    def __post_init__(self) -> None:
        _check_float32(self.activations, "activations", ndim=2)

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


class _Chunked:
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


@dataclass(frozen=True, eq=False)
class StepRequest(_Chunked):
    """Party A -> B: the activations of training step ``step`` for the batch ``batch_digest``."""

    step: int  # training step, >= 0
    batch_digest: bytes  # 8 opaque bytes naming the batch's sample ids, all chunks together
    chunks: tuple[Activations, ...]  # >= 1 chunks of (B_k, d); a list is taken as a tuple

    def __post_init__(self) -> None:
        object.__setattr__(self, "step", _as_int(self.step, "step", 0, MAX_STEP))
        _check_digest(self.batch_digest, "batch_digest")
        object.__setattr__(self, "chunks", _as_chunks(self.chunks))


@dataclass(frozen=True, eq=False)
class StepResponse:
    """Party B -> A: loss of step ``step`` and the gradient w.r.t. the dequantized activations.

    ``loss`` and ``metrics`` are reports and may be NaN or Inf (a diverged loss, the AUC of a
    one-class batch); ``grad`` is used in computation and must be finite.
    """

    step: int  # echoes StepRequest.step
    loss: float  # mean loss over the batch
    metrics: dict[str, float]  # e.g. {"accuracy": 0.75}
    grad: NDArray[np.float32]  # (rows, d) d loss / d dequantized activations, chunks in order

    def __post_init__(self) -> None:
        object.__setattr__(self, "step", _as_int(self.step, "step", 0, MAX_STEP))
        object.__setattr__(self, "loss", _as_float(self.loss, "loss"))
        object.__setattr__(self, "metrics", _as_metrics(self.metrics))
        _check_float32(self.grad, "grad", ndim=2)


@dataclass(frozen=True, eq=False)
class EvaluateRequest(_Chunked):
    """Party A -> B: activations of evaluation samples whose ids hash to ``ids_digest``."""

    ids_digest: bytes  # 8 opaque bytes naming the samples' ids, all chunks together
    chunks: tuple[Activations, ...]  # >= 1 chunks of (B_k, d); a list is taken as a tuple

    def __post_init__(self) -> None:
        _check_digest(self.ids_digest, "ids_digest")
        object.__setattr__(self, "chunks", _as_chunks(self.chunks))


@dataclass(frozen=True, eq=False)
class EvaluateResponse:
    """Party B -> A: loss and metrics over the ``n`` evaluated samples (no gradient)."""

    n: int  # samples evaluated, >= 0
    loss: float  # mean loss over the n samples (may be NaN or Inf)
    metrics: dict[str, float]  # e.g. {"accuracy": 0.75, "auc": 0.9}

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _as_int(self.n, "n", 0, MAX_STEP))
        object.__setattr__(self, "loss", _as_float(self.loss, "loss"))
        object.__setattr__(self, "metrics", _as_metrics(self.metrics))


@dataclass(frozen=True, eq=False)
class PredictRequest(_Chunked):
    """Party A -> B: activations of rows ``ids`` (one id per row, so len(ids) == rows)."""

    ids: list[str]  # sample ids, in row order over all chunks
    chunks: tuple[Activations, ...]  # >= 1 chunks of (B_k, d); a list is taken as a tuple

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", _as_ids(self.ids))
        object.__setattr__(self, "chunks", _as_chunks(self.chunks))
        if len(self.ids) != self.rows:
            raise ValueError(f"{len(self.ids)} ids for {self.rows} activation rows")


@dataclass(frozen=True, eq=False)
class PredictResponse:
    """Party B -> A: one row of ``C`` scores (probabilities or logits) per requested id."""

    ids: list[str]  # echoes PredictRequest.ids, in row order
    scores: NDArray[np.float32]  # (n, C)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", _as_ids(self.ids))
        _check_float32(self.scores, "scores", ndim=2)
        if len(self.ids) != self.scores.shape[0]:
            raise ValueError(f"{len(self.ids)} ids for {self.scores.shape[0]} rows of scores")


def _check_float32(array: object, name: str, *, ndim: int) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(array).__name__}")
    if array.dtype != np.float32:
        raise TypeError(f"{name} must be float32, got {array.dtype}")
    if array.ndim != ndim or 0 in array.shape:
        raise ValueError(f"{name} must have {ndim} non-empty dimensions, got shape {array.shape}")


def _check_digest(digest: object, name: str) -> None:
    if not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES:
        raise ValueError(f"{name} must be exactly {DIGEST_BYTES} bytes, got {digest!r}")


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


def _as_chunks(chunks: object) -> tuple[Activations, ...]:
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


def _as_int(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be an int, got a bool")
    number = operator.index(value)  # type: ignore[arg-type]  # TypeError for non-integers
    if not lo <= number <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {number}")
    return number


def _as_float(value: object, name: str) -> float:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def _as_metrics(metrics: object) -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping, got {type(metrics).__name__}")
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric names must be str, got {key!r}")
        out[key] = _as_float(value, f"metrics[{key!r}]")
    return out


def _as_ids(ids: object) -> list[str]:
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise TypeError(f"ids must be a sequence of str, got {type(ids).__name__}")
    out = list(ids)
    for i in out:
        if not isinstance(i, str):
            raise TypeError(f"ids must be str, got {i!r}")
    return out


# ------------------------------------------------------------------------------------------
# Shared encode helpers
# ------------------------------------------------------------------------------------------


def _float_bin(array: NDArray[np.float32], wire: WireFloat, name: str) -> tuple[str, bytes]:
    """(dtype tag, little-endian bytes in row-major order) of a float32 array."""
    try:
        tag = _WIRE_TAG[wire]
    except KeyError:
        raise ValueError(
            f"wire dtype for {name} must be 'float32' or 'float16', got {wire!r}"
        ) from None
    # Values beyond the float16 range become Inf in the cast; the finite check reports them.
    with np.errstate(over="ignore"):
        cast = array.astype(_TAG_DTYPE[tag], order="C", copy=False)
    if not _all_finite(cast):
        raise ValueError(f"{name} holds NaN or Inf values (or values beyond the {wire} range)")
    return tag, cast.tobytes()


def _all_finite(array: NDArray[np.floating[Any]]) -> bool:
    if array.size == 0:
        return True
    if array.dtype.itemsize == 2:
        # numpy's float16 isfinite converts every element (~20x slower than this): a half is
        # NaN or Inf exactly when its 5 exponent bits are all ones, i.e. |bits| >= 0x7C00.
        magnitudes = array.view(array.dtype.str.replace("f", "u")) & np.uint16(0x7FFF)
        return int(magnitudes.max()) < 0x7C00
    return bool(np.isfinite(array).all())


def _chunks_to_wire(
    chunks: Sequence[Activations], *, codebook_dtype: WireFloat, activations_dtype: WireFloat
) -> list[dict[str, Any]]:
    return [
        _activations_to_wire(
            chunk,
            f"chunks[{i}]",
            codebook_dtype=codebook_dtype,
            activations_dtype=activations_dtype,
        )
        for i, chunk in enumerate(chunks)
    ]


def _activations_to_wire(
    activations: Activations,
    name: str,
    *,
    codebook_dtype: WireFloat,
    activations_dtype: WireFloat,
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
        tag, codebook = _float_bin(activations.codebook, codebook_dtype, f"{name}.codebook")
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
            "cw": packed,
        }
    tag, raw = _float_bin(activations.activations, activations_dtype, f"{name}.activations")
    return {"k": _RAW, "B": activations.B, "d": activations.d, "dt": tag, "x": raw}


def _pack(message: dict[str, Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


# ------------------------------------------------------------------------------------------
# Shared decode helpers
# ------------------------------------------------------------------------------------------


@contextmanager
def _malformed(where: str) -> Iterator[None]:
    """Safety net: a ValueError/TypeError raised while building a message is a CodecError."""
    try:
        yield
    except CodecError:
        raise
    except (TypeError, ValueError) as exc:
        raise CodecError(f"{where}: {exc}") from exc


def _no_duplicate_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    # msgpack maps may repeat a key and unpackb would silently keep the last one; two peers
    # could then read different values from the same bytes.
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("map has a duplicate key")
    return out


def _type_name(value: object) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str", bytes: "bin"}.get(
        type(value), type(value).__name__
    )


class _Fields:
    """Typed, bounds-checked reads from one decoded msgpack map; any failure is a CodecError."""

    def __init__(self, obj: object, where: str, keys: frozenset[str]) -> None:
        if not isinstance(obj, dict):
            raise CodecError(f"{where}: expected a map, got {_type_name(obj)}")
        missing = keys - obj.keys()
        if missing:
            raise CodecError(f"{where}: missing field(s) {sorted(missing)}")
        extra = obj.keys() - keys
        if extra:
            raise CodecError(f"{where}: unexpected field(s) {sorted(map(repr, extra))}")
        self._obj: dict[str, Any] = obj
        self.where = where

    def _fail(self, key: str, problem: str) -> CodecError:
        return CodecError(f"{self.where}.{key}: {problem}")

    def get_int(self, key: str, lo: int, hi: int) -> int:
        value = self._obj[key]
        if type(value) is not int:  # bool is a subclass of int and is rejected here
            raise self._fail(key, f"expected int, got {_type_name(value)}")
        if not lo <= value <= hi:
            raise self._fail(key, f"must be in [{lo}, {hi}], got {value}")
        return value

    def get_float(self, key: str) -> float:
        value = self._obj[key]
        # ints are accepted: some msgpack libraries write 1.0 as the int 1
        if type(value) is not float and type(value) is not int:
            raise self._fail(key, f"expected float, got {_type_name(value)}")
        return float(value)  # msgpack ints are < 2**64, so this cannot overflow

    def get_str(self, key: str) -> str:
        value = self._obj[key]
        if type(value) is not str:
            raise self._fail(key, f"expected str, got {_type_name(value)}")
        return value

    def get_bin(self, key: str, nbytes: int | None = None) -> bytes:
        value = self._obj[key]
        if type(value) is not bytes:
            raise self._fail(key, f"expected bin, got {_type_name(value)}")
        if nbytes is not None and len(value) != nbytes:
            raise self._fail(key, f"expected {nbytes} bytes, got {len(value)}")
        return value

    def get_raw(self, key: str) -> object:
        return self._obj[key]

    def get_dtype(self, key: str) -> np.dtype[np.floating[Any]]:
        tag = self.get_str(key)
        if tag not in _TAG_DTYPE:
            raise self._fail(
                key, f"unknown float dtype {tag!r} (expected one of {list(_TAG_DTYPE)})"
            )
        return _TAG_DTYPE[tag]

    def get_float_array(
        self, key: str, dtype: np.dtype[np.floating[Any]], shape: tuple[int, ...]
    ) -> NDArray[np.float32]:
        """A float array of a declared ``shape``, whose bin must be exactly its byte count."""
        blob = self.get_bin(key)
        expected = math.prod(shape) * dtype.itemsize  # Python ints: cannot overflow
        if len(blob) != expected:
            raise self._fail(
                key,
                f"declared shape {shape} of {dtype.str} needs {expected} bytes, got {len(blob)}",
            )
        array = np.frombuffer(blob, dtype=dtype)
        if not _all_finite(array):
            raise self._fail(key, "holds NaN or Inf values")
        # astype copies into a writable, native-endian float32 array (torch.from_numpy warns
        # on the read-only view frombuffer returns)
        return array.astype(np.float32).reshape(shape)


def _open(data: object, msg_type: str, keys: frozenset[str], limits: DecodeLimits) -> _Fields:
    """Parse one msgpack map and check its envelope: version, type tag, exact field set."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    if len(data) == 0:
        raise CodecError("empty message")
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            object_pairs_hook=_no_duplicate_keys,
            # msgpack takes these as C ssize_t; bin and str lengths are uint32 on the wire
            max_str_len=min(max(limits.max_str_bytes, 16), _U32_MAX),
            max_bin_len=min(limits.max_elements * 4, _U32_MAX),  # largest float32 array
            # arrays are the lists of ids (<= max_batch) and of chunks (<= max_chunks)
            max_array_len=min(max(limits.max_batch, limits.max_chunks), _U32_MAX),
            max_map_len=min(limits.max_metrics + 16, _U32_MAX),  # metrics, or <= 10 fields
            max_ext_len=0,  # no ext types (timestamps included)
        )
    except msgpack.ExtraData:
        raise CodecError("trailing bytes after the message") from None
    # Anything unpackb raises means the bytes are not one well-formed, bounded msgpack value
    # (OutOfData, FormatError, StackError, ValueError on limits or bad UTF-8, ...).
    except Exception as exc:
        detail = str(exc) or type(exc).__name__
        raise CodecError(f"not a valid msgpack message: {detail}") from None
    if not isinstance(obj, dict):
        raise CodecError(f"expected a msgpack map, got {_type_name(obj)}")
    if "v" not in obj:
        raise CodecError("missing wire version field 'v'")
    version = obj["v"]
    if type(version) is not int:
        raise CodecError(f"wire version 'v' must be an int, got {_type_name(version)}")
    if version != WIRE_VERSION:
        raise CodecError(f"unsupported wire version {version} (this codec speaks {WIRE_VERSION})")
    tag = obj.get("t")
    if type(tag) is not str:
        raise CodecError(f"message type 't' must be a str, got {_type_name(tag)}")
    if tag != msg_type:
        raise CodecError(f"expected message type {msg_type!r}, got {tag!r}")
    return _Fields(obj, msg_type, keys | {"v", "t"})


def _check_elements(fields: _Fields, what: str, count: int, limits: DecodeLimits) -> None:
    if count > limits.max_elements:
        raise CodecError(
            f"{fields.where}: {what} has {count} elements, over the limit {limits.max_elements}"
        )


class _ChunkHeader(NamedTuple):
    """One chunk's declared sizes, checked, before its payload is read."""

    fields: _Fields
    config: _ChunkConfig
    B: int  # rows
    bits: int  # bits per codeword; 0 for raw chunks


def _chunks_from_wire(f: _Fields, key: str, limits: DecodeLimits) -> tuple[Activations, ...]:
    """The chunks in field ``key``, in order.

    Two passes: every chunk's declared sizes are checked, alone and against the other chunks'
    (one config, total rows), before any chunk's payload is decoded, so a message cannot make
    the decoder allocate more than the limits allow by spreading rows over many chunks.
    """
    where = f"{f.where}.{key}"
    value = f.get_raw(key)
    if not isinstance(value, list):
        raise CodecError(f"{where}: expected an array of activation maps, got {_type_name(value)}")
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


_PQ_KEYS: Final = frozenset({"k", "B", "d", "q", "R", "L", "b", "dt", "cb", "cw"})
_RAW_KEYS: Final = frozenset({"k", "B", "d", "dt", "x"})


def _chunk_header(obj: object, where: str, limits: DecodeLimits) -> _ChunkHeader:
    if not isinstance(obj, dict):
        raise CodecError(f"{where}: expected a map, got {_type_name(obj)}")
    kind = obj.get("k")
    if kind == _RAW:
        f = _Fields(obj, where, _RAW_KEYS)
        B = f.get_int("B", 1, limits.max_batch)
        d = f.get_int("d", 1, limits.max_dim)
        return _ChunkHeader(f, _ChunkConfig(_RAW, d, 0, 0, 0), B, 0)
    if kind != _PQ:
        raise CodecError(f"{where}.k: unknown activation kind {kind!r} (expected 'pq' or 'raw')")
    f = _Fields(obj, where, _PQ_KEYS)
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
    _check_elements(f, "codebook R*L*(d/q)", R * L * (d // q), limits)
    return _ChunkHeader(f, _ChunkConfig(_PQ, d, q, R, L), B, bits)


def _chunk_from_wire(header: _ChunkHeader) -> Activations:
    f, (kind, d, q, R, L), B = header.fields, header.config, header.B
    if kind == _RAW:
        activations = f.get_float_array("x", f.get_dtype("dt"), (B, d))
        with _malformed(f.where):
            return RawActivations(activations=activations)
    codebook = f.get_float_array("cb", f.get_dtype("dt"), (R, L, d // q))
    packed = f.get_bin("cw", packed_nbytes(B * q, header.bits))
    try:
        codes = unpack_codes(packed, B * q, header.bits)
    except ValueError as exc:
        raise CodecError(f"{f.where}.cw: {exc}") from None
    if L != 1 << header.bits and codes.size:  # with L == 2**bits every pattern is a codeword
        largest = int(codes.max())
        if largest >= L:
            raise CodecError(f"{f.where}.cw: codeword {largest} >= L={L}")
    with _malformed(f.where):
        return PQActivations(codebook=codebook, codewords=codes.reshape(B, q).astype(np.int64))


def _metrics_from_wire(f: _Fields, key: str, limits: DecodeLimits) -> dict[str, float]:
    value = f.get_raw(key)
    if not isinstance(value, dict):
        raise CodecError(f"{f.where}.{key}: expected a map, got {_type_name(value)}")
    if len(value) > limits.max_metrics:
        raise CodecError(
            f"{f.where}.{key}: {len(value)} metrics, over the limit {limits.max_metrics}"
        )
    out: dict[str, float] = {}
    for name, number in value.items():
        if type(name) is not str:
            raise CodecError(f"{f.where}.{key}: metric names must be str, got {_type_name(name)}")
        if type(number) is not float and type(number) is not int:
            raise CodecError(f"{f.where}.{key}[{name!r}]: expected float, got {_type_name(number)}")
        out[name] = float(number)
    return out


def _ids_from_wire(f: _Fields, key: str, limits: DecodeLimits) -> list[str]:
    value = f.get_raw(key)
    if not isinstance(value, list):
        raise CodecError(f"{f.where}.{key}: expected an array of str, got {_type_name(value)}")
    if not 1 <= len(value) <= limits.max_batch:
        raise CodecError(f"{f.where}.{key}: must hold 1..{limits.max_batch} ids, got {len(value)}")
    for i in value:
        if type(i) is not str:
            raise CodecError(f"{f.where}.{key}: ids must be str, got {_type_name(i)}")
    return value


# ------------------------------------------------------------------------------------------
# StepRequest
# ------------------------------------------------------------------------------------------


def encode_step_request(
    message: StepRequest,
    *,
    codebook_dtype: WireFloat = "float32",
    activations_dtype: WireFloat = "float32",
) -> bytes:
    """Serialize a StepRequest. ``codebook_dtype`` applies to PQ, ``activations_dtype`` to raw."""
    return _pack(
        {
            "v": WIRE_VERSION,
            "t": _STEP_REQ,
            "s": message.step,
            "h": message.batch_digest,
            "a": _chunks_to_wire(
                message.chunks,
                codebook_dtype=codebook_dtype,
                activations_dtype=activations_dtype,
            ),
        }
    )


def decode_step_request(data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> StepRequest:
    """Parse and validate a StepRequest; raises CodecError for any malformed input."""
    f = _open(data, _STEP_REQ, frozenset({"s", "h", "a"}), limits)
    step = f.get_int("s", 0, MAX_STEP)
    digest = f.get_bin("h", DIGEST_BYTES)
    chunks = _chunks_from_wire(f, "a", limits)
    with _malformed(f.where):
        return StepRequest(step=step, batch_digest=digest, chunks=chunks)


# ------------------------------------------------------------------------------------------
# StepResponse
# ------------------------------------------------------------------------------------------


def encode_step_response(message: StepResponse, *, grad_dtype: WireFloat = "float32") -> bytes:
    """Serialize a StepResponse, the gradient as ``grad_dtype`` on the wire."""
    tag, grad = _float_bin(message.grad, grad_dtype, "grad")
    B, d = message.grad.shape
    return _pack(
        {
            "v": WIRE_VERSION,
            "t": _STEP_RES,
            "s": message.step,
            "l": message.loss,
            "m": message.metrics,
            "B": B,
            "d": d,
            "dt": tag,
            "g": grad,
        }
    )


def decode_step_response(data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> StepResponse:
    """Parse and validate a StepResponse; raises CodecError for any malformed input."""
    f = _open(data, _STEP_RES, frozenset({"s", "l", "m", "B", "d", "dt", "g"}), limits)
    step = f.get_int("s", 0, MAX_STEP)
    loss = f.get_float("l")
    metrics = _metrics_from_wire(f, "m", limits)
    B = f.get_int("B", 1, limits.max_batch)
    d = f.get_int("d", 1, limits.max_dim)
    _check_elements(f, "B*d", B * d, limits)
    grad = f.get_float_array("g", f.get_dtype("dt"), (B, d))
    with _malformed(f.where):
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
    return _pack(
        {
            "v": WIRE_VERSION,
            "t": _EVAL_REQ,
            "h": message.ids_digest,
            "a": _chunks_to_wire(
                message.chunks,
                codebook_dtype=codebook_dtype,
                activations_dtype=activations_dtype,
            ),
        }
    )


def decode_evaluate_request(
    data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS
) -> EvaluateRequest:
    """Parse and validate an EvaluateRequest; raises CodecError for any malformed input."""
    f = _open(data, _EVAL_REQ, frozenset({"h", "a"}), limits)
    digest = f.get_bin("h", DIGEST_BYTES)
    chunks = _chunks_from_wire(f, "a", limits)
    with _malformed(f.where):
        return EvaluateRequest(ids_digest=digest, chunks=chunks)


# ------------------------------------------------------------------------------------------
# EvaluateResponse
# ------------------------------------------------------------------------------------------


def encode_evaluate_response(message: EvaluateResponse) -> bytes:
    """Serialize an EvaluateResponse."""
    return _pack(
        {
            "v": WIRE_VERSION,
            "t": _EVAL_RES,
            "n": message.n,
            "l": message.loss,
            "m": message.metrics,
        }
    )


def decode_evaluate_response(
    data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS
) -> EvaluateResponse:
    """Parse and validate an EvaluateResponse; raises CodecError for any malformed input."""
    f = _open(data, _EVAL_RES, frozenset({"n", "l", "m"}), limits)
    n = f.get_int("n", 0, MAX_STEP)
    loss = f.get_float("l")
    metrics = _metrics_from_wire(f, "m", limits)
    with _malformed(f.where):
        return EvaluateResponse(n=n, loss=loss, metrics=metrics)


# ------------------------------------------------------------------------------------------
# PredictRequest
# ------------------------------------------------------------------------------------------


def encode_predict_request(
    message: PredictRequest,
    *,
    codebook_dtype: WireFloat = "float32",
    activations_dtype: WireFloat = "float32",
) -> bytes:
    """Serialize a PredictRequest (dtype options as in ``encode_step_request``)."""
    return _pack(
        {
            "v": WIRE_VERSION,
            "t": _PRED_REQ,
            "ids": message.ids,
            "a": _chunks_to_wire(
                message.chunks,
                codebook_dtype=codebook_dtype,
                activations_dtype=activations_dtype,
            ),
        }
    )


def decode_predict_request(data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> PredictRequest:
    """Parse and validate a PredictRequest; raises CodecError for any malformed input."""
    f = _open(data, _PRED_REQ, frozenset({"ids", "a"}), limits)
    ids = _ids_from_wire(f, "ids", limits)
    chunks = _chunks_from_wire(f, "a", limits)
    rows = sum(chunk_rows(chunks))
    if len(ids) != rows:
        raise CodecError(f"{f.where}.ids: {len(ids)} ids for {rows} activation rows")
    with _malformed(f.where):
        return PredictRequest(ids=ids, chunks=chunks)


# ------------------------------------------------------------------------------------------
# PredictResponse
# ------------------------------------------------------------------------------------------


def encode_predict_response(
    message: PredictResponse, *, scores_dtype: WireFloat = "float32"
) -> bytes:
    """Serialize a PredictResponse, the scores as ``scores_dtype`` on the wire."""
    tag, scores = _float_bin(message.scores, scores_dtype, "scores")
    n, C = message.scores.shape
    return _pack(
        {
            "v": WIRE_VERSION,
            "t": _PRED_RES,
            "ids": message.ids,
            "n": n,
            "C": C,
            "dt": tag,
            "y": scores,
        }
    )


def decode_predict_response(
    data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS
) -> PredictResponse:
    """Parse and validate a PredictResponse; raises CodecError for any malformed input."""
    f = _open(data, _PRED_RES, frozenset({"ids", "n", "C", "dt", "y"}), limits)
    ids = _ids_from_wire(f, "ids", limits)
    n = f.get_int("n", 1, limits.max_batch)
    C = f.get_int("C", 1, limits.max_classes)
    if n != len(ids):
        raise CodecError(f"{f.where}.n: n={n} rows of scores for {len(ids)} ids")
    _check_elements(f, "n*C", n * C, limits)
    scores = f.get_float_array("y", f.get_dtype("dt"), (n, C))
    with _malformed(f.where):
        return PredictResponse(ids=ids, scores=scores)
