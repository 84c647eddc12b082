"""Float arrays on the wire: one msgpack ``bin`` of little-endian IEEE values plus a dtype tag.

In memory every float array is float32; on the wire it may be float16 (``f2``) or float32
(``f4``). Every float array on the wire is finite: a value that is NaN or Inf, or that
overflows the wire dtype, cannot be sent.
"""

from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from shared.types import WireFloat

__all__ = [
    "TAG_DTYPE",
    "RangeError",
    "WireFloat",
    "all_finite",
    "check_float32",
    "float_bin",
]

# Float dtype of an array on the wire. Always little-endian, whatever the host.
_WIRE_TAG: Final[dict[str, str]] = {"float32": "f4", "float16": "f2"}
TAG_DTYPE: Final[dict[str, np.dtype[np.floating[Any]]]] = {
    "f4": np.dtype("<f4"),
    "f2": np.dtype("<f2"),
}


class RangeError(ValueError):
    """A finite float32 array with values beyond the range of the wire dtype asked for.

    Raised by encoders (never by decoders): the sender may fall back to a wider dtype.
    """


def float_bin(array: NDArray[np.float32], wire: WireFloat, name: str) -> tuple[str, bytes]:
    """(dtype tag, little-endian bytes in row-major order) of a float32 array.

    Raises ``ValueError`` for NaN or Inf values, and its subclass ``RangeError`` when every
    value is finite but some overflow ``wire`` (e.g. 1e5 in float16).
    """
    try:
        tag = _WIRE_TAG[wire]
    except KeyError:
        raise ValueError(
            f"wire dtype for {name} must be 'float32' or 'float16', got {wire!r}"
        ) from None
    # Values beyond the float16 range become Inf in the cast; the finite check reports them.
    with np.errstate(over="ignore"):
        cast = array.astype(TAG_DTYPE[tag], order="C", copy=False)
    if not all_finite(cast):
        if cast.dtype != array.dtype and all_finite(array):
            raise RangeError(f"{name} holds values beyond the {wire} range")
        raise ValueError(f"{name} holds NaN or Inf values (or values beyond the {wire} range)")
    return tag, cast.tobytes()


def all_finite(array: NDArray[np.floating[Any]]) -> bool:
    """Whether no value of a float16 or float32 array is NaN or Inf."""
    if array.size == 0:
        return True
    if array.dtype.itemsize == 2:
        # numpy's float16 isfinite converts every element (~20x slower than this): a half is
        # NaN or Inf exactly when its 5 exponent bits are all ones, i.e. |bits| >= 0x7C00.
        magnitudes = array.view(array.dtype.str.replace("f", "u")) & np.uint16(0x7FFF)
        return int(magnitudes.max()) < 0x7C00
    return bool(np.isfinite(array).all())


def check_float32(array: object, name: str, *, ndim: int) -> None:
    """Raise unless ``array`` is a float32 numpy array of ``ndim`` non-empty dimensions."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(array).__name__}")
    if array.dtype != np.float32:
        raise TypeError(f"{name} must be float32, got {array.dtype}")
    if array.ndim != ndim or 0 in array.shape:
        raise ValueError(f"{name} must have {ndim} non-empty dimensions, got shape {array.shape}")
