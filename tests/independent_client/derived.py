"""Derived values of docs/PROTOCOL.md section 9 (schedule version 2), from its text."""

import hashlib
import hmac
import math
from collections.abc import Sequence

__all__ = ["aligned_key", "aligned_list", "digest", "order", "shuffle_batch", "split"]


def _key64(text: str) -> bytes:
    """The first 8 bytes of SHA-256(text): compared as bytes, as 9's conventions allow."""
    return hashlib.sha256(text.encode("ascii")).digest()[:8]


def order(prefix: str, n: int) -> list[int]:
    """9.2: 0..n-1 sorted by (key64(prefix + decimal(i)), i)."""
    return sorted(range(n), key=lambda i: (_key64(f"{prefix}{i}"), i))


def aligned_key(alignment_key_hex: str, sample_id: str) -> bytes:
    """9.1: HMAC-SHA256 under the run's key of the id's UTF-8 bytes (32 bytes)."""
    key = bytes.fromhex(alignment_key_hex)
    return hmac.new(key, sample_id.encode("utf-8"), hashlib.sha256).digest()


def aligned_list(alignment_key_hex: str, common_ids: Sequence[str]) -> list[bytes]:
    """9.1: the aligned keys of the common ids, ordered by raw id as UTF-8 bytes."""
    ordered = sorted(common_ids, key=lambda i: i.encode("utf-8"))
    return [aligned_key(alignment_key_hex, i) for i in ordered]


def split(n: int, seed: int, eval_fraction: float) -> tuple[list[int], list[int]]:
    """9.3: (train, eval) aligned positions, each ascending."""
    parts_per_million = math.floor(eval_fraction * 1_000_000 + 0.5)  # halves up
    n_eval = min(n - 1, (n * parts_per_million + 500_000) // 1_000_000)
    drawn = order(f"split:{seed}:", n)
    return sorted(drawn[n_eval:]), sorted(drawn[:n_eval])


class ShuffleSchedule:
    """9.4: step t (from 1) is the t-th slice of batch_size entries of the epoch stream."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self._epochs: dict[int, list[int]] = {}  # each epoch's order, hashed once

    def batch(self, step: int) -> list[int]:
        """Train positions of ``step``, in request row order."""
        start = (step - 1) * self.batch_size
        return [self._entry(k) for k in range(start, start + self.batch_size)]

    def _entry(self, k: int) -> int:
        epoch = k // self.n
        if epoch not in self._epochs:
            self._epochs[epoch] = order(f"shuffle:{self.seed}:{epoch}:", self.n)
        return self._epochs[epoch][k % self.n]


def shuffle_batch(step: int, n: int, batch_size: int, seed: int) -> list[int]:
    return ShuffleSchedule(n, batch_size, seed).batch(step)


def digest(keys: Sequence[bytes]) -> bytes:
    """9.7: SHA-256 over uint16_be(len(key)) ++ key for each key, first 8 bytes."""
    hasher = hashlib.sha256()
    for key in keys:
        hasher.update(len(key).to_bytes(2, "big") + key)
    return hasher.digest()[:8]
