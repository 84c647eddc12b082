"""Compiled (numba) sampling of shared/pq/kmeans.py: the training subsample and k-means++ seeding.

Same rules as shared/pq/_kernels.py (whose helpers and compile settings this reuses):
sequential, so the output depends on the input only, never on the thread count, and cached
on disk. The one exception to "no reassociation" is the k-means++ potential, which only
ranks candidates (see ``_jit_reduce``).
"""

from typing import Any

import numba
import numpy as np

from shared.pq._kernels import coef8, jit, rows8

__all__ = ["kmeanspp_groups", "subsample_groups"]


@jit
def subsample_groups(points: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """A random subset of ``keep`` points of every group, in their original order.

    points (G, n, s); uniforms (G, keep) in [0, 1), keep <= n -> (G, keep, s) float32. The
    first ``keep`` steps of a Fisher-Yates shuffle (step j swaps slot j with a slot drawn
    from j..n-1) pick a uniform subset; a mask puts it back in order with no sort (numpy's
    choice without replacement permutes and sorts; 4x slower at n = 23,040).
    """
    g, n, s = points.shape
    keep = uniforms.shape[1]
    out = np.empty((g, keep, s), dtype=np.float32)
    slots = np.empty(n, dtype=np.int64)
    chosen = np.empty(n, dtype=np.bool_)
    for group in range(g):
        for i in range(n):
            slots[i] = i
            chosen[i] = False
        for j in range(keep):
            k = j + min(int(uniforms[group, j] * (n - j)), n - j - 1)
            slots[j], slots[k] = slots[k], slots[j]
            chosen[slots[j]] = True
        j = 0
        for i in range(n):
            if chosen[i]:
                for d in range(s):
                    out[group, j, d] = points[group, i, d]
                j += 1
    return out


@jit
def _sqdiff8(c: tuple[float, ...], q: tuple[np.ndarray, ...], i: int) -> Any:
    """sum_j (q[j][i] - c[j])^2 over 8 dimensions, in float32, in a fixed order."""
    d0, d1, d2, d3 = q[0][i] - c[0], q[1][i] - c[1], q[2][i] - c[2], q[3][i] - c[3]
    d4, d5, d6, d7 = q[4][i] - c[4], q[5][i] - c[5], q[6][i] - c[6], q[7][i] - c[7]
    return ((d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3)) + ((d4 * d4 + d5 * d5) + (d6 * d6 + d7 * d7))


@jit
def _distances_to(pt: np.ndarray, centroid: np.ndarray, out: np.ndarray) -> None:
    """out[i] = ||p_i - c||^2 for every point of pt (s, n), in float32 (8 dimensions per
    pass over out when s is a multiple of 8, one otherwise)."""
    s, n = pt.shape
    if s % 8 == 0:
        c = coef8(centroid, 0)
        q = rows8(pt, 0, 0, n)
        for i in range(n):
            out[i] = _sqdiff8(c, q, i)
        for k in range(8, s, 8):
            c = coef8(centroid, k)
            q = rows8(pt, k, 0, n)
            for i in range(n):
                out[i] += _sqdiff8(c, q, i)
        return
    for i in range(n):
        out[i] = 0.0
    for k in range(s):
        ck = centroid[k]
        pk = pt[k]
        for i in range(n):
            diff = pk[i] - ck
            out[i] += diff * diff


@jit
def _distances4(pt: np.ndarray, p: np.ndarray, picks: np.ndarray, t: int, out: np.ndarray) -> None:
    """out[t + j] = squared distances of every point of pt (s, n) to p[picks[t + j]] (j < 4),
    s a multiple of 8; the same bits as :func:`_distances_to`, with each loaded point row
    serving four candidates."""
    s, n = pt.shape
    o0, o1, o2, o3 = out[t], out[t + 1], out[t + 2], out[t + 3]
    for k in range(0, s, 8):
        q = rows8(pt, k, 0, n)
        c0, c1 = coef8(p[picks[t]], k), coef8(p[picks[t + 1]], k)
        c2, c3 = coef8(p[picks[t + 2]], k), coef8(p[picks[t + 3]], k)
        if k == 0:
            for i in range(n):
                d0, d1 = _sqdiff8(c0, q, i), _sqdiff8(c1, q, i)
                d2, d3 = _sqdiff8(c2, q, i), _sqdiff8(c3, q, i)
                o0[i], o1[i], o2[i], o3[i] = d0, d1, d2, d3
        else:
            for i in range(n):
                d0, d1 = _sqdiff8(c0, q, i), _sqdiff8(c1, q, i)
                d2, d3 = _sqdiff8(c2, q, i), _sqdiff8(c3, q, i)
                o0[i] += d0
                o1[i] += d1
                o2[i] += d2
                o3[i] += d3


@jit
def _candidate_distances(pt: np.ndarray, p: np.ndarray, picks: np.ndarray, out: np.ndarray) -> None:
    """out[t] = squared distances of every point of pt (s, n) to the candidate p[picks[t]]."""
    t = 0
    if pt.shape[0] % 8 == 0:
        while t + 4 <= picks.shape[0]:
            _distances4(pt, p, picks, t, out)
            t += 4
    while t < picks.shape[0]:
        _distances_to(pt, p[picks[t]], out[t])
        t += 1


# Only for sums whose order may be the compiler's: reassociation lets it split a reduction
# into vector lanes (4x faster here), in an order fixed by the compiled code (per machine,
# never per thread count), so the output still depends on the input only.
_jit_reduce = numba.njit(
    cache=True, nogil=True, boundscheck=False, fastmath={"contract", "reassoc"}
)


@_jit_reduce
def _potential(closest: np.ndarray, candidate: np.ndarray) -> float:
    """sum_i min(closest[i], candidate[i]) in float64: the k-means++ potential if candidate
    joins, which only ranks the candidates (so its summation order may be the compiler's)."""
    total = 0.0
    for i in range(closest.shape[0]):
        total += min(closest[i], candidate[i])
    return total


@jit
def kmeanspp_groups(
    points: np.ndarray, pt: np.ndarray, num: int, first: np.ndarray, uniforms: np.ndarray
) -> np.ndarray:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii, 2007; as scikit-learn's) per group.

    points (G, n, s), pt (G, s, n) float32; first (G,) index of each group's first centroid;
    uniforms (G, L, T) in [0, 1): T candidates per further centroid are drawn with probability
    proportional to the squared distance to the nearest centroid so far (the cumulative sum
    searched for u * total), and the one that lowers the potential sum(closest) most is kept.
    Once every point coincides with a chosen centroid (fewer distinct points than L), the
    remaining centroids repeat the last one; the assignment never uses such duplicates.
    Returns (G, L, s) float32.
    """
    g, n, s = points.shape
    trials = uniforms.shape[2]
    out = np.empty((g, num, s), dtype=np.float32)
    closest = np.empty(n, dtype=np.float32)
    candidates = np.empty((trials, n), dtype=np.float32)
    picks = np.empty(trials, dtype=np.int64)
    cumulative = np.empty(n, dtype=np.float64)
    for group in range(g):
        p = points[group]
        out[group, 0] = p[first[group]]
        _distances_to(pt[group], p[first[group]], closest)
        chosen = first[group]
        for c in range(1, num):
            total = 0.0
            for i in range(n):
                total += closest[i]
                cumulative[i] = total
            if total <= 0.0:  # every point sits on a centroid already
                out[group, c] = p[chosen]
                continue
            for t in range(trials):  # every draw uses the same weights: all drawn first
                idx = np.searchsorted(cumulative, uniforms[group, c, t] * total, side="right")
                picks[t] = min(idx, n - 1)
            _candidate_distances(pt[group], p, picks, candidates)
            best_potential = np.inf
            best = 0
            for t in range(trials):
                potential = _potential(closest, candidates[t])
                if potential < best_potential:
                    best_potential = potential
                    best = t
            chosen = picks[best]
            out[group, c] = p[chosen]
            nearest = candidates[best]
            for i in range(n):
                closest[i] = min(closest[i], nearest[i])
    return out
