"""Reading untrusted msgpack safely: bounded parsing and typed, checked reads of fields.

Decoders treat their input as hostile: the msgpack parser runs with bounds derived from
``DecodeLimits`` (so it never builds an oversized object), maps may not repeat a key, and
every field is read through :class:`Fields`, which checks its type exactly (a bool is not
an int, a str is not a bin) and its range. Every declared shape is matched against the byte
length it implies, in Python ints, before numpy touches the payload.

Exceptions::

    ValueError
     └── CodecError   every decoder raises it, and only it, for any malformed input
"""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import msgpack
import numpy as np
from numpy.typing import NDArray

from shared.wire.arrays import TAG_DTYPE, all_finite
from shared.wire.bitpack import MAX_BITS

__all__ = [
    "DEFAULT_LIMITS",
    "U32_MAX",
    "CodecError",
    "DecodeLimits",
    "Fields",
    "malformed",
    "type_name",
    "unpack_map",
]

U32_MAX: Final = 2**32 - 1  # msgpack's largest str / bin / array / map length


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


@contextmanager
def malformed(where: str) -> Iterator[None]:
    """Safety net: a ValueError/TypeError raised while building a message is a CodecError."""
    try:
        yield
    except CodecError:
        raise
    except (TypeError, ValueError) as exc:
        raise CodecError(f"{where}: {exc}") from exc


def type_name(value: object) -> str:
    """The msgpack name of a decoded value's type, for error messages."""
    return {bool: "bool", int: "int", float: "float", str: "str", bytes: "bin"}.get(
        type(value), type(value).__name__
    )


def _no_duplicate_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    # msgpack maps may repeat a key and unpackb would silently keep the last one; two peers
    # could then read different values from the same bytes.
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("map has a duplicate key")
    return out


def unpack_map(data: object, limits: DecodeLimits) -> dict[Any, Any]:
    """Parse exactly one msgpack map from ``data`` with bounds from ``limits``."""
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
            max_str_len=min(max(limits.max_str_bytes, 16), U32_MAX),
            max_bin_len=min(limits.max_elements * 4, U32_MAX),  # largest float32 array
            # arrays are the lists of ids (<= max_batch) and of chunks (<= max_chunks)
            max_array_len=min(max(limits.max_batch, limits.max_chunks), U32_MAX),
            max_map_len=min(limits.max_metrics + 16, U32_MAX),  # metrics, or <= 10 fields
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
        raise CodecError(f"expected a msgpack map, got {type_name(obj)}")
    return obj


class Fields:
    """Typed, bounds-checked reads from one decoded msgpack map; any failure is a CodecError."""

    def __init__(self, obj: object, where: str, keys: frozenset[str]) -> None:
        if not isinstance(obj, dict):
            raise CodecError(f"{where}: expected a map, got {type_name(obj)}")
        missing = keys - obj.keys()
        if missing:
            raise CodecError(f"{where}: missing field(s) {sorted(missing)}")
        extra = obj.keys() - keys
        if extra:
            raise CodecError(f"{where}: unexpected field(s) {sorted(map(repr, extra))}")
        self._obj: dict[str, Any] = obj
        self.where = where

    @property
    def keys(self) -> frozenset[str]:
        """The field names of the map (exactly the ones it was checked against)."""
        return frozenset(self._obj)

    def fail(self, key: str, problem: str) -> CodecError:
        """The CodecError for field ``key``, naming its path."""
        return CodecError(f"{self.where}.{key}: {problem}")

    def get_int(self, key: str, lo: int, hi: int) -> int:
        value = self._obj[key]
        if type(value) is not int:  # bool is a subclass of int and is rejected here
            raise self.fail(key, f"expected int, got {type_name(value)}")
        if not lo <= value <= hi:
            raise self.fail(key, f"must be in [{lo}, {hi}], got {value}")
        return value

    def get_float(self, key: str) -> float:
        value = self._obj[key]
        # ints are accepted: some msgpack libraries write 1.0 as the int 1
        if type(value) is not float and type(value) is not int:
            raise self.fail(key, f"expected float, got {type_name(value)}")
        return float(value)  # msgpack ints are < 2**64, so this cannot overflow

    def get_str(self, key: str, max_chars: int | None = None) -> str:
        value = self._obj[key]
        if type(value) is not str:
            raise self.fail(key, f"expected str, got {type_name(value)}")
        if max_chars is not None and not 1 <= len(value) <= max_chars:
            raise self.fail(key, f"must hold 1 to {max_chars} characters, got {len(value)}")
        return value

    def get_bin(self, key: str, nbytes: int | None = None) -> bytes:
        value = self._obj[key]
        if type(value) is not bytes:
            raise self.fail(key, f"expected bin, got {type_name(value)}")
        if nbytes is not None and len(value) != nbytes:
            raise self.fail(key, f"expected {nbytes} bytes, got {len(value)}")
        return value

    def get_raw(self, key: str) -> object:
        return self._obj[key]

    def get_dtype(self, key: str) -> np.dtype[np.floating[Any]]:
        tag = self.get_str(key)
        if tag not in TAG_DTYPE:
            raise self.fail(key, f"unknown float dtype {tag!r} (expected one of {list(TAG_DTYPE)})")
        return TAG_DTYPE[tag]

    def get_float_array(
        self, key: str, dtype: np.dtype[np.floating[Any]], shape: tuple[int, ...]
    ) -> NDArray[np.float32]:
        """A float array of a declared ``shape``, whose bin must be exactly its byte count."""
        blob = self.get_bin(key)
        expected = math.prod(shape) * dtype.itemsize  # Python ints: cannot overflow
        if len(blob) != expected:
            raise self.fail(
                key,
                f"declared shape {shape} of {dtype.str} needs {expected} bytes, got {len(blob)}",
            )
        array = np.frombuffer(blob, dtype=dtype)
        if not all_finite(array):
            raise self.fail(key, "holds NaN or Inf values")
        # astype copies into a writable, native-endian float32 array (torch.from_numpy warns
        # on the read-only view frombuffer returns)
        return array.astype(np.float32).reshape(shape)

    def check_elements(self, what: str, count: int, limits: DecodeLimits) -> None:
        """Refuse a declared array of more than ``limits.max_elements`` elements."""
        if count > limits.max_elements:
            raise CodecError(
                f"{self.where}: {what} has {count} elements, over the limit {limits.max_elements}"
            )
