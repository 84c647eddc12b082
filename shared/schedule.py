"""What both parties derive on their own from the run seed, instead of shipping it each step.

Party A and party B never send each other sample ids during training. After alignment both
hold the same ordered list of aligned ids; from it and the run seed each side computes the same
train/eval split, the same batch for every step and the same per-step random seeds. A step
request carries only an 8-byte digest of its batch's ids so that a disagreement is caught
instead of silently training on mismatched rows.
"""

import hashlib
from collections.abc import Sequence

import numpy as np

__all__ = [
    "DIGEST_BYTES",
    "batch_digest",
    "batch_positions",
    "split_train_eval",
    "step_seed",
]

DIGEST_BYTES = 8


def step_seed(run_seed: int, step: int, purpose: str) -> int:
    """A 63-bit seed for one use ("kmeans", "dropout-top", ...) at one step of one run.

    Stable across processes and Python versions (unlike ``hash``), so a replayed or resumed
    step draws exactly the random numbers it drew the first time.
    """
    text = f"{run_seed}:{step}:{purpose}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


def split_train_eval(n: int, *, seed: int, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Positions 0..n-1 of the aligned list split into (train, eval), both sorted.

    The eval part is round(n * eval_fraction) positions drawn by a seeded permutation; at least
    one position stays in train.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    if n < 1:
        raise ValueError("cannot split an empty aligned id list")
    n_eval = min(n - 1, int(round(n * eval_fraction)))
    order = np.random.default_rng([seed, 0x5E7]).permutation(n)
    return np.sort(order[n_eval:]), np.sort(order[:n_eval])


def batch_positions(step: int, *, batch_size: int, n: int, seed: int) -> np.ndarray:
    """Positions (into the train list of length n) of the batch of ``step`` (1-based).

    The train list is visited as an endless stream of seeded permutations, one per epoch;
    batch t is the t-th slice of ``batch_size`` of that stream, so every batch is full and a
    batch may straddle two epochs. Shape (batch_size,), int64.
    """
    if step < 1:
        raise ValueError(f"steps are numbered from 1, got {step}")
    if batch_size < 1 or n < 1:
        raise ValueError(f"batch_size and n must be >= 1, got {batch_size}, {n}")
    start = (step - 1) * batch_size
    stop = start + batch_size
    parts = []
    for epoch in range(start // n, (stop - 1) // n + 1):
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        lo = max(start - epoch * n, 0)
        hi = min(stop - epoch * n, n)
        parts.append(perm[lo:hi])
    return np.concatenate(parts).astype(np.int64)


def batch_digest(ids: Sequence[bytes]) -> bytes:
    """8-byte digest of an ordered list of (aligned, hashed) ids."""
    h = hashlib.sha256()
    for item in ids:
        h.update(len(item).to_bytes(2, "big"))
        h.update(item)
    return h.digest()[:DIGEST_BYTES]
