"""Schedule version 2: every draw is a sort by SHA-256, reproducible in any language.

docs/PROTOCOL.md, "Derived values", is the specification; this is its reference
implementation, and docs/conformance/ holds its test vectors. One primitive does all the
drawing: ``sha_order(prefix, n)`` lists 0..n-1 sorted by the first 8 bytes of
SHA-256(prefix + decimal(i)), read as an unsigned big-endian integer, ties by i. Prefixes are
ASCII: a purpose word and the run's integers in decimal (no sign, no leading zeros), each
followed by ":".

| draw            | prefix                          | n                        |
|-----------------|---------------------------------|--------------------------|
| train/eval split| ``split:{seed}:``               | aligned ids              |
| epoch e         | ``shuffle:{seed}:{e}:``         | train positions          |
| clients of step | ``clients:{seed}:{step}:``      | clients                  |
| rows of client j| ``rows:{seed}:{step}:{j}:``     | the client's train rows  |
"""

import hashlib
from collections.abc import Sequence

import numpy as np

__all__ = ["PPM", "client_draw", "epoch_order", "eval_count", "sha_order", "split_order"]

PPM = 1_000_000  # eval_fraction is applied as a whole number of parts per million


def sha_order(prefix: str, n: int) -> np.ndarray:
    """0..n-1 sorted by (first 8 bytes of SHA-256(prefix + str(i)) as big-endian uint64, i).

    Shape (n,), int64. About 1 microsecond per position (one SHA-256 of a short string each).
    """
    base = hashlib.sha256(prefix.encode("ascii"))
    keys = bytearray(8 * n)
    for i in range(n):
        h = base.copy()
        h.update(b"%d" % i)
        keys[8 * i : 8 * i + 8] = h.digest()[:8]
    order = np.argsort(np.frombuffer(keys, dtype=">u8"), kind="stable")  # stable: ties by i
    return order.astype(np.int64)


def eval_count(n: int, eval_fraction: float) -> int:
    """Eval positions of n, in integers: round half up of n * P / 10^6, at most n - 1.

    P is eval_fraction * 10^6 (one IEEE-754 double multiplication) rounded to the nearest
    integer, halves up. For any fraction written with at most 6 decimals that product is
    within 1e-9 of the intended integer, so P is exact whatever the implementation.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    x = eval_fraction * PPM
    p = int(x)  # x >= 0: truncation is floor, and x - p is exact
    if x - p >= 0.5:
        p += 1
    return min(n - 1, (n * p + PPM // 2) // PPM)


def split_order(n: int, seed: int) -> np.ndarray:
    """A permutation of 0..n-1; its first eval_count positions are the eval set."""
    return sha_order(f"split:{seed}:", n)


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which epoch ``epoch`` (0-based) visits the n train positions."""
    return sha_order(f"shuffle:{seed}:{epoch}:", n)


def client_draw(
    sizes: Sequence[int], *, clients: int, rows: int, seed: int, step: int
) -> list[tuple[int, np.ndarray]]:
    """Step ``step``'s clients and their rows: (client index, row indices within the client)
    for the first ``min(clients, len(sizes))`` clients of the step's client order, listed in
    ascending index order, each with the first ``min(rows, sizes[c])`` of its row order."""
    chosen = np.sort(sha_order(f"clients:{seed}:{step}:", len(sizes))[:clients])
    return [(c, sha_order(f"rows:{seed}:{step}:{c}:", sizes[c])[:rows]) for c in chosen.tolist()]
