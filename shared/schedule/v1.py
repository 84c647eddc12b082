"""Schedule version 1: the draws of runs stored before version 2, from numpy's generator.

Kept only so that such runs resume bit-identically: these are ``numpy.random.default_rng``
(PCG64 seeded through SeedSequence) permutations and choices, which another language cannot
reproduce without reimplementing numpy. New runs use version 2 (``shared.schedule.v2``,
docs/PROTOCOL.md, "Derived values"). Every function here is exactly the pre-version code.
"""

from collections.abc import Sequence

import numpy as np

__all__ = ["client_draw", "epoch_order", "eval_count", "split_order"]


def eval_count(n: int, eval_fraction: float) -> int:
    """Eval positions of n: Python's round(n * eval_fraction) (half to even), at most n - 1."""
    return min(n - 1, int(round(n * eval_fraction)))


def split_order(n: int, seed: int) -> np.ndarray:
    """A permutation of 0..n-1; its first eval_count positions are the eval set."""
    return np.random.default_rng([seed, 0x5E7]).permutation(n)


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which epoch ``epoch`` (0-based) visits the n train positions."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def client_draw(
    sizes: Sequence[int], *, clients: int, rows: int, seed: int, step: int
) -> list[tuple[int, np.ndarray]]:
    """Step ``step``'s clients and their rows: (client index, row indices within the client)
    for ``min(clients, len(sizes))`` distinct clients in ascending index order, each with
    ``min(rows, sizes[c])`` distinct rows in drawn order."""
    rng = np.random.default_rng([seed, 0xC11E7, step])
    k = min(clients, len(sizes))
    chosen = np.sort(rng.choice(len(sizes), size=k, replace=False))
    return [(c, rng.permutation(sizes[c])[:rows]) for c in chosen.tolist()]
