"""The aligned key of a sample: HMAC-SHA256 under a per-run key, the same on both sides.

A private set intersection (``shared.psi``) decides *which* ids both parties hold; party A
then sends the HMACs of those ids, and no others, to align a run. Both parties compute batch
digests over these keys, and order them by the raw ids they share, so raw ids never travel.
"""

import hashlib
import hmac
from collections.abc import Iterable

__all__ = ["KEY_BYTES", "hmac_ids", "order_by_raw_id"]

KEY_BYTES = 32


def hmac_ids(key: bytes, ids: Iterable[str]) -> list[bytes]:
    """HMAC-SHA256(key, id) of every id (32 bytes each), in input order."""
    return [hmac.new(key, i.encode("utf-8"), hashlib.sha256).digest() for i in ids]


def order_by_raw_id(ids: list[str], keys: list[bytes], common: set[bytes]) -> list[bytes]:
    """The aligned keys in ``common``, ordered by the raw id each party holds for them.

    ``keys[i]`` is the aligned key of ``ids[i]``. Both parties know the raw ids of the samples
    they share, so both get the same order; it does not depend on the random per-run key.
    """
    return [k for _, k in sorted((i, k) for i, k in zip(ids, keys, strict=True) if k in common)]
