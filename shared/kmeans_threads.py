"""Lloyd's iterations on several threads, with the bits of the one-thread loop.

``shared.kmeans_lloyd.lloyd_groups`` runs every iteration of every group in one compiled,
sequential call. With more than one thread (and enough work per pass to pay for the hand-offs)
``lloyd_groups_threaded`` splits each assignment pass of a group into contiguous ranges of
points that run at once on a small pool of threads (the kernels release the GIL), then moves
the changed points between the centroid sums on one thread, in point order.

Why the output is the same on any number of threads: a point's label depends on that point and
the centroids only (``assign_range``), so any split gives the labels of the sequential pass;
and the float64 sums see the same additions in the same order (``apply_labels``), so the
centroids of the next iteration are the same to the bit. tests/test_kmeans_threads.py
compares every split with the one-thread loop, bit for bit, and callers on several threads.

Why a Python thread pool and not numba's parallel loops: numba's default threading layer
(workqueue) must not be entered from two threads at once, and party B clusters in several
worker threads at once; nogil kernels on ordinary threads have no such rule.
"""

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from shared import kmeans_lloyd

__all__ = ["PARALLEL_MIN_WORK", "lloyd_groups_threaded", "worth_threads"]

# Multiply-adds of one assignment pass of one group (N L s) below which threads cost more than
# they save. Each iteration hands ranges to the pool and back and calls three kernels from
# Python (~0.1 ms a round trip with the unboxing): measured on a quiet machine with two threads,
# FEMNIST L = 16 (2.9 M a pass) took 3.55 ms against 2.64 on one thread, L = 32 (5.9 M) 4.41
# against 4.07, next-token L = 240 (88 M) 27.6 against 45.1.
PARALLEL_MIN_WORK = 1 << 24

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def worth_threads(n: int, num_centroids: int, s: int, threads: int) -> bool:
    """Whether ``threads`` threads pay for one pass over n points (per group) against L centroids
    in s dimensions."""
    return threads > 1 and n >= 2 * 512 and n * num_centroids * s >= PARALLEL_MIN_WORK


def lloyd_groups_threaded(
    points: np.ndarray, pt: np.ndarray, centroids: np.ndarray, iterations: int, threads: int
) -> tuple[np.ndarray, int]:
    """``kmeans_lloyd.lloyd_groups`` with each pass split over ``threads`` threads; the same
    labels, centroids (updated in place) and iteration count, bit for bit.

    points (G, n, s), pt (G, s, n) float32; centroids (G, L, s) float32. Returns labels (G, n)
    int64 and the most updates any group ran.
    """
    g, n, s = points.shape
    num = centroids.shape[1]
    labels = np.full((g, n), -1, dtype=np.int64)
    sums = np.zeros((g, num, s), dtype=np.float64)
    counts = np.zeros((g, num), dtype=np.int64)
    fresh = np.empty(n, dtype=np.int64)
    bounds = _ranges(n, threads)
    for group in range(g):  # the first assignment: every point moves into the sums
        _assign(pt[group], centroids[group], bounds, fresh)
        kmeans_lloyd.apply_labels(points[group], labels[group], fresh, sums[group], counts[group])
    active = np.ones(g, dtype=np.bool_)
    ran = 0
    while ran < iterations:
        still = 0
        for group in map(int, np.flatnonzero(active)):
            kmeans_lloyd.update_centroids(centroids[group], sums[group], counts[group])
            _assign(pt[group], centroids[group], bounds, fresh)
            changed = kmeans_lloyd.apply_labels(
                points[group], labels[group], fresh, sums[group], counts[group]
            )
            if changed == 0:
                active[group] = False
            else:
                still += 1
        if still == 0:
            break
        ran += 1
    if ran < iterations:
        ran += 1  # the update that found the labels settled counts, as lloyd_groups does
    return labels, ran


def _ranges(n: int, threads: int) -> list[tuple[int, int]]:
    """``threads`` contiguous ranges covering 0..n, their bounds on 512-point blocks."""
    step = -(-n // threads // 512) * 512
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def _assign(
    pt: np.ndarray, centroids: np.ndarray, bounds: list[tuple[int, int]], fresh: np.ndarray
) -> None:
    """fresh = the nearest centroid of every point of one group: the first range on this
    thread, the others on the pool at the same time."""
    pool = _shared_pool()
    started: list[Future[None]] = [
        pool.submit(kmeans_lloyd.assign_range, pt, centroids, a, b, fresh) for a, b in bounds[1:]
    ]
    try:
        kmeans_lloyd.assign_range(pt, centroids, bounds[0][0], bounds[0][1], fresh)
    finally:
        for future in started:
            future.result()  # waits, and raises what the range raised


def _shared_pool() -> ThreadPoolExecutor:
    """One pool for the process, as wide as the machine (threads start only when needed); more
    ranges than that queue."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, os.cpu_count() or 1), thread_name_prefix="kmeans")
        return _pool
