"""Lloyd's iterations on several threads: the bits of the one-thread loop, from any caller."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from shared.pq import _kernels, _lloyd, _threads, kmeans
from shared.pq.quantizer import GroupedProductQuantizer, PQConfig
from tests.utils.activations import femnist_activations

ROOT = Path(__file__).resolve().parents[2]


def _points(q: int, r: int = 1) -> np.ndarray:
    """FEMNIST cut-layer activations as the quantizer groups them: (R, 20 q / R, 9216 / q)."""
    quantizer = GroupedProductQuantizer(9216, PQConfig(q=q, L=2, R=r))
    return np.ascontiguousarray(quantizer.group_points(femnist_activations(batch=20)).numpy())


@pytest.mark.parametrize(
    ("q", "r", "num_centroids", "iterations"),
    [
        (288, 1, 16, 10),  # L = 16 at s = 32
        (144, 1, 32, 10),  # L = 32 at s = 64
        (1152, 1, 2, 30),  # s = 8, long enough for the labels to settle before the budget
        (1152, 4, 5, 10),  # several groups, L not a multiple of 4
        (768, 1, 7, 3),  # s = 12: the one-dimension-at-a-time path
    ],
)
@pytest.mark.parametrize("threads", [2, 3, 7])
def test_every_split_gives_the_one_thread_bits(
    q: int, r: int, num_centroids: int, iterations: int, threads: int
) -> None:
    points = _points(q, r)
    start = kmeans._kmeanspp_init(points, num_centroids, np.random.default_rng(4))
    start = np.ascontiguousarray(start, dtype=np.float32)
    transposed = kmeans._transposed(points)
    alone, split = start.copy(), start.copy()

    labels, ran = _lloyd.lloyd_groups(points, transposed, alone, iterations)
    labels_split, ran_split = _threads.lloyd_groups_threaded(
        points, transposed, split, iterations, threads
    )

    np.testing.assert_array_equal(labels_split, labels)
    assert split.tobytes() == alone.tobytes()
    assert ran_split == ran


@pytest.mark.parametrize(("q", "num_centroids"), [(1152, 2), (1152, 5), (288, 16)])
@pytest.mark.parametrize("threads", [2, 3, 7])
def test_the_final_assignment_on_threads_gives_the_one_thread_labels(
    q: int, num_centroids: int, threads: int
) -> None:
    """After training on a subsample, every point is assigned once more: split over threads
    from 8,192 points a group (FEMNIST q = 1152: 23,040 points; q = 288: 5,760, one thread)."""
    points = _points(q)
    centroids = np.ascontiguousarray(
        kmeans._kmeanspp_init(points, num_centroids, np.random.default_rng(7)), dtype=np.float32
    )

    alone = _kernels.assign_groups(points, centroids)
    split = _threads.assign_groups_threaded(points, centroids, threads)

    np.testing.assert_array_equal(split, alone)


def test_concurrent_callers_get_what_each_gets_alone() -> None:
    """Party B clusters in several worker threads at once, each on numba's threads. 20,000
    points of 8 dimensions and 128 centroids: 20 M multiply-adds a pass, on two threads."""
    assert _threads.worth_threads(20_000, 128, 8, threads=2)
    points = torch.from_numpy(_points(1152)[:, :20_000].copy())

    def cluster(seed: int) -> kmeans.KMeansResult:
        return kmeans.batched_kmeans(points, 128, iterations=4, seed=seed, threads=2)

    alone = [cluster(seed) for seed in range(4)]
    with ThreadPoolExecutor(4) as callers:
        together = list(callers.map(cluster, range(4)))
    one_thread = kmeans.batched_kmeans(points, 128, iterations=4, seed=0, threads=1)
    for a, b in zip(alone, together, strict=True):
        assert torch.equal(a.centroids, b.centroids)
        assert torch.equal(a.assignments, b.assignments)
    assert torch.equal(alone[0].centroids, one_thread.centroids)


def test_without_a_thread_safe_threading_layer_the_loop_stays_on_one_thread() -> None:
    """numba's workqueue layer aborts when two threads enter it: in a process that has only
    it, the threaded loop runs the one-thread loop (the same bits)."""
    script = (
        "import numpy as np\n"
        "from shared.pq import _kernels, _lloyd, _threads, kmeans\n"
        "from tests.shared.test_kmeans_threads import _points\n"
        "points = _points(144)\n"
        "rng = np.random.default_rng(4)\n"
        "start = np.ascontiguousarray(kmeans._kmeanspp_init(points, 32, rng))\n"
        "pt = kmeans._transposed(points)\n"
        "alone, split = start.copy(), start.copy()\n"
        "labels, _ = _lloyd.lloyd_groups(points, pt, alone, 10)\n"
        "labels_split, _ = _threads.lloyd_groups_threaded(points, pt, split, 10, 2)\n"
        "assert (labels == labels_split).all() and alone.tobytes() == split.tobytes()\n"
        "print(_threads.parallel_layer())\n"
    )
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["workqueue"]
