"""Batched, seeded k-means over many independent groups at once.

The grouped product quantizer clusters R groups of subvectors per batch; every step here works
on a (G, N, s) array: G groups, N points per group, s dimensions per point, and all G groups
run in one call of a compiled kernel (shared/pq/_kernels.py), with no Python loop over them.

Two backends, one algorithm: the numba kernels here for points in host memory, and torch
(shared/pq/_torch.py) for points on a GPU, where the data of a GPU run already lives. Both
make the same seeded random draws; they differ in float rounding only (docstring of _torch.py),
and each gives the same bits run after run on one device type.

Behaviour that callers can rely on:

* Deterministic: the same points, L and seed give bit-identical output, on any number of
  threads: with several, each assignment pass is split into ranges of points that run at
  once, and the centroid sums are still updated in point order (shared/pq/_threads.py).
* Init is greedy k-means++ (Arthur & Vassilvitskii, 2007; as scikit-learn's: the best of
  2 + ln L candidates per centroid) on a seeded random subsample of at most
  max(1024, 16 L) points per group.
* Training may run on a seeded random subsample of max(4096, L * ``max_points_per_centroid``)
  points per group (faiss trains on at most 256 L) when N is over twice that; the final
  assignment always covers every point.
* At most ``iterations`` Lloyd iterations; a group stops early once no assignment changes.
* Coarse to fine (``coarse_fraction``, off unless asked for): the first ``iterations - 4``
  iterations may run on a seeded random fraction of the training points, the last 4 on all
  of them, starting from where the coarse ones left the centroids.
* An empty cluster keeps its previous centroid (it never becomes NaN).
* A group with fewer distinct points than L gets duplicate centroids; the assignment picks
  the lowest index among equal distances, so the duplicates are never used and the
  reconstruction of that group is exact.

Where the time goes (docs/PERFORMANCE.md): one fused pass per iteration computes each block of
points' scores ||c||^2 - 2 c.p against every centroid and keeps the running minimum (on
several threads when the pass is large, shared/pq/_threads.py); then only the points whose
label changed move between float64 centroid sums.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from shared.pq import _sampling, _torch

try:  # the CPU kernels; a machine without numba still runs the torch backend (on a GPU)
    from shared.pq import _kernels, _lloyd, _seeding, _threads
except ImportError as missing:  # pragma: no cover - numba is a dependency of the CPU path
    _NUMBA_MISSING: ImportError | None = missing
else:
    _NUMBA_MISSING = None

__all__ = [
    "Backend",
    "KMeansResult",
    "assign",
    "batched_kmeans",
    "batched_kmeans_many",
    "squared_distances",
]

InitMethod = Literal["kmeans++", "random"]
# "auto": the torch backend for points on a GPU (or any device but the CPU), the numba kernels
# for points in host memory; "numba" / "torch" force one (tests, benchmarks)
Backend = Literal["auto", "numba", "torch"]

# How many points each stage samples: shared with the torch backend (shared/pq/_sampling.py
# says why each is what it is)
_KMEANSPP_POINTS_PER_CENTROID = _sampling.KMEANSPP_POINTS_PER_CENTROID
_KMEANSPP_MIN_POINTS = _sampling.KMEANSPP_MIN_POINTS
_MIN_TRAIN_POINTS = _sampling.MIN_TRAIN_POINTS
_SUBSAMPLE_FACTOR = _sampling.SUBSAMPLE_FACTOR
_REFINE_ITERATIONS = _sampling.REFINE_ITERATIONS
_COARSE_MIN_POINTS = _sampling.COARSE_MIN_POINTS


@dataclass(frozen=True)
class KMeansResult:
    """Output of :func:`batched_kmeans`.

    centroids:   (G, L, s) float32
    assignments: (G, N) int64, index of the nearest centroid of every point
    iterations:  Lloyd iterations actually run (<= the budget; the most of any group)
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
    go to the lowest index. Points on a GPU are assigned there (shared/pq/_torch.py).
    """
    if _on_device(points, "auto"):
        return _torch.assign(points.to(torch.float32), centroids)
    _require_numba()
    p = _as_points(points)
    c = np.ascontiguousarray(centroids.detach().to(torch.float32).cpu().numpy())
    return torch.from_numpy(_kernels.assign_groups(p, c))


def _on_device(points: Tensor, backend: str) -> bool:
    """Whether the torch backend runs: asked for, or "auto" with points off the CPU."""
    return backend == "torch" or (backend == "auto" and points.device.type != "cpu")


def _require_numba() -> None:
    if _NUMBA_MISSING is not None:
        raise RuntimeError(
            f"k-means on CPU tensors needs numba ({_NUMBA_MISSING}); install it, or put the "
            "points on a GPU (the torch backend)"
        )


def _as_points(points: Tensor) -> np.ndarray:
    """(G, N, s) float32 C-contiguous numpy view (a copy only when needed)."""
    return np.ascontiguousarray(points.detach().to(torch.float32).cpu().numpy())


def _transposed(points: np.ndarray) -> np.ndarray:
    """(G, N, s) -> (G, s, N) contiguous: the layout the kernels' inner loops run along."""
    return _kernels.transpose_groups(points)


def _subsample(points: np.ndarray, keep: int, rng: np.random.Generator) -> np.ndarray:
    """A seeded random subset of ``keep`` points per group, in their original order:
    (G, N, s) -> (G, keep, s) contiguous."""
    return _seeding.subsample_groups(points, rng.random((points.shape[0], keep)))


def _kmeanspp_init(points: np.ndarray, num_centroids: int, rng: np.random.Generator) -> np.ndarray:
    """Greedy k-means++ seeding of every group (see the kernel): (G, N, s) -> (G, L, s)."""
    keep = max(_KMEANSPP_MIN_POINTS, _KMEANSPP_POINTS_PER_CENTROID * num_centroids)
    if points.shape[1] > keep:
        points = _subsample(points, keep, rng)
    g, n, _ = points.shape
    trials = 2 + int(np.log(num_centroids))  # scikit-learn's choice
    first = np.asarray(rng.integers(n, size=g))
    uniforms = rng.random((g, num_centroids, trials))
    transposed = _transposed(points)
    return _seeding.kmeanspp_groups(points, transposed, num_centroids, first, uniforms)


def _random_init(points: np.ndarray, num_centroids: int, rng: np.random.Generator) -> np.ndarray:
    """L points drawn without replacement per group (with replacement if N < L)."""
    g, n, _ = points.shape
    if n >= num_centroids:
        return _subsample(points, num_centroids, rng)
    idx = rng.integers(n, size=(g, num_centroids))
    return np.take_along_axis(points, idx[:, :, None], axis=1)


def _train(
    train: np.ndarray,
    coarse: np.ndarray | None,
    centroids: np.ndarray,
    iterations: int,
    threads: int,
) -> tuple[np.ndarray, int]:
    """Lloyd's iterations on ``train`` (G, N, s) from ``centroids`` (G, L, s, updated in
    place), the first ``iterations - 4`` on ``coarse`` when given. Returns the labels (G, N)
    of every training point and the updates run."""
    ran = 0
    if coarse is not None:
        _, ran = _lloyd_on(coarse, centroids, iterations - _REFINE_ITERATIONS, threads)
        iterations = _REFINE_ITERATIONS
    labels, refined = _lloyd_on(train, centroids, iterations, threads)
    return labels, ran + refined


def _lloyd_on(
    points: np.ndarray, centroids: np.ndarray, iterations: int, threads: int
) -> tuple[np.ndarray, int]:
    """Lloyd's iterations on ``threads`` threads where a pass has the work to pay for them,
    on one otherwise: the same bits either way (shared/pq/_threads.py)."""
    g, n, s = points.shape
    if _threads.worth_threads(n, centroids.shape[1], s, threads):
        return _threads.lloyd_groups_threaded(
            points, _transposed(points), centroids, iterations, threads
        )
    return _lloyd.lloyd_groups(points, _transposed(points), centroids, iterations)


def _coarse_points(
    train: np.ndarray,
    num_centroids: int,
    iterations: int,
    fraction: float | None,
    rng: np.random.Generator,
) -> np.ndarray | None:
    """The seeded subset (G, keep, s) that the coarse iterations run on, or None when coarse
    to fine does not apply: no fraction, too few iterations to split, or too few points."""
    if fraction is None or iterations <= _REFINE_ITERATIONS:
        return None
    keep = int(train.shape[1] * fraction)
    if keep < max(_COARSE_MIN_POINTS, _KMEANSPP_POINTS_PER_CENTROID * num_centroids):
        return None
    return _subsample(train, keep, rng)


def _validate(
    points: Tensor,
    num_centroids: int,
    iterations: int,
    init: str,
    initial_centroids: Tensor | None,
    coarse_fraction: float | None,
    backend: str = "auto",
) -> None:
    """Raise ValueError with a precise message for arguments batched_kmeans cannot use."""
    if points.ndim != 3:
        raise ValueError(f"points must be (G, N, s), got shape {tuple(points.shape)}")
    g, n, s = points.shape
    if g < 1 or n < 1:
        raise ValueError(f"need at least one group and one point, got shape {tuple(points.shape)}")
    if num_centroids < 1:
        raise ValueError(f"num_centroids must be >= 1, got {num_centroids}")
    if iterations < 0:
        raise ValueError(f"iterations must be >= 0, got {iterations}")
    if not points.dtype.is_floating_point:
        raise ValueError(f"points must be floating point, got {points.dtype}")
    if backend not in ("auto", "numba", "torch"):
        raise ValueError(f"backend must be 'auto', 'numba' or 'torch', got {backend!r}")
    if init not in ("kmeans++", "random"):
        raise ValueError(f"init must be 'kmeans++' or 'random', got {init!r}")
    if coarse_fraction is not None and not 0.0 < coarse_fraction < 1.0:
        raise ValueError(f"coarse_fraction must be in (0, 1) or None, got {coarse_fraction}")
    if initial_centroids is not None and tuple(initial_centroids.shape) != (g, num_centroids, s):
        raise ValueError(
            f"initial_centroids shape {tuple(initial_centroids.shape)} != {(g, num_centroids, s)}"
        )


def batched_kmeans(
    points: Tensor,
    num_centroids: int,
    *,
    iterations: int = 10,
    seed: int = 0,
    init: InitMethod = "kmeans++",
    max_points_per_centroid: int | None = None,
    initial_centroids: Tensor | None = None,
    threads: int | None = None,
    coarse_fraction: float | None = None,
    backend: Backend = "auto",
) -> KMeansResult:
    """Cluster every group of ``points`` into ``num_centroids`` centroids.

    Args:
        points: (G, N, s) float32 (other float dtypes are converted), G independent groups of
            N points in s dimensions.
        num_centroids: L >= 1, centroids per group.
        iterations: Lloyd iteration budget (>= 0); stops early when assignments settle.
        seed: seeds the init (and the subsample); same seed, same output.
        init: "kmeans++" (default) or "random" (L distinct points per group).
        max_points_per_centroid: if set and N exceeds twice L times this (and 4096), train
            on a seeded random subsample of that many points per group (faiss subsamples
            above 256 L); the final assignment always covers all N points.
        initial_centroids: optional (G, L, s) start instead of ``init`` (a warm start, and
            the hook the oracle tests use to compare against a reference implementation).
        threads: threads a pass may use (None: torch's setting; one below ~1 M multiply-adds
            a pass or without a thread-safe numba layer); the output does not depend on it.
        coarse_fraction: in (0, 1), or None for plain Lloyd: run all but the last 4
            iterations on a seeded random subset of this fraction of the training points,
            when it keeps at least max(1024, 16 L) points per group (see
            ``_REFINE_ITERATIONS``); the last 4 iterations and the assignment cover all.
        backend: "auto" (points on a GPU: torch, shared/pq/_torch.py; in host memory: the
            numba kernels), or "numba" / "torch" to force one. The backends make the same
            random draws and differ in float rounding only (see _torch.py).

    Returns:
        :class:`KMeansResult` with centroids (G, L, s) and assignments (G, N), on the
        points' device (host memory from the numba kernels).
    """
    _validate(points, num_centroids, iterations, init, initial_centroids, coarse_fraction, backend)
    if _on_device(points, backend):
        options = (iterations, init, max_points_per_centroid, coarse_fraction)
        return _torch_kmeans([points], num_centroids, [seed], options, initial_centroids)[0]
    _require_numba()
    workers = torch.get_num_threads() if threads is None else threads
    rng = np.random.default_rng(seed)
    data = _as_points(points)
    initial = None if initial_centroids is None else initial_centroids.detach().cpu()
    return _numba_kmeans(
        data, num_centroids, iterations, rng, init, max_points_per_centroid, initial, workers,
        coarse_fraction,
    )  # fmt: skip


def _numba_kmeans(
    data: np.ndarray,
    num_centroids: int,
    iterations: int,
    rng: np.random.Generator,
    init: InitMethod,
    max_points_per_centroid: int | None,
    initial_centroids: Tensor | None,
    workers: int,
    coarse_fraction: float | None,
) -> KMeansResult:
    """``batched_kmeans`` on the numba kernels: data (G, N, s) float32 in host memory."""
    n = data.shape[1]
    train = data
    if max_points_per_centroid is not None:
        keep = max(_MIN_TRAIN_POINTS, num_centroids * max_points_per_centroid)
        if n > _SUBSAMPLE_FACTOR * keep:
            train = _subsample(data, keep, rng)
    if initial_centroids is not None:
        centroids = initial_centroids.detach().to(torch.float32).numpy().copy()
    elif init == "kmeans++":
        centroids = _kmeanspp_init(train, num_centroids, rng)
    else:
        centroids = _random_init(train, num_centroids, rng)
    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    coarse = _coarse_points(train, num_centroids, iterations, coarse_fraction, rng)
    labels, ran = _train(train, coarse, centroids, iterations, workers)
    if train is not data:
        labels = _threads.assign_groups_threaded(data, centroids, workers)
    return KMeansResult(
        centroids=torch.from_numpy(centroids), assignments=torch.from_numpy(labels), iterations=ran
    )


def batched_kmeans_many(
    points: Sequence[Tensor],
    num_centroids: int,
    *,
    seeds: Sequence[int],
    iterations: int = 10,
    init: InitMethod = "kmeans++",
    max_points_per_centroid: int | None = None,
    threads: int | None = None,
    coarse_fraction: float | None = None,
    backend: Backend = "auto",
) -> list[KMeansResult]:
    """``batched_kmeans(points[i], seed=seeds[i], ...)`` for every i (each (G, N_i, s)).

    On the numba kernels, one call after the other. On the torch backend (points on a GPU),
    the calls whose shapes agree run as one: their groups stacked, each group with its own
    call's draws, so a training step's client chunks cost one set of kernel launches instead
    of one per chunk (at FEMNIST's shapes a GPU k-means is launch-bound, not arithmetic).
    Stacked or not, every group's arithmetic is its own; on a CPU the results are those of
    separate calls to the bit, on a GPU a batched product may round differently from a
    single one (the same bits every run either way).
    """
    if len(points) != len(seeds):
        raise ValueError(f"{len(points)} point sets but {len(seeds)} seeds")
    if not points or not _on_device(points[0], backend):
        return [
            batched_kmeans(
                p,
                num_centroids,
                iterations=iterations,
                seed=seed,
                init=init,
                max_points_per_centroid=max_points_per_centroid,
                threads=threads,
                coarse_fraction=coarse_fraction,
                backend=backend,
            )
            for p, seed in zip(points, seeds, strict=True)
        ]
    for p in points:
        _validate(p, num_centroids, iterations, init, None, coarse_fraction, backend)
    options = (iterations, init, max_points_per_centroid, coarse_fraction)
    return _torch_kmeans(points, num_centroids, seeds, options, None)


def _torch_kmeans(
    points: Sequence[Tensor],
    num_centroids: int,
    seeds: Sequence[int],
    options: tuple[int, str, int | None, float | None],
    initial_centroids: Tensor | None,
) -> list[KMeansResult]:
    """The torch backend on each points[i] with seeds[i]; the calls of one shape stacked into
    one. ``options``: (iterations, init, max_points_per_centroid, coarse_fraction)."""
    iterations, init, per_centroid, coarse_fraction = options
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(points):
        by_shape.setdefault(tuple(p.shape), []).append(i)
    results: dict[int, KMeansResult] = {}
    for (g, n, _), calls in by_shape.items():
        draws = [
            _torch.draw(
                g,
                n,
                num_centroids,
                iterations=iterations,
                seed=seeds[i],
                init=init,
                max_points_per_centroid=per_centroid,
                initial_centroids=initial_centroids is not None,
                coarse_fraction=coarse_fraction,
            )
            for i in calls
        ]
        centroids, labels, ran = _torch.batched_kmeans(
            points[calls[0]] if len(calls) == 1 else torch.cat([points[i] for i in calls]),
            num_centroids,
            iterations=iterations,
            draws=draws[0] if len(calls) == 1 else _torch.Draws.stack(draws),
            initial_centroids=initial_centroids,
        )
        updates = ran.reshape(len(calls), g).amax(1).tolist()  # one wait for the GPU
        for j, i in enumerate(calls):
            part = slice(j * g, (j + 1) * g)
            results[i] = KMeansResult(centroids[part], labels[part], int(updates[j]))
    return [results[i] for i in range(len(points))]
