"""Codewords at their empirical entropy: a static rANS coder with one frequency table per group.

docs/PROTOCOL.md section 3.1 is the normative description; in short, for a chunk's ``(B, q)``
codewords in ``R`` groups of ``q/R`` sub-vector positions, ``L`` codewords per codebook:

* **table** ``cf``: ``R·L`` little-endian uint16 frequencies, group by group; each group's sum
  to exactly ``M = 2**15``; a codeword whose frequency is 0 cannot occur in its group.
* **stream** ``ca``: the codewords in row-major order, codeword ``(r, j)`` coded with the table
  of group ``j // (q/R)``, by the byte-wise rANS of Giesen's ``rans_byte.h`` (32-bit state,
  lower bound ``2**23``): 4 bytes of the final state, little-endian, then the bytes the
  decoder reads in order. A decoder ends with exactly the initial state ``2**23`` and every
  byte read, so each stream has one reading.

How party A picks the frequencies (each group's counts scaled to ``M``, every codeword that
occurs at least 1) is not normative: any table that codes the codewords decodes. A chunk
whose table plus stream is not smaller than the bit-packed codewords (section 3) goes
bit-packed (``smaller_than_packed`` returns None then).

Compiled with numba (sequential loops: the bytes depend on the input only).
"""

import numba
import numpy as np
from numpy.typing import NDArray

from shared.wire.bitpack import packed_nbytes

__all__ = ["SCALE_BITS", "bin_size", "decode", "encode", "frequencies", "smaller_than_packed"]

SCALE_BITS = 15  # the frequencies of a group sum to M = 2**15, so each fits a uint16
_M = 1 << SCALE_BITS
_LOW = 1 << 23  # the state's lower bound; the state stays in [2**23, 2**31)

_jit = numba.njit(cache=True, nogil=True)


def frequencies(codes: NDArray[np.int64], R: int, L: int) -> NDArray[np.uint16] | None:
    """(R, L) frequencies summing to 2**15 per group, each occurring codeword >= 1 (None
    when a group has more distinct codewords than 2**15)."""
    B, q = codes.shape
    groups = codes.reshape(B, R, q // R).transpose(1, 0, 2).reshape(R, -1)
    out = np.zeros((R, L), dtype=np.int64)
    for r in range(R):
        counts = np.bincount(groups[r], minlength=L)
        present = counts > 0
        if int(present.sum()) > _M:
            return None
        scaled = np.where(present, np.maximum(1, counts * _M // max(1, groups.shape[1])), 0)
        # the rounding error goes to (or comes from) the most frequent codeword
        top = int(np.argmax(scaled))
        scaled[top] += _M - int(scaled.sum())
        if scaled[top] < 1:  # many rare codewords rounded up: take the excess from the others
            return None
        out[r] = scaled
    return out.astype(np.uint16)


def encode(codes: NDArray[np.int64], R: int, L: int) -> tuple[bytes, bytes] | None:
    """(table ``cf``, stream ``ca``) of a chunk's (B, q) codewords (None when a group has more
    distinct codewords than 2**15, which no table of this format codes)."""
    B, q = codes.shape
    freq = frequencies(codes, R, L)
    if freq is None:
        return None
    cum = np.zeros((R, L), dtype=np.int64)
    cum[:, 1:] = np.cumsum(freq.astype(np.int64), axis=1)[:, :-1]
    out = np.empty(2 * B * q + 8, dtype=np.uint8)  # a codeword emits at most 2 bytes
    flat = np.ascontiguousarray(codes, dtype=np.int64).reshape(-1)
    used = _encode(flat, q // R, q, freq.astype(np.int64), cum, out)
    return freq.astype("<u2").tobytes(), out[out.shape[0] - used :].tobytes()


def bin_size(n: int) -> int:
    """Bytes of a msgpack bin of ``n`` bytes, header included."""
    return n + (2 if n < 1 << 8 else 3 if n < 1 << 16 else 5)


def smaller_than_packed(codes: NDArray[np.int64], R: int, L: int) -> tuple[bytes, bytes] | None:
    """``encode``'s (table, stream) where the two fields take fewer bytes on the wire than the
    one bit-packed field (section 3) they replace; None where they do not."""
    B, q = codes.shape
    coded = encode(codes, R, L)
    if coded is None:
        return None
    table, stream = coded
    packed = bin_size(packed_nbytes(B * q, (L - 1).bit_length()))
    return coded if 3 + bin_size(len(table)) + bin_size(len(stream)) < packed else None


@_jit
def _encode(
    symbols: np.ndarray, per_group: int, q: int, freq: np.ndarray, cum: np.ndarray, out: np.ndarray
) -> int:
    """Bytes written at the end of ``out``, backwards (``out`` holds 2 per codeword + 8)."""
    x = np.uint64(_LOW)
    pos = out.shape[0]
    for i in range(symbols.shape[0] - 1, -1, -1):
        g = (i % q) // per_group
        s = symbols[i]
        f = np.uint64(freq[g, s])
        x_max = np.uint64((_LOW >> SCALE_BITS) << 8) * f
        while x >= x_max:
            pos -= 1
            out[pos] = np.uint8(x & np.uint64(0xFF))
            x >>= np.uint64(8)
        x = ((x // f) << np.uint64(SCALE_BITS)) + (x % f) + np.uint64(cum[g, s])
    for k in range(3, -1, -1):  # the final state, little-endian, in front
        pos -= 1
        out[pos] = np.uint8((x >> np.uint64(8 * k)) & np.uint64(0xFF))
    written: int = out.shape[0] - pos
    return written


def decode(table: bytes, stream: bytes, B: int, q: int, R: int, L: int) -> NDArray[np.int64]:
    """The (B, q) codewords of a table and stream; ValueError for anything malformed."""
    if len(table) != 2 * R * L:
        raise ValueError(f"the table holds {len(table)} bytes, not 2*R*L = {2 * R * L}")
    freq = np.frombuffer(table, dtype="<u2").astype(np.int64).reshape(R, L)
    sums = freq.sum(axis=1)
    if (sums != _M).any():
        r = int(np.flatnonzero(sums != _M)[0])
        raise ValueError(f"group {r}'s frequencies sum to {int(sums[r])}, not 2**15")
    if len(stream) < 4:
        raise ValueError("the stream is shorter than its 4-byte state")
    cum = np.zeros((R, L + 1), dtype=np.int64)
    cum[:, 1:] = np.cumsum(freq, axis=1)
    out = np.empty(B * q, dtype=np.int64)
    status = _decode(np.frombuffer(stream, dtype=np.uint8), q // R, q, freq, cum, out)
    if status == 1:
        raise ValueError("the stream ends before its last codeword")
    if status == 2:
        raise ValueError("the stream does not end in the initial state with every byte read")
    return out.reshape(B, q)


@_jit
def _decode(
    data: np.ndarray, per_group: int, q: int, freq: np.ndarray, cum: np.ndarray, out: np.ndarray
) -> int:
    """0, or 1 (ran out of bytes) / 2 (bytes left or a state other than the initial one)."""
    x = np.uint64(0)
    for k in range(4):
        x |= np.uint64(data[k]) << np.uint64(8 * k)
    pos = 4
    mask = np.uint64(_M - 1)
    for i in range(out.shape[0]):
        g = (i % q) // per_group
        slot = np.int64(x & mask)
        lo, hi = 0, freq.shape[1]  # the codeword s with cum[s] <= slot < cum[s + 1]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if cum[g, mid] <= slot:
                lo = mid
            else:
                hi = mid
        s = lo
        out[i] = s
        x = np.uint64(freq[g, s]) * (x >> np.uint64(SCALE_BITS)) + np.uint64(slot - cum[g, s])
        while x < np.uint64(_LOW):
            if pos >= data.shape[0]:
                return 1
            x = (x << np.uint64(8)) | np.uint64(data[pos])
            pos += 1
    if pos != data.shape[0] or x != np.uint64(_LOW):
        return 2
    return 0
