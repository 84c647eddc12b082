"""Batched, seeded k-means over many independent groups at once.

The grouped product quantizer clusters R groups of subvectors per batch. Looping over groups
in Python costs 5-40x more than clustering them all in one set of batched tensor ops when R is
large (q=4608, R=1152 in the paper's grid), so every step here works on a (G, N, s) tensor:
G groups, N points per group, s dimensions per point.

Behaviour that callers can rely on:

* Deterministic: the same points, L, seed and thread count give bit-identical output.
* Init is k-means++ (Arthur & Vassilvitskii, 2007), seeded on a random subsample of at most
  max(1024, 16 L) points per group so that its L sequential passes stay cheap at large L.
* At most ``iterations`` Lloyd iterations; stops early once no assignment changes.
* An empty cluster keeps its previous centroid (it never becomes NaN).
* A group with fewer distinct points than L gets duplicate centroids; ``argmin`` picks the
  lowest index among equal distances, so the duplicates are never used and the
  reconstruction of that group is exact.
"""

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = ["KMeansResult", "batched_kmeans", "assign", "squared_distances"]

InitMethod = Literal["kmeans++", "random"]

# k-means++ is L sequential passes over the points; seeding on a random subsample of this many
# points per centroid (at least _KMEANSPP_MIN_POINTS) keeps it from dominating at large L.
_KMEANSPP_POINTS_PER_CENTROID = 16
_KMEANSPP_MIN_POINTS = 1024

# Distance blocks of (points x centroids) are computed this many points at a time so that a
# block stays in cache; a full (N, L) matrix for N=46080, L=240 is 44 MB of memory traffic.
_ASSIGN_BLOCK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class KMeansResult:
    """Output of :func:`batched_kmeans`.

    centroids:   (G, L, s) float32
    assignments: (G, N) int64, index of the nearest centroid of every point
    iterations:  Lloyd iterations actually run (<= the budget)
    """

    centroids: Tensor
    assignments: Tensor
    iterations: int


def squared_distances(points: Tensor, centroids: Tensor) -> Tensor:
    """Squared Euclidean distances, batched over groups.

    points (G, N, s), centroids (G, L, s) -> (G, N, L).
    """
    p_sq = (points * points).sum(-1, keepdim=True)  # (g, n, 1)
    c_sq = (centroids * centroids).sum(-1).unsqueeze(1)  # (g, 1, l)
    d2 = torch.baddbmm(c_sq, points, centroids.transpose(1, 2), alpha=-2.0)  # (g, n, l)
    # Cancellation in ||p||^2 - 2 p.c + ||c||^2 can go slightly negative.
    return (d2 + p_sq).clamp_min_(0.0)


def assign(points: Tensor, centroids: Tensor) -> Tensor:
    """Index of the nearest centroid of every point: (G, N, s), (G, L, s) -> (G, N) int64.

    ``||p||^2`` is the same for every centroid, so only ``||c||^2 - 2 p.c`` is compared. Ties
    go to the lowest index.
    """
    g, n, _ = points.shape
    num_centroids = centroids.shape[1]
    c_sq = (centroids * centroids).sum(-1).unsqueeze(1)  # (g, 1, l)
    c_t = centroids.transpose(1, 2)  # (g, s, l)
    block = max(1, _ASSIGN_BLOCK_ELEMENTS // max(1, g * num_centroids))
    if block >= n:
        return torch.baddbmm(c_sq, points, c_t, alpha=-2.0).argmin(-1)
    out = torch.empty((g, n), dtype=torch.int64)
    for start in range(0, n, block):
        stop = min(n, start + block)
        scores = torch.baddbmm(c_sq, points[:, start:stop], c_t, alpha=-2.0)
        torch.argmin(scores, dim=-1, out=out[:, start:stop])
    return out


def _subsample(points: Tensor, keep: int, generator: torch.Generator) -> Tensor:
    """A seeded random subset of ``keep`` points per group: (G, N, s) -> (G, keep, s)."""
    g, n, s = points.shape
    idx = torch.rand((g, n), generator=generator).argsort(-1)[:, :keep]
    return torch.gather(points, 1, idx.unsqueeze(-1).expand(-1, -1, s))


def _kmeanspp_init(points: Tensor, num_centroids: int, generator: torch.Generator) -> Tensor:
    """k-means++ seeding for every group at once: (G, N, s) -> (G, L, s)."""
    keep = max(_KMEANSPP_MIN_POINTS, _KMEANSPP_POINTS_PER_CENTROID * num_centroids)
    if points.shape[1] > keep:
        points = _subsample(points, keep, generator)
    g, n, s = points.shape
    rows = torch.arange(g)
    centroids = torch.empty((g, num_centroids, s), dtype=points.dtype)
    first = torch.randint(n, (g,), generator=generator)
    centroids[:, 0] = points[rows, first]
    closest = ((points - centroids[:, :1]) ** 2).sum(-1)  # (g, n)
    for k in range(1, num_centroids):
        total = closest.sum(-1, keepdim=True)  # (g, 1)
        # A group whose points all coincide with chosen centroids has nothing left to pick
        # by distance: draw uniformly, which yields a duplicate centroid (documented above).
        weights = torch.where(total > 0, closest, torch.ones_like(closest))
        pick = torch.multinomial(weights, 1, generator=generator).squeeze(1)  # (g,)
        centroids[:, k] = points[rows, pick]
        torch.minimum(closest, ((points - centroids[:, k : k + 1]) ** 2).sum(-1), out=closest)
    return centroids


def _random_init(points: Tensor, num_centroids: int, generator: torch.Generator) -> Tensor:
    """L points drawn without replacement per group (with replacement if N < L)."""
    g, n, _ = points.shape
    if n >= num_centroids:
        return _subsample(points, num_centroids, generator)
    idx = torch.randint(n, (g, num_centroids), generator=generator)
    return torch.gather(points, 1, idx.unsqueeze(-1).expand(-1, -1, points.shape[-1]))


def _update(points: Tensor, labels: Tensor, previous: Tensor) -> Tensor:
    """Mean of the points of every cluster; an empty cluster keeps its previous centroid."""
    g, n, s = points.shape
    num_centroids = previous.shape[1]
    flat = (labels + torch.arange(g).unsqueeze(1) * num_centroids).reshape(-1)  # (g*n,)
    sums = torch.zeros((g * num_centroids, s), dtype=points.dtype)
    sums.index_add_(0, flat, points.reshape(-1, s))
    counts = torch.bincount(flat, minlength=g * num_centroids).to(points.dtype).unsqueeze(1)
    means = sums / counts.clamp_min(1.0)
    return torch.where(counts > 0, means, previous.reshape(-1, s)).reshape(g, num_centroids, s)


def batched_kmeans(
    points: Tensor,
    num_centroids: int,
    *,
    iterations: int = 10,
    seed: int = 0,
    init: InitMethod = "kmeans++",
    max_points_per_centroid: int | None = None,
    initial_centroids: Tensor | None = None,
) -> KMeansResult:
    """Cluster every group of ``points`` into ``num_centroids`` centroids.

    Args:
        points: (G, N, s) float32, G independent groups of N points in s dimensions.
        num_centroids: L >= 1, centroids per group.
        iterations: Lloyd iteration budget (>= 0); stops early when assignments settle.
        seed: seeds the init (and the subsample); same seed, same output.
        init: "kmeans++" (default) or "random" (L distinct points per group).
        max_points_per_centroid: if set and N exceeds L times this, train on a seeded random
            subsample of that many points per group (faiss does the same with 256); the
            final assignment always covers all N points.
        initial_centroids: optional (G, L, s) start instead of ``init`` (a warm start, and
            the hook the oracle tests use to compare against a reference implementation).

    Returns:
        :class:`KMeansResult` with centroids (G, L, s) and assignments (G, N).
    """
    if points.ndim != 3:
        raise ValueError(f"points must be (G, N, s), got shape {tuple(points.shape)}")
    g, n, _ = points.shape
    if g < 1 or n < 1:
        raise ValueError(f"need at least one group and one point, got shape {tuple(points.shape)}")
    if num_centroids < 1:
        raise ValueError(f"num_centroids must be >= 1, got {num_centroids}")
    if iterations < 0:
        raise ValueError(f"iterations must be >= 0, got {iterations}")
    if not points.dtype.is_floating_point:
        raise ValueError(f"points must be floating point, got {points.dtype}")
    points = points.detach().to(torch.float32).contiguous()
    generator = torch.Generator().manual_seed(seed)

    train = points
    if max_points_per_centroid is not None and n > num_centroids * max_points_per_centroid:
        train = _subsample(points, num_centroids * max_points_per_centroid, generator)

    if initial_centroids is not None:
        expected = (g, num_centroids, points.shape[2])
        if tuple(initial_centroids.shape) != expected:
            raise ValueError(
                f"initial_centroids shape {tuple(initial_centroids.shape)} != {expected}"
            )
        centroids = initial_centroids.detach().to(torch.float32).clone()
    elif init == "kmeans++":
        centroids = _kmeanspp_init(train, num_centroids, generator)
    elif init == "random":
        centroids = _random_init(train, num_centroids, generator)
    else:
        raise ValueError(f"init must be 'kmeans++' or 'random', got {init!r}")

    ran = 0
    labels = assign(train, centroids)
    for _ in range(iterations):
        centroids = _update(train, labels, centroids)
        ran += 1
        new_labels = assign(train, centroids)
        if torch.equal(new_labels, labels):
            labels = new_labels
            break
        labels = new_labels

    final = labels if train is points else assign(points, centroids)
    return KMeansResult(centroids=centroids, assignments=final, iterations=ran)
