"""Compiled (numba) Lloyd iterations of shared/pq/kmeans.py over the fused assignment of
shared/pq/_kernels.py: update every centroid to its points' mean, reassign, stop a group
once no label changes; all iterations and groups in one compiled call.

Sequential (same rules as shared/pq/_kernels.py): the output depends on the input only.
"""

import numpy as np

from shared.pq._kernels import (
    BLOCK,
    BLOCK_FLOATS,
    assign_block,
    jit,
    prepare,
)

__all__ = ["apply_labels", "assign_range", "lloyd_groups", "lloyd_state", "update_centroids"]


@jit
def update_centroids(centroids: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> None:
    """Every centroid (L, s) with points becomes their mean; an empty one stays."""
    for c in range(centroids.shape[0]):
        if counts[c] > 0:
            for k in range(centroids.shape[1]):
                centroids[c, k] = np.float32(sums[c, k] / counts[c])


# The two halves of an assignment pass: labels for a range of points (shared/pq/_threads.py
# runs several ranges at once, nogil), then the sums moved in point order (one thread).


@jit
def assign_range(
    pt: np.ndarray, centroids: np.ndarray, start: int, stop: int, fresh: np.ndarray
) -> None:
    """fresh[start:stop] = the nearest centroid of points start..stop of one group.

    pt (s, n) float32, the group's points transposed; centroids (L, s) float32; fresh (n,)
    int64. A point's label depends on that point and the centroids only, never on which
    other points share its block or range, so any split of the points gives the same labels.
    """
    s = pt.shape[0]
    num = centroids.shape[0]
    c_sq = np.empty(num, dtype=np.float32)
    scaled = np.empty((num, s), dtype=np.float32)
    prepare(centroids, scaled, c_sq)
    block = max(8, min(BLOCK, BLOCK_FLOATS // s // 8 * 8))
    acc = np.empty((4, block), dtype=np.float32)
    best = np.empty(block, dtype=np.float32)
    spare = np.empty(block, dtype=np.float32)
    label = np.empty(block, dtype=np.int32)
    for first in range(start, stop, block):
        m = min(block, stop - first)
        assign_block(pt, first, m, scaled, c_sq, acc, best, spare, label)
        for i in range(m):
            fresh[first + i] = label[i]


@jit
def apply_labels(
    points: np.ndarray,
    labels: np.ndarray,
    fresh: np.ndarray,
    sums: np.ndarray,
    counts: np.ndarray,
) -> int:
    """labels = fresh, moving every point whose label changed between the float64 sums, in
    point order: however the labels were split across threads, the sums see the same
    additions in the same order.

    points (n, s) float32; labels, fresh (n,) int64 (labels -1: not yet assigned); sums
    (L, s) float64, counts (L,) int64. Returns how many labels changed.
    """
    n, s = points.shape
    changed = 0
    for i in range(n):
        new = fresh[i]
        old = labels[i]
        if new == old:
            continue
        changed += 1
        labels[i] = new
        counts[new] += 1
        for k in range(s):
            sums[new, k] += points[i, k]
        if old >= 0:
            counts[old] -= 1
            for k in range(s):
                sums[old, k] -= points[i, k]
    return changed


@jit
def lloyd_step(
    points: np.ndarray,
    pt: np.ndarray,
    centroids: np.ndarray,
    labels: np.ndarray,
    sums: np.ndarray,
    counts: np.ndarray,
    active: np.ndarray,
    update: bool,
) -> int:
    """One Lloyd iteration on every active group: (with ``update``) move each centroid to the
    mean of its points, then reassign; a group whose labels did not change becomes inactive
    (further updates would not move it). Returns how many groups are still active.

    points (G, n, s), pt (G, s, n) float32; centroids (G, L, s) float32 in/out; labels
    (G, n) int64 in/out, -1 before the first step; sums (G, L, s) float64 and counts (G, L)
    int64, the running sums of each cluster's points; active (G,) bool in/out.
    """
    still = 0
    fresh = np.empty(points.shape[1], dtype=np.int64)
    for group in range(points.shape[0]):
        if not active[group]:
            continue
        if update:
            update_centroids(centroids[group], sums[group], counts[group])
        assign_range(pt[group], centroids[group], 0, points.shape[1], fresh)
        changed = apply_labels(points[group], labels[group], fresh, sums[group], counts[group])
        if update and changed == 0:
            active[group] = False
        else:
            still += 1
    return still


@jit
def lloyd_state(
    points: np.ndarray, centroids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The state of Lloyd's loop before its first assignment, for points (G, n, s) and
    centroids (G, L, s): labels (G, n) int64 all -1 (not yet assigned), float64 sums (G, L, s)
    and int64 counts (G, L) of each cluster's points, zero, and every group active (G,)."""
    g, n, s = points.shape
    num = centroids.shape[1]
    return (
        np.full((g, n), -1, dtype=np.int64),
        np.zeros((g, num, s), dtype=np.float64),
        np.zeros((g, num), dtype=np.int64),
        np.ones(g, dtype=np.bool_),
    )


@jit
def lloyd_groups(
    points: np.ndarray, pt: np.ndarray, centroids: np.ndarray, iterations: int
) -> tuple[np.ndarray, int]:
    """Lloyd's algorithm on every group: at most ``iterations`` updates, each followed by an
    assignment; a group stops once no label changes.

    points (G, n, s), pt (G, s, n) float32; centroids (G, L, s) float32, updated in place
    (an empty cluster keeps its centroid). Returns labels (G, n) int64 of the final centroids
    and the most updates any group ran. One compiled call for all iterations: a call from
    Python costs ~5-10 us of argument unboxing, as much as a whole iteration at L = 2.
    """
    labels, sums, counts, active = lloyd_state(points, centroids)
    lloyd_step(points, pt, centroids, labels, sums, counts, active, False)
    ran = 0
    while ran < iterations and lloyd_step(
        points, pt, centroids, labels, sums, counts, active, True
    ):
        ran += 1
    if ran < iterations:
        ran += 1  # the update that found the labels settled counts, as before
    return labels, ran
