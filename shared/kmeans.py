"""Batched, seeded k-means over many independent groups at once.

The grouped product quantizer clusters R groups of subvectors per batch. Looping over groups
in Python costs 5-40x more than clustering them all in one set of batched tensor ops when R is
large (q=4608, R=1152 in the paper's grid), so every step here works on a (G, N, s) tensor:
G groups, N points per group, s dimensions per point.

Behaviour that callers can rely on:

* Deterministic: the same points, L and seed give bit-identical output (clustering runs on
  one torch thread unless ``threads`` says otherwise; then the thread count matters too).
* Init is greedy k-means++ (Arthur & Vassilvitskii, 2007) on a random subsample of at most
  max(1024, 16 L) points per group, drawing its centroids in at most 8 rounds of D^2
  sampling without replacement rather than L sequential passes (see _kmeanspp_init).
* At most ``iterations`` Lloyd iterations; stops early once no assignment changes.
* An empty cluster keeps its previous centroid (it never becomes NaN).
* A group with fewer distinct points than L gets duplicate centroids; the assignment picks
  the lowest index among equal distances, so the duplicates are never used and the
  reconstruction of that group is exact.

Where the time goes (measurements in docs/PERFORMANCE.md). At the paper's shapes the
arithmetic is small; the cost is memory passes, fresh allocations (a page fault per 4 KiB)
and per-call overhead, so:

* the assignment never materializes more than a cache-sized block of the (N, L) score
  matrix; at many centroids the argmin runs in numpy (SIMD; torch's CPU argmin is a scalar
  loop, ~6x slower at L=240), at few centroids it is a handful of vectorized float ops per
  centroid over (L, N) scores;
* the update sums with ``index_add_``, or for L=2 with one (2, N) x (N, s) product, and
  finishes the means on the small (L, s) arrays in numpy (a fraction of torch's per-call
  overhead, which at these shapes is most of the time);
* buffers used every iteration are allocated once per call;
* k-means++ draws its random keys with numpy's generator (seeded from torch's), ~10x
  faster than torch's CPU generator.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

__all__ = ["KMeansResult", "assign", "batched_kmeans", "intra_op_threads", "squared_distances"]

InitMethod = Literal["kmeans++", "random"]

# k-means++ is L sequential passes over the points; seeding on a random subsample of this many
# points per centroid (at least _KMEANSPP_MIN_POINTS) keeps it from dominating at large L.
_KMEANSPP_POINTS_PER_CENTROID = 16
_KMEANSPP_MIN_POINTS = 1024
# k-means++ draws its L - 1 centroids after the first in at most this many rounds, and
# keeps the better of this many candidates for each (greedy k-means++).
_KMEANSPP_ROUNDS = 8
_KMEANSPP_TRIALS = 2

# The (points x centroids) score matrix is computed this many elements at a time so that a
# block stays in the L2 cache (1 MiB per core here); the full matrix at N=46080, L=240 is
# 44 MB, and writing it out and reading it back costs more than the matrix product itself.
_ASSIGN_BLOCK_ELEMENTS = 1 << 19

# Up to this many centroids the argmin runs over (L, N) score rows with a few vectorized ops
# per centroid, which beats a per-row argmin over a handful of elements.
_SCAN_MAX_CENTROIDS = 8


@contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run the block with torch on ``threads`` intra-op threads (None: leave it as it is).

    k-means at the paper's shapes is hundreds of small calls; with two threads each one opens
    a parallel region that waits for both, and on a shared 2-core machine the second thread
    is often descheduled: the next-token k-means took 1-8 s on two threads against 0.2-0.3 s
    on one (docs/PERFORMANCE.md).

    Why save and restore per call, with no shared counter: torch's OpenMP backend keeps the
    setting per OS thread (``omp_set_num_threads``), so every thread that clusters must set
    it for itself, or a second concurrent caller would cluster on the process default and
    could get other bits. The setting also becomes the default of threads started while the
    block runs; that is a speed effect only.
    """
    if threads is None:
        yield
        return
    saved = torch.get_num_threads()
    if saved != threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != saved:
            torch.set_num_threads(saved)


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
    return _Points(points.contiguous(), centroids.shape[1]).assign(centroids)


class _Points:
    """The points of one k-means call, in the layout its assignment reads fastest.

    Which layout wins depends on the shape (measured; docs/PERFORMANCE.md):

    * few centroids (L <= 8): scores as (L, G, N) rows from points stored transposed
      (G, s, N), so that the matrix product writes long contiguous rows and the argmin is a
      scan over L rows of three vectorized ops each;
    * many centroids: cache-sized blocks of (rows, L) scores from row-major points, with the
      argmin in numpy (SIMD; ~6x faster than torch's at L=240).

    Every per-iteration buffer of more than a few kB is allocated once here and reused: a
    fresh one per iteration is a fresh mmap whose pages fault back in (~2.4 us per 4 KiB
    page on this kind of VM), which cost more than the arithmetic at the paper's shapes.
    Labels alternate between two buffers, so a caller may hold the current and the previous
    assignment, never more.
    """

    def __init__(self, points: Tensor, num_centroids: int) -> None:
        g, n, s = points.shape
        self.points = points  # (g, n, s) contiguous float32
        self.num_centroids = num_centroids
        self._labels = (
            torch.zeros((g, n), dtype=torch.int64),
            torch.zeros((g, n), dtype=torch.int64),
        )
        self._next = 0
        self._flat = torch.empty(g * n, dtype=torch.int64) if g > 1 else None
        self._offsets = torch.arange(g).unsqueeze(1) * num_centroids  # (g, 1)
        if 1 < num_centroids <= _SCAN_MAX_CENTROIDS:
            self.transposed = points.transpose(1, 2).contiguous()  # (g, s, n)
            self._scores = torch.empty((num_centroids, g, n), dtype=torch.float32)
            self._scores_gln = torch.empty((g, num_centroids, n)) if g > 1 else None
            self._best = torch.empty((g, n), dtype=torch.float32)
            self._above = torch.empty((g, n), dtype=torch.float32)
            self._step = torch.empty((g, n), dtype=torch.float32)
            self._count = torch.empty((g, n), dtype=torch.float32)
            self._closer = torch.empty((g, n), dtype=torch.bool)
            self._weights = torch.empty((2, n), dtype=torch.float32)  # L == 2 update
        elif num_centroids > _SCAN_MAX_CENTROIDS:
            self._block = max(1, _ASSIGN_BLOCK_ELEMENTS // num_centroids)
            self._block_scores = torch.empty((min(self._block, n), num_centroids))

    # ------------------------------------------------------------------ assignment

    def assign(self, centroids: Tensor) -> Tensor:
        """(G, L, s) centroids -> (G, N) int64 index of every point's nearest centroid."""
        labels = self._labels[self._next]
        self._next ^= 1
        if self.num_centroids == 1:
            return labels.zero_()
        if self.num_centroids <= _SCAN_MAX_CENTROIDS:
            return self._assign_by_scan(centroids, labels)
        return self._assign_blocked(centroids, labels)

    def _assign_by_scan(self, centroids: Tensor, labels: Tensor) -> Tensor:
        g = self.points.shape[0]
        c_sq = (centroids * centroids).sum(-1, keepdim=True)  # (g, l, 1)
        scores = self._scores  # (l, g, n): ||c||^2 - 2 c.p, one contiguous slab per centroid
        if g == 1:
            torch.addmm(c_sq[0], centroids[0], self.transposed[0], alpha=-2.0, out=scores[:, 0])
        else:
            assert self._scores_gln is not None
            torch.baddbmm(c_sq, centroids, self.transposed, alpha=-2.0, out=self._scores_gln)
            scores.copy_(self._scores_gln.transpose(0, 1))
        if self.num_centroids == 2:
            torch.lt(scores[1], scores[0], out=self._closer)  # a tie keeps index 0
            return labels.copy_(self._closer)
        # argmin over the L slabs without torch's argmin (a scalar loop on CPU): the minimum
        # first, then the index of the first slab that attains it, counted as the number of
        # leading slabs strictly above it (sign(d) is 1 for d > 0, 0 for d == 0).
        best = torch.amin(scores, dim=0, out=self._best)  # (g, n)
        above = self._above  # running product: all slabs so far are above the minimum
        step = self._step
        count = self._count
        torch.sub(scores[0], best, out=above).sign_()
        count.copy_(above)
        for k in range(1, self.num_centroids - 1):
            above.mul_(torch.sub(scores[k], best, out=step).sign_())
            count.add_(above)
        return labels.copy_(count)

    def _assign_blocked(self, centroids: Tensor, labels: Tensor) -> Tensor:
        g, n, _ = self.points.shape
        c_np = centroids.numpy()
        c_sq = torch.from_numpy(np.einsum("gls,gls->gl", c_np, c_np))  # (g, l)
        labels_np = labels.numpy()
        scores = self._block_scores
        scores_np = scores.numpy()
        block = self._block
        for group in range(g):
            p = self.points[group]  # (n, s)
            c_t = centroids[group].t()  # (s, l)
            for start in range(0, n, block):
                stop = min(n, start + block)
                torch.addmm(c_sq[group], p[start:stop], c_t, alpha=-2.0, out=scores[: stop - start])
                # numpy's argmin, like torch's, returns the lowest index among equal minima
                np.argmin(scores_np[: stop - start], axis=1, out=labels_np[group, start:stop])
        return labels

    # ------------------------------------------------------------------ update

    def update(self, labels: Tensor, previous: Tensor) -> Tensor:
        """Mean of the points of every cluster; an empty cluster keeps its previous centroid.

        The sums are torch ops over all points; what follows works on (G*L, s) arrays and
        runs in numpy, whose per-call overhead is a fraction of torch's.
        """
        g, n, s = self.points.shape
        num_centroids = self.num_centroids
        if g == 1 and num_centroids == 2:
            # a (2, n) x (n, s) product with 0/1 weights beats index_add_ 3-4x here
            weights = self._weights
            weights[1].copy_(labels[0])
            torch.neg(weights[1], out=weights[0]).add_(1.0)
            sums = torch.mm(weights, self.transposed[0].t()).numpy()  # (2, s)
            counts = weights.sum(1).numpy()  # (2,)
        else:
            if self._flat is None:
                flat = labels.view(-1)
            else:
                flat = torch.add(labels, self._offsets, out=self._flat.view(g, n)).view(-1)
            sums_t = torch.zeros((g * num_centroids, s), dtype=torch.float32)
            sums = sums_t.index_add_(0, flat, self.points.view(-1, s)).numpy()
            counts = np.bincount(flat.numpy(), minlength=g * num_centroids).astype(np.float32)
        means = sums / np.maximum(counts, 1.0)[:, None]
        kept = previous.reshape(-1, s).numpy()
        return torch.from_numpy(np.where(counts[:, None] > 0, means, kept)).view_as(previous)


def _subsample(points: Tensor, keep: int, generator: torch.Generator) -> Tensor:
    """A seeded random subset of ``keep`` points per group: (G, N, s) -> (G, keep, s)."""
    g, n, s = points.shape
    if g == 1:
        # randperm is ~30x cheaper than sorting n random keys
        return points.index_select(1, torch.randperm(n, generator=generator)[:keep])
    idx = torch.rand((g, n), generator=generator).argsort(-1)[:, :keep]
    return torch.gather(points, 1, idx.unsqueeze(-1).expand(-1, -1, s))


def _kmeanspp_init(points: Tensor, num_centroids: int, generator: torch.Generator) -> Tensor:
    """k-means++ seeding for every group at once: (G, N, s) -> (G, L, s).

    D^2 sampling (Arthur & Vassilvitskii, 2007): after a uniformly drawn first centroid,
    points are drawn with probability proportional to their squared distance to the nearest
    centroid chosen so far. To keep the number of sequential passes small at large L, each
    of at most _KMEANSPP_ROUNDS rounds draws ceil((L - 1) / rounds) centroids at once, from
    twice as many candidates drawn without replacement (Efraimidis-Spirakis: the largest
    keys ``log(u) / w`` win), keeping those that lower the potential most. At the paper's
    shapes this seeds at least as well as one plain draw per pass (docs/PERFORMANCE.md).
    Zero-weight points (those that coincide with a chosen centroid) are drawn only after
    every positive-weight point, which yields duplicate centroids (see the module docstring).
    """
    keep = max(_KMEANSPP_MIN_POINTS, _KMEANSPP_POINTS_PER_CENTROID * num_centroids)
    if points.shape[1] > keep:
        points = _subsample(points, keep, generator)
    g, n, s = points.shape
    first = torch.randint(n, (g, 1), generator=generator)
    per_round = -(-(num_centroids - 1) // _KMEANSPP_ROUNDS)
    rounds = -(-(num_centroids - 1) // per_round) if num_centroids > 1 else 0
    # The round keys need G*N uniforms per round; numpy's PCG64 draws them ~10x faster than
    # torch's CPU generator, seeded from it so that the seed still fixes everything.
    rng = np.random.default_rng(int(torch.randint(1 << 62, (1,), generator=generator)))
    # A uniform of exactly 0 (2^-24 per float32 draw) gives log(u) = -inf: that point is drawn
    # last, as a zero-weight one is; never NaN, since log(u) < 0. No warning for it.
    with np.errstate(divide="ignore"):
        log_u = torch.from_numpy(np.log(rng.random((rounds, g, n), dtype=np.float32)))
    p_sq = (points * points).sum(-1, keepdim=True)  # (g, n, 1)

    def distances(chosen: Tensor) -> Tensor:
        """(g, n, b) squared distances of every point to each of chosen (g, b, s)."""
        c_sq = (chosen * chosen).sum(-1).unsqueeze(1)  # (g, 1, b)
        scores = torch.baddbmm(c_sq, points, chosen.transpose(1, 2), alpha=-2.0)  # (g, n, b)
        return scores.add_(p_sq).clamp_min_(0.0)

    chosen = torch.gather(points, 1, first.unsqueeze(-1).expand(-1, -1, s))  # (g, 1, s)
    picked = [chosen]
    closest = distances(chosen).squeeze(-1)  # (g, n)
    drawn = 1
    for r in range(rounds):
        take = min(per_round, num_centroids - drawn, n)
        keys = torch.div(log_u[r], closest)  # log(u) / 0 = -inf: drawn last
        # Greedy k-means++ (as scikit-learn's): draw _KMEANSPP_TRIALS candidates per centroid
        # and keep those that lower the potential sum(closest) most. One draw per centroid
        # too often seeds an outlier: at L=2 on FEMNIST activations it ends in a local
        # optimum 4 % worse than random init's.
        trials = min(n, take * _KMEANSPP_TRIALS)
        candidates = keys.topk(trials, dim=-1, sorted=False).indices  # (g, trials)
        points_c = torch.gather(points, 1, candidates.unsqueeze(-1).expand(-1, -1, s))
        dist = distances(points_c)  # (g, n, trials)
        gain = (closest.unsqueeze(-1) - dist).clamp_min_(0.0).sum(1)  # (g, trials)
        best = gain.topk(take, dim=-1).indices  # (g, take)
        chosen = torch.gather(points_c, 1, best.unsqueeze(-1).expand(-1, -1, s))  # (g, take, s)
        picked.append(chosen)
        drawn += take
        if r + 1 < rounds:
            nearest = torch.gather(dist, 2, best.unsqueeze(1).expand(-1, n, -1)).amin(-1)
            torch.minimum(closest, nearest, out=closest)
    centroids = torch.cat(picked, dim=1)  # (g, min(L, ...), s)
    if centroids.shape[1] < num_centroids:  # fewer points than centroids: repeat the last one
        extra = centroids[:, -1:].expand(-1, num_centroids - centroids.shape[1], -1)
        centroids = torch.cat([centroids, extra], dim=1)
    return centroids


def _random_init(points: Tensor, num_centroids: int, generator: torch.Generator) -> Tensor:
    """L points drawn without replacement per group (with replacement if N < L)."""
    g, n, _ = points.shape
    if n >= num_centroids:
        return _subsample(points, num_centroids, generator)
    idx = torch.randint(n, (g, num_centroids), generator=generator)
    return torch.gather(points, 1, idx.unsqueeze(-1).expand(-1, -1, points.shape[-1]))


def batched_kmeans(
    points: Tensor,
    num_centroids: int,
    *,
    iterations: int = 10,
    seed: int = 0,
    init: InitMethod = "kmeans++",
    max_points_per_centroid: int | None = None,
    initial_centroids: Tensor | None = None,
    threads: int | None = 1,
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
        threads: torch intra-op threads while clustering (see :func:`intra_op_threads`);
            None leaves the process's setting alone.

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
    with intra_op_threads(threads):
        return _batched_kmeans(
            points,
            num_centroids,
            iterations=iterations,
            seed=seed,
            init=init,
            max_points_per_centroid=max_points_per_centroid,
            initial_centroids=initial_centroids,
        )


def _batched_kmeans(
    points: Tensor,
    num_centroids: int,
    *,
    iterations: int,
    seed: int,
    init: InitMethod,
    max_points_per_centroid: int | None,
    initial_centroids: Tensor | None,
) -> KMeansResult:
    g, n, _ = points.shape
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
    lloyd = _Points(train, num_centroids)
    labels = lloyd.assign(centroids)
    for _ in range(iterations):
        centroids = lloyd.update(labels, centroids)
        ran += 1
        new_labels = lloyd.assign(centroids)
        if torch.equal(new_labels, labels):
            labels = new_labels
            break
        labels = new_labels

    final = labels if train is points else assign(points, centroids)
    return KMeansResult(centroids=centroids, assignments=final, iterations=ran)
