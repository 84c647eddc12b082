"""How many points each stage of batched k-means samples, and the seeded subsample of
shared/pq/_seeding.py as indices, with numpy alone. Both k-means backends (the numba kernels
behind shared/pq/kmeans.py and the torch one, shared/pq/_torch.py) size their samples here.

``_seeding.subsample_groups`` (numba) picks ``keep`` of a group's ``n`` points with the first
``keep`` steps of a Fisher-Yates shuffle driven by given uniforms: step j swaps slot j with
slot ``k_j = j + floor(u_j (n - j))`` (at most n - 1), and slot j is final after it. The torch
k-means backend (shared/pq/_torch.py) needs the same points on a GPU, from the same uniforms,
without numba (which a GPU machine may lack) and without a Python loop over ``keep`` steps
(~2 ms a subsample, as long as a whole GPU k-means). ``subsample_indices`` gets the identical
choice in a few vectorized passes:

    the value step j takes is the value slot k_j holds just before step j. A slot p >= j was
    written before step j only by earlier steps that swapped into it (k_i = p, i < j), the last
    of which put there what *its* slot i held just before step i; if none did, slot p still
    holds p. So the value is found by following "last earlier step that swapped into this
    slot" from (k_j, j) to (i, i) to ... until no such step exists: a chain that is almost
    always 0-2 links long (collisions among keep draws of n slots).

tests/shared/test_kmeans_torch.py checks it against the numba kernel on many (n, keep).
"""

import numpy as np

__all__ = [
    "COARSE_MIN_POINTS",
    "KMEANSPP_MIN_POINTS",
    "KMEANSPP_POINTS_PER_CENTROID",
    "MIN_TRAIN_POINTS",
    "REFINE_ITERATIONS",
    "SUBSAMPLE_FACTOR",
    "subsample_indices",
]

# k-means++ is L sequential passes over the points; seeding on a random subsample of this many
# points per centroid (at least KMEANSPP_MIN_POINTS) keeps it from dominating at large L.
KMEANSPP_POINTS_PER_CENTROID = 16
KMEANSPP_MIN_POINTS = 1024
# A training subsample (max_points_per_centroid) never has fewer points than this: at L = 2
# faiss's 256 L = 512 points leave FEMNIST activations 1 % worse than all points; over 11
# seeds, 2048 points 0.48 % worse (median 0.6908), 4096 0.13 % (0.6883; all: 0.6874).
MIN_TRAIN_POINTS = 4096
# ...and one is drawn only when N exceeds it this many times over: below, drawing it and the
# extra final pass over all points cost more than the smaller iterations save, and training
# on all points lowers the error (FEMNIST q=288 L=16, N=5760 against 4096: 2.9 ms against
# 3.3 ms per batch, relative error 0.417 against 0.419; docs/PERFORMANCE.md).
SUBSAMPLE_FACTOR = 2
# Coarse to fine: early iterations move the centroids far and need few points to do it;
# the last ones settle them and need all. With half the points for the first 6 of 10 and
# all for the last 4, a batch costs 7 passes over all points instead of 11 (the first
# assignment and 10 updates): on real activations, 0.82x the time at L = 32 (error 0.4136
# against 0.4117 on all points; faiss 0.4221) and 0.76x at L = 240 (0.2094 against 0.2092;
# faiss 0.2100); 3 last iterations instead of 4 were ~5 % faster and 0.1-0.2 % worse
# (docs/PERFORMANCE.md).
REFINE_ITERATIONS = 4
# ...and only when the coarse fraction still has as many points per group as k-means++
# seeds on, so that it can place every centroid.
COARSE_MIN_POINTS = KMEANSPP_MIN_POINTS


def subsample_indices(n: int, uniforms: np.ndarray) -> np.ndarray:
    """The indices (G, keep) int64, ascending per group, of the points that
    ``_seeding.subsample_groups(points, uniforms)`` keeps of (G, n, s) points.

    uniforms: (G, keep) float64 in [0, 1), keep <= n.
    """
    g, keep = uniforms.shape
    if keep > n:
        raise ValueError(f"cannot keep {keep} of {n} points")
    if g * n * keep >= 1 << 62:  # the (group, slot, step) keys below must fit in int64
        return np.stack([subsample_indices(n, uniforms[i : i + 1])[0] for i in range(g)])
    steps = np.arange(keep, dtype=np.int64)
    # the numba kernel's int(u * (n - j)) in float64, truncated, clamped to the last slot
    slots = steps + np.minimum((uniforms * (n - steps)).astype(np.int64), n - steps - 1)
    group = np.arange(g, dtype=np.int64)[:, None] * n
    # one sorted key per swap: (group, target slot, step); a query (group, slot, step) finds the
    # last earlier swap into that slot as the key just below its own
    keys = np.sort(((group + slots) * keep + steps).ravel())
    where = (group + slots).ravel()  # current slot of each step's value, with its group
    when = np.broadcast_to(steps, (g, keep)).ravel().copy()  # ...just before this step
    values = np.empty(g * keep, dtype=np.int64)
    todo = np.arange(g * keep)
    while len(todo):
        query = where[todo] * keep + when[todo]
        below = np.searchsorted(keys, query) - 1
        found = below >= 0
        found[found] = keys[below[found]] // keep == where[todo[found]]
        done = todo[~found]
        values[done] = where[done]
        earlier = keys[below[found]] % keep  # that step's own slot, just before that step
        todo = todo[found]
        where[todo] = where[todo] - where[todo] % n + earlier
        when[todo] = earlier
    chosen = values.reshape(g, keep) - group
    chosen.sort(axis=1)
    return chosen
