"""Lloyd's iterations on several threads, with the bits of the one-thread loop.

``shared.pq._lloyd.lloyd_groups`` runs every iteration of every group in one compiled,
sequential call. With more than one thread (and enough work per pass to pay for the hand-offs)
``lloyd_groups_threaded`` runs the same loop compiled with numba's parallel loops: each
assignment pass of a group is split into contiguous ranges of points that run at once on
numba's threads, then the changed points move between the centroid sums on one thread, in
point order.

Why the output is the same on any number of threads: a point's label depends on that point and
the centroids only (``assign_range``), so any split gives the labels of the sequential pass;
and the float64 sums see the same additions in the same order (``apply_labels``), so the
centroids of the next iteration are the same to the bit. tests/shared/test_kmeans_threads.py
compares every split with the one-thread loop, bit for bit, and callers on several threads.

Why numba's parallel loops, and only on a thread-safe threading layer: a pass hands its ranges
to threads and back in microseconds inside one compiled call, where a Python thread pool took
~0.1 ms a pass (round trip plus the unboxing of three kernel calls) and paid only from ~17 M
multiply-adds a pass up (FEMNIST's L = 16 and 32 passes, 2.9 M and 5.9 M, stayed on one
thread). Party B clusters in several worker threads at once: numba's ``omp`` (GNU OpenMP,
Debian's libgomp1) and ``tbb`` layers may be entered from several threads, its ``workqueue``
layer may not (it aborts the process). Where only workqueue loads, k-means stays on one
thread: the same bits, more slowly.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np
import torch

from shared.pq._kernels import assign_groups, assign_points, block_buffers, prepare
from shared.pq._lloyd import (
    apply_labels,
    assign_range,
    lloyd_groups,
    lloyd_state,
    update_centroids,
)

__all__ = [
    "FINAL_MIN_POINTS",
    "PARALLEL_MIN_WORK",
    "assign_groups_threaded",
    "lloyd_groups_threaded",
    "parallel_layer",
    "worth_threads",
]

# Multiply-adds of one assignment pass of one group (N L s) below which threads cost more than
# they save: a parallel pass costs a few microseconds of hand-off, a 1 M pass ~50 us of work.
# Measured on a quiet machine, two threads against one, Lloyd on FEMNIST activations: L = 16
# (2.9 M a pass) 1.27-1.32 ms against 1.50-1.95, L = 32 (5.9 M) 2.20-2.47 against 2.66-3.42;
# L = 2 on 4,096 points (65 k a pass) gained nothing measurable.
PARALLEL_MIN_WORK = 1 << 20
# Points a group from which the final assignment of all points (after training on a subsample)
# is split over threads: it is a memory pass (each block transposed, then scored), ~0.1 ms for
# FEMNIST's 23,040 points at L = 2 on one thread.
FINAL_MIN_POINTS = 8192

_parallel_jit = numba.njit(
    cache=True, nogil=True, boundscheck=False, fastmath={"contract"}, parallel=True
)
_layer_lock = threading.Lock()
_layer: str | None = None


def parallel_layer() -> str:
    """The threading layer numba's parallel loops run on here ("omp", "tbb" or "workqueue");
    loading it starts numba's threads, once per process."""
    global _layer
    with _layer_lock:
        if _layer is None:
            numba.get_num_threads()  # loads the threading layer (numba's own search order)
            _layer = str(numba.threading_layer())  # type: ignore[attr-defined]
        return _layer


def worth_threads(n: int, num_centroids: int, s: int, threads: int) -> bool:
    """Whether ``threads`` threads pay for one pass over n points (per group) against L centroids
    in s dimensions."""
    return threads > 1 and n >= 2 * 512 and n * num_centroids * s >= PARALLEL_MIN_WORK


def lloyd_groups_threaded(
    points: np.ndarray, pt: np.ndarray, centroids: np.ndarray, iterations: int, threads: int
) -> tuple[np.ndarray, int]:
    """``_lloyd.lloyd_groups`` with each pass split into ``threads`` ranges of points
    that run on as many threads (at most numba's NUMBA_NUM_THREADS; one where no thread-safe
    threading layer loads); the same labels, centroids (updated in place) and iteration
    count, bit for bit.

    points (G, n, s), pt (G, s, n) float32; centroids (G, L, s) float32. Returns labels (G, n)
    int64 and the most updates any group ran.
    """
    with _numba_threads(threads) as on:
        if on:
            starts, stops = _ranges(points.shape[1], threads)
            return _lloyd_in_ranges(points, pt, centroids, iterations, starts, stops)
    return lloyd_groups(points, pt, centroids, iterations)


def assign_groups_threaded(points: np.ndarray, centroids: np.ndarray, threads: int) -> np.ndarray:
    """``_kernels.assign_groups`` (points (G, n, s), centroids (G, L, s) float32 ->
    labels (G, n) int64) with each group's points split into ``threads`` ranges that run at
    once, from ``FINAL_MIN_POINTS`` points a group: the same labels."""
    if points.shape[1] >= FINAL_MIN_POINTS:
        with _numba_threads(threads) as on:
            if on:
                starts, stops = _ranges(points.shape[1], threads)
                return _assign_in_ranges(points, centroids, starts, stops)
    return assign_groups(points, centroids)


@contextmanager
def _numba_threads(threads: int) -> Iterator[bool]:
    """Whether numba's parallel loops may run here on ``threads`` threads (at most
    NUMBA_NUM_THREADS, and not on the workqueue layer), with numba's per-thread count set to
    that for the block and torch's thread setting as the caller had it afterwards."""
    workers = min(threads, numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    torch_threads = torch.get_num_threads()  # read before numba's threads start (see below)
    if workers < 2 or parallel_layer() == "workqueue":
        yield False
        return
    before = numba.get_num_threads()  # a per-thread setting: put back for other callers' code
    if workers != before:
        numba.set_num_threads(workers)
    try:
        yield True
    finally:
        if workers != before:
            numba.set_num_threads(before)
        # torch and numba's omp layer share GNU OpenMP, and numba starting its threads can set
        # the OpenMP thread count that torch reads as its own: the caller's torch setting is
        # never ours to change (tests/shared/test_quantizer.py)
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)


def _ranges(n: int, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and stops of ``threads`` contiguous ranges covering 0..n, on 512-point blocks."""
    step = -(-n // threads // 512) * 512
    starts = np.arange(0, n, step, dtype=np.int64)
    return starts, np.minimum(starts + step, n)


@_parallel_jit
def _lloyd_in_ranges(
    points: np.ndarray,
    pt: np.ndarray,
    centroids: np.ndarray,
    iterations: int,
    starts: np.ndarray,
    stops: np.ndarray,
) -> tuple[np.ndarray, int]:
    """``_lloyd.lloyd_groups``, its assignment passes split into the ranges
    starts[r]..stops[r] that run at once; the same control flow, sweep 0 being the first
    assignment (no update before it)."""
    g, n, _ = points.shape
    labels, sums, counts, active = lloyd_state(points, centroids)
    fresh = np.empty(n, dtype=np.int64)
    ran = 0
    for sweep in range(iterations + 1):
        still = 0
        for group in range(g):
            if not active[group]:
                continue
            if sweep > 0:
                update_centroids(centroids[group], sums[group], counts[group])
            for r in numba.prange(starts.shape[0]):
                assign_range(pt[group], centroids[group], starts[r], stops[r], fresh)
            changed = apply_labels(points[group], labels[group], fresh, sums[group], counts[group])
            if sweep > 0 and changed == 0:
                active[group] = False
            else:
                still += 1
        if sweep > 0:
            if still == 0:
                break
            ran += 1
    if ran < iterations:
        ran += 1  # the update that found the labels settled counts, as lloyd_groups does
    return labels, ran


@_parallel_jit
def _assign_in_ranges(
    points: np.ndarray, centroids: np.ndarray, starts: np.ndarray, stops: np.ndarray
) -> np.ndarray:
    """``_kernels.assign_groups`` with each group's points split into the ranges
    starts[r]..stops[r] that run at once, each with scratch buffers of its own."""
    g, n, s = points.shape
    num = centroids.shape[1]
    labels = np.empty((g, n), dtype=np.int64)
    scaled = np.empty((num, s), dtype=np.float32)
    c_sq = np.empty(num, dtype=np.float32)
    for group in range(g):
        prepare(centroids[group], scaled, c_sq)
        for r in numba.prange(starts.shape[0]):
            assign_points(
                points[group], scaled, c_sq, starts[r], stops[r], labels[group], block_buffers(s)
            )
    return labels
