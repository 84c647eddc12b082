"""Lloyd's iterations on several threads: the bits of the one-thread loop, from any caller."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from shared import kmeans, kmeans_lloyd, kmeans_threads
from shared.quantizer import GroupedProductQuantizer, PQConfig
from tests.utils.activations import femnist_activations


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

    labels, ran = kmeans_lloyd.lloyd_groups(points, transposed, alone, iterations)
    labels_split, ran_split = kmeans_threads.lloyd_groups_threaded(
        points, transposed, split, iterations, threads
    )

    np.testing.assert_array_equal(labels_split, labels)
    assert split.tobytes() == alone.tobytes()
    assert ran_split == ran


def test_concurrent_callers_get_what_each_gets_alone() -> None:
    """Party B clusters in several worker threads at once; they share the pool. 20,000 points
    of 8 dimensions and 128 centroids: 20 M multiply-adds a pass, on two threads."""
    assert kmeans_threads.worth_threads(20_000, 128, 8, threads=2)
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


def test_small_passes_stay_on_one_thread() -> None:
    """Below ~17 M multiply-adds a pass, handing ranges to threads costs more than it saves."""
    assert not kmeans_threads.worth_threads(4096, 2, 8, threads=2)  # FEMNIST L = 2
    assert not kmeans_threads.worth_threads(2880, 32, 64, threads=2)  # FEMNIST L = 32
    assert kmeans_threads.worth_threads(46_080, 240, 8, threads=2)  # next-token L = 240
    assert not kmeans_threads.worth_threads(46_080, 240, 8, threads=1)
    assert not kmeans_threads.worth_threads(600, 2400, 64, threads=2)  # too few points to split
