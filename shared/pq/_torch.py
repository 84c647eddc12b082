"""Batched, seeded k-means in torch: the algorithm of shared/pq/kmeans.py on any device.

``kmeans.batched_kmeans`` runs this backend for points that live on a GPU (the numba kernels
read host memory); it runs on CPU tensors too, which is how tests compare the two backends.

Same algorithm, same random draws. Every random number comes from numpy's generator seeded
with ``seed``, drawn in the order the CPU path draws them (the training subsample, then the
k-means++ subsample, first centroids and candidate uniforms, or the random init, then the
coarse subsample), and each subsample keeps the same points (shared/pq/_sampling.py). Greedy
k-means++ with 2 + ln L candidates per centroid; at most ``iterations`` Lloyd updates, coarse to
fine; an empty cluster keeps its centroid; ties go to the lowest index; the final assignment
covers every point.

Where the results differ from the numba kernels' (float order only; tests/shared/
test_kmeans_torch.py and benchmarks/device_check.py measure how much):

* scores and distances are float64 here (the kernels: float32 in a fixed order), so a point
  can take the other centroid where two are within float32 rounding of each other;
* a centroid is float32(sum / count) with the float64 sum taken afresh each iteration as a
  matrix product (the kernels: moved incrementally, point by point), equal but for the last
  bit in rare cases;
* k-means++ draws against a cumulative sum of the distances in fixed point (integers, 2^-40 of
  the total; the kernels: float64): the same candidate unless a uniform lands within 2^-40 of
  a boundary.

Deterministic on one device type, run to run, without any global torch setting: no atomic
adds anywhere (cluster sums are one-hot matrix products, the cumulative sum is over integers:
CUDA's floating-point cumsum and index_add_ are not deterministic), and argmin, searchsorted
and gather are. cuBLAS products are bit-reproducible on one GPU model and toolkit with
``CUBLAS_WORKSPACE_CONFIG`` set (shared.devices sets it).

No early stop: every update of the budget runs, with no host synchronisation per iteration
(the kernels stop a group once no label changes). A settled group's next update recomputes the
same centroids from the same labels, so the output equals an early-stopped run's; the update
count reported is the one the CPU path reports.

Shapes: points (G, N, s) float32 on one device; centroids (G, L, s); labels (G, N) int64.
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from shared.pq._sampling import (
    COARSE_MIN_POINTS,
    KMEANSPP_MIN_POINTS,
    KMEANSPP_POINTS_PER_CENTROID,
    MIN_TRAIN_POINTS,
    REFINE_ITERATIONS,
    SUBSAMPLE_FACTOR,
    subsample_indices,
)

__all__ = ["assign", "batched_kmeans", "draw"]

# Score-matrix entries (points x centroids) per block of the assignment: bounds its float64
# scores to 128 MiB whatever N (a frozen codebook is fitted on ~4.7 M FEMNIST points).
_SCORES_PER_BLOCK = 1 << 24
# k-means++ draws against an integer cumulative sum: each weight is its share of the total in
# units of 2^-40, so n <= 2^22 weights sum below 2^62 (k-means++ sees at most max(1024, 16 L)).
_FIXED_POINT = float(1 << 40)


@dataclass(frozen=True)
class Draws:
    """Every random draw of one k-means call, as the CPU path makes them, as host arrays.

    G groups; indices are into the group's points (``train``), into the training points
    (``seeding``, ``init``, ``coarse``) or into the k-means++ sample (``first``).

    train:    (G, keep) the training subsample, or None (all N points)
    seeding:  (G, m) the points k-means++ seeds on, or None (all training points)
    first:    (G,) k-means++'s first centroid, or None (no k-means++)
    uniforms: (G, L, T) k-means++'s candidate draws, or None
    init:     (G, L) the random init's points, or None (k-means++, or given centroids)
    coarse:   (G, k) the coarse iterations' points, or None (plain Lloyd)
    """

    train: np.ndarray | None
    seeding: np.ndarray | None
    first: np.ndarray | None
    uniforms: np.ndarray | None
    init: np.ndarray | None
    coarse: np.ndarray | None

    @staticmethod
    def stack(draws: "list[Draws]") -> "Draws":
        """One call's draws for the groups of several calls of the same shapes, in order."""

        def cat(arrays: list[np.ndarray | None]) -> np.ndarray | None:
            present = [a for a in arrays if a is not None]
            return np.concatenate(present) if present else None

        names = ("train", "seeding", "first", "uniforms", "init", "coarse")
        return Draws(*(cat([getattr(d, name) for d in draws]) for name in names))


def draw(
    groups: int,
    n: int,
    num_centroids: int,
    *,
    iterations: int,
    seed: int,
    init: str,
    max_points_per_centroid: int | None,
    initial_centroids: bool,
    coarse_fraction: float | None,
) -> Draws:
    """The draws of ``kmeans.batched_kmeans`` on (groups, n, s) points, from numpy's generator
    seeded with ``seed``, in the CPU path's order: the training subsample, k-means++ (its
    subsample, first centroids, candidate uniforms) or the random init, the coarse subsample.
    Only the sizes matter, never the points, so they are all drawn before any work."""
    rng = np.random.default_rng(seed)
    train = None
    n_train = n
    if max_points_per_centroid is not None:
        keep = max(MIN_TRAIN_POINTS, num_centroids * max_points_per_centroid)
        if n > SUBSAMPLE_FACTOR * keep:
            train, n_train = _subsample_index(groups, n, keep, rng), keep
    seeding = first = uniforms = chosen = None
    if initial_centroids:
        pass
    elif init == "kmeans++":
        keep = max(KMEANSPP_MIN_POINTS, KMEANSPP_POINTS_PER_CENTROID * num_centroids)
        n_seeding = n_train
        if n_train > keep:
            seeding, n_seeding = _subsample_index(groups, n_train, keep, rng), keep
        trials = 2 + int(np.log(num_centroids))  # scikit-learn's choice
        first = np.asarray(rng.integers(n_seeding, size=groups))
        uniforms = rng.random((groups, num_centroids, trials))
    elif n_train >= num_centroids:  # random init: L distinct points
        chosen = _subsample_index(groups, n_train, num_centroids, rng)
    else:  # ...or with replacement when there are fewer points than L
        chosen = rng.integers(n_train, size=(groups, num_centroids))
    coarse = None
    if coarse_fraction is not None and iterations > REFINE_ITERATIONS:
        keep = int(n_train * coarse_fraction)
        if keep >= max(COARSE_MIN_POINTS, KMEANSPP_POINTS_PER_CENTROID * num_centroids):
            coarse = _subsample_index(groups, n_train, keep, rng)
    return Draws(train, seeding, first, uniforms, chosen, coarse)


def _subsample_index(groups: int, n: int, keep: int, rng: np.random.Generator) -> np.ndarray:
    """The CPU path's seeded subset of ``keep`` of n points per group (ascending indices)."""
    return subsample_indices(n, rng.random((groups, keep)))


def batched_kmeans(
    points: Tensor,
    num_centroids: int,
    *,
    iterations: int,
    draws: Draws,
    initial_centroids: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(centroids (G, L, s) float32, labels (G, N) int64, updates each group ran (G,) int64),
    on the points' device; ``draws`` from :func:`draw` (or several stacked)."""
    data = points.detach().to(torch.float32).contiguous()
    train = data if draws.train is None else _take(data, draws.train)
    if initial_centroids is not None:
        centroids = initial_centroids.detach().to(data.device, torch.float32).clone()
    elif draws.init is not None:
        centroids = _take(train, draws.init)
    else:
        seeding = train if draws.seeding is None else _take(train, draws.seeding)
        assert draws.first is not None and draws.uniforms is not None
        centroids = _kmeanspp(seeding, draws.first, draws.uniforms)
    ran = torch.zeros(data.shape[0], dtype=torch.int64, device=data.device)
    if draws.coarse is not None:
        coarse = _take(train, draws.coarse)
        centroids, _, ran = _lloyd(coarse, centroids, iterations - REFINE_ITERATIONS)
        iterations = REFINE_ITERATIONS
    centroids, labels, refined = _lloyd(train, centroids, iterations)
    if train is not data:
        labels = assign(data, centroids)
    return centroids, labels, ran + refined


def assign(points: Tensor, centroids: Tensor) -> Tensor:
    """Index of the nearest centroid, ties to the lowest: (G, N, s), (G, L, s) -> (G, N) int64.

    Scores ||c||^2 - 2 p.c in float64 (||p||^2 is the same for every centroid of a point), in
    blocks of points of a size fixed by the shapes, so the same input gives the same bits.
    """
    c = centroids.to(points.device, torch.float64)
    c_sq = (c * c).sum(-1).unsqueeze(1)  # (g, 1, l)
    c_t = c.transpose(1, 2)  # (g, s, l)
    block = max(1, _SCORES_PER_BLOCK // c.shape[1])
    labels = [
        torch.baddbmm(c_sq, part.to(torch.float64), c_t, alpha=-2.0).argmin(-1)
        for part in torch.split(points, block, dim=1)
    ]
    return labels[0] if len(labels) == 1 else torch.cat(labels, 1)


def _take(points: Tensor, index: np.ndarray) -> Tensor:
    """points (G, N, s) at index (G, k) per group -> (G, k, s)."""
    at = torch.from_numpy(index).to(points.device)
    return torch.gather(points, 1, at.unsqueeze(-1).expand(-1, -1, points.shape[2]))


def _kmeanspp(points: Tensor, first: np.ndarray, uniforms: np.ndarray) -> Tensor:
    """Greedy k-means++ (as ``_seeding.kmeanspp_groups``), all groups at once: (G, N, s) ->
    (G, L, s). Each further centroid: T candidates (uniforms (G, L, T)) drawn with probability
    proportional to the squared distance to the nearest centroid so far; the one that lowers
    the potential sum(closest) most is kept (the first on a tie). Once every point sits on a
    centroid (a total of 0), the remaining centroids repeat the last one."""
    g, n, _ = points.shape
    device = points.device
    draws = torch.from_numpy(uniforms).to(device)
    groups = torch.arange(g, device=device)
    wide = points.to(torch.float64)
    chosen = torch.from_numpy(first).to(device)  # (g,)
    out = [points[groups, chosen]]  # L entries of (g, s)
    closest = ((wide - wide[groups, chosen].unsqueeze(1)) ** 2).sum(-1)  # (g, n)
    for c in range(1, uniforms.shape[1]):
        total = closest.sum(1)  # (g,)
        scale = torch.where(total > 0, _FIXED_POINT / total, torch.zeros_like(total))
        cumulative = torch.floor(closest * scale.unsqueeze(1)).to(torch.int64).cumsum(1)
        targets = torch.floor(draws[:, c] * cumulative[:, -1:].to(torch.float64))
        picks = torch.searchsorted(cumulative, targets.to(torch.int64), right=True)
        picks = picks.clamp_max(n - 1)  # (g, t)
        candidates = wide[groups.unsqueeze(1), picks]  # (g, t, s)
        distances = ((wide.unsqueeze(1) - candidates.unsqueeze(2)) ** 2).sum(-1)  # (g, t, n)
        potential = torch.minimum(closest.unsqueeze(1), distances).sum(-1)  # (g, t)
        best = potential.argmin(1)  # (g,)
        settled = total <= 0  # every point on a centroid already: repeat the last one
        chosen = torch.where(settled, chosen, picks[groups, best])
        nearest = torch.minimum(closest, distances[groups, best])
        closest = torch.where(settled.unsqueeze(1), closest, nearest)
        out.append(points[groups, chosen])
    return torch.stack(out, 1)


# ---------------------------------------------------------------------------------------------
# Lloyd
# ---------------------------------------------------------------------------------------------


def _lloyd(points: Tensor, centroids: Tensor, iterations: int) -> tuple[Tensor, Tensor, Tensor]:
    """``iterations`` updates, each followed by an assignment: (centroids, labels of every
    point, updates each group ran before its labels settled (G,) int64)."""
    g = points.shape[0]
    labels = assign(points, centroids)
    wide = points.to(torch.float64)
    settled = torch.zeros(g, dtype=torch.bool, device=points.device)
    ran = torch.zeros(g, dtype=torch.int64, device=points.device)
    for _ in range(iterations):
        centroids = _means(wide, labels, centroids)
        fresh = assign(points, centroids)
        ran += ~settled
        settled |= (fresh == labels).all(1)
        labels = fresh
    return centroids, labels, ran


def _means(points: Tensor, labels: Tensor, centroids: Tensor) -> Tensor:
    """Every centroid with points becomes float32(their float64 mean); an empty one stays.

    points (G, N, s) float64, labels (G, N), centroids (G, L, s) float32. The sums are a
    one-hot matrix product: no atomic adds, so the same bits every run.
    """
    members = torch.nn.functional.one_hot(labels, centroids.shape[1]).to(torch.float64)
    sums = torch.bmm(members.transpose(1, 2), points)  # (g, l, s)
    counts = members.sum(1).unsqueeze(-1)  # (g, l, 1)
    means = (sums / counts.clamp_min(1.0)).to(torch.float32)
    return torch.where(counts > 0, means, centroids)
