"""The aligned key of a sample: HMAC-SHA256 under a per-run key, the same on both sides.

A private set intersection (``shared.psi``) decides *which* ids both parties hold; party A
then sends the HMACs of those ids, and no others, to align a run. Both parties compute batch
digests over these keys, and order them by the raw ids they share, so raw ids never travel.

Exactly (docs/PROTOCOL.md, "Derived values"; vectors in docs/conformance/hmac.json):

* key: the run's ``alignment_key`` (``RunOut.alignment_key``, 64 lowercase hex characters)
  hex-decoded to 32 bytes;
* message: the sample id's UTF-8 bytes, exactly as in the id column (no trimming, no Unicode
  normalization, no terminator);
* aligned key: HMAC-SHA256(key, message) (RFC 2104), 32 bytes; in JSON and in
  ``PredictRequest.ids`` it travels as 64 lowercase hex characters;
* the aligned list: the aligned keys of the ids both parties hold, ordered by their raw ids
  ascending as UTF-8 byte strings (byte-wise, a prefix first; the same as Unicode code point
  order, not numeric: "u10" < "u9"). Position p of a run is index p in this list.
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
    Python orders str by code point, which is the order of their UTF-8 bytes; ids are unique
    (``shared.idtables``), so the keys never decide.
    """
    return [k for _, k in sorted((i, k) for i, k in zip(ids, keys, strict=True) if k in common)]
