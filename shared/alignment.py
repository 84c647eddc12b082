"""The aligned key of a sample: HMAC-SHA256 under a per-run key, the same on both sides.

Whatever protocol decides *which* ids both parties hold (today an HMAC exchange, later a
private set intersection), both parties order the intersection by this key and compute batch
digests over it, so raw ids never travel during training.
"""

import hashlib
import hmac
from collections.abc import Iterable

__all__ = ["KEY_BYTES", "hmac_ids"]

KEY_BYTES = 32


def hmac_ids(key: bytes, ids: Iterable[str]) -> list[bytes]:
    """HMAC-SHA256(key, id) of every id (32 bytes each), in input order."""
    return [hmac.new(key, i.encode("utf-8"), hashlib.sha256).digest() for i in ids]
