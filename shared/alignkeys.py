"""Aligning a run in binary: key prefixes up, a bitmap back (docs/PROTOCOL.md section 8.1).

The JSON alignment (``POST /v1/runs/{id}/alignment``) sends every aligned key as 64 hex
characters and gets every kept one back the same way: about 135 bytes per id, 3.9 MB for a
29,000-id intersection, more than the PSI itself. Here party A sends the first ``p`` bytes of
each aligned key (16 by default), sorted, in one ``bin``, and party B answers with one bit
per key sent: kept or not. Party A already holds the full keys, so nothing else needs to
travel: 16 bytes and one bit per id.

A prefix names one of party B's ids as long as no two of party B's keys share it; with 16
bytes that needs 2^64 ids before it is even likely, and party B refuses an offered prefix
that two of its ids share (422 ``invalid-request``) rather than guess. Truncating reveals
less than the full keys, never more.

Bit ``i`` of the bitmap is bit ``7 - (i mod 8)`` of byte ``i div 8`` (most significant bit
first, numpy's ``packbits``), for key ``i`` in the order of the request; the padding bits of
the last byte are 0.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from shared.wire.envelope import MessageType, open_message, pack
from shared.wire.reader import DEFAULT_LIMITS, CodecError, DecodeLimits

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_PREFIX",
    "MIN_PREFIX",
    "AlignReply",
    "AlignRequest",
    "AmbiguousPrefix",
    "decode_align_reply",
    "decode_align_request",
    "encode_align_reply",
    "encode_align_request",
    "kept_bitmap",
    "match_prefixes",
    "request_for",
]

DEFAULT_PREFIX: Final = 16  # bytes of each aligned key party A sends
MIN_PREFIX: Final = 8
MAX_PREFIX: Final = 32  # the whole HMAC-SHA256
_MAX_COUNT: Final = 2**31 - 1


class AmbiguousPrefix(ValueError):
    """An offered prefix that two of party B's keys share: longer prefixes would do."""


@dataclass(frozen=True)
class AlignRequest:
    """A -> B: ``prefix`` bytes of each aligned key, concatenated in ascending order.

    keys: ``n * prefix`` bytes; n >= 1; no prefix twice.
    """

    prefix: int
    keys: bytes

    def __post_init__(self) -> None:
        if not MIN_PREFIX <= self.prefix <= MAX_PREFIX:
            raise ValueError(f"prefix must be {MIN_PREFIX}..{MAX_PREFIX} bytes, got {self.prefix}")
        if not self.keys or len(self.keys) % self.prefix:
            raise ValueError(
                f"keys must be a positive multiple of the prefix ({self.prefix} bytes), "
                f"got {len(self.keys)} bytes"
            )
        rows = np.frombuffer(self.keys, dtype=np.uint8).reshape(-1, self.prefix)
        if len(rows) > 1:
            order = np.lexsort(rows.T[::-1])  # rows sorted as byte strings
            if not np.array_equal(order, np.arange(len(rows))):
                raise ValueError("keys must be in ascending byte order")
            if bool((rows[1:] == rows[:-1]).all(axis=1).any()):
                raise ValueError("a key prefix appears twice")

    @property
    def n(self) -> int:
        return len(self.keys) // self.prefix

    def prefixes(self) -> list[bytes]:
        p = self.prefix
        return [self.keys[i : i + p] for i in range(0, len(self.keys), p)]


@dataclass(frozen=True)
class AlignReply:
    """B -> A: which keys of the request party B kept, and the run's split sizes.

    n: the request's number of keys; kept: ceil(n / 8) bytes, one bit per key (see above);
    train, eval: sizes of the run's split of the kept keys (docs/PROTOCOL.md 9.3).
    """

    n: int
    kept: bytes
    train: int
    eval: int

    def __post_init__(self) -> None:
        if self.n < 1 or len(self.kept) != (self.n + 7) // 8:
            raise ValueError(f"a bitmap of {self.n} keys has {(self.n + 7) // 8} bytes")
        if self.n % 8 and self.kept[-1] & (0xFF >> (self.n % 8)):
            raise ValueError("the bitmap's padding bits must be 0")
        if self.train < 0 or self.eval < 0 or self.train + self.eval != self.count:
            raise ValueError(f"train + eval must be the {self.count} kept keys")

    @property
    def count(self) -> int:
        return int(np.unpackbits(np.frombuffer(self.kept, dtype=np.uint8)).sum())

    def mask(self) -> np.ndarray:
        """(n,) bool: key i of the request was kept."""
        bits = np.unpackbits(np.frombuffer(self.kept, dtype=np.uint8))[: self.n]
        mask: np.ndarray = bits.astype(bool)
        return mask


# ============================================================================ wire


def encode_align_request(message: AlignRequest) -> bytes:
    return pack(MessageType.ALIGN_REQUEST, {"p": message.prefix, "k": message.keys})


def decode_align_request(data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> AlignRequest:
    """Parse an AlignRequest; ``CodecError`` for anything malformed."""
    f = open_message(data, MessageType.ALIGN_REQUEST, frozenset({"p", "k"}), limits)
    prefix = f.get_int("p", MIN_PREFIX, MAX_PREFIX)
    try:
        return AlignRequest(prefix=prefix, keys=f.get_bin("k"))
    except ValueError as exc:
        raise CodecError(f"align_req.k: {exc}") from None


def encode_align_reply(message: AlignReply) -> bytes:
    fields = {"n": message.n, "m": message.kept, "train": message.train, "eval": message.eval}
    return pack(MessageType.ALIGN_REPLY, fields)


def decode_align_reply(data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> AlignReply:
    """Parse an AlignReply; ``CodecError`` for anything malformed."""
    keys = frozenset({"n", "m", "train", "eval"})
    f = open_message(data, MessageType.ALIGN_REPLY, keys, limits)
    try:
        return AlignReply(
            n=f.get_int("n", 1, _MAX_COUNT),
            kept=f.get_bin("m"),
            train=f.get_int("train", 0, _MAX_COUNT),
            eval=f.get_int("eval", 0, _MAX_COUNT),
        )
    except ValueError as exc:
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"align_res: {exc}") from None


# ============================================================================ both sides


def request_for(
    keys: Iterable[bytes], prefix: int = DEFAULT_PREFIX
) -> tuple[AlignRequest, list[bytes]]:
    """Party A: the request for these aligned keys, and the full keys in the request's order
    (to read the reply's bitmap against)."""
    ordered = sorted(set(keys), key=lambda k: k[:prefix])
    return AlignRequest(prefix=prefix, keys=b"".join(k[:prefix] for k in ordered)), ordered


def match_prefixes(own: Sequence[bytes], request: AlignRequest) -> list[bytes | None]:
    """Party B: for each key of the request, the one of ``own`` (its aligned keys) it is a
    prefix of, or None. :class:`AmbiguousPrefix` if two of ``own`` share an offered prefix."""
    p = request.prefix
    by_prefix: dict[bytes, bytes] = {}
    shared: set[bytes] = set()
    for key in own:
        head = key[:p]
        if head in by_prefix and by_prefix[head] != key:
            shared.add(head)
        by_prefix[head] = key
    offered = request.prefixes()
    clash = shared.intersection(offered)
    if clash:
        raise AmbiguousPrefix(
            f"{len(clash)} offered {p}-byte key prefix(es) belong to more than one of party B's "
            f"ids; send longer prefixes (up to {MAX_PREFIX} bytes)"
        )
    return [by_prefix.get(head) for head in offered]


def kept_bitmap(matched: Sequence[bytes | None], aligned: set[bytes]) -> bytes:
    """Party B: the reply's bitmap, bit i set when request key i matched a key in ``aligned``."""
    bits = np.array([m is not None and m in aligned for m in matched], dtype=bool)
    return np.packbits(bits).tobytes()
