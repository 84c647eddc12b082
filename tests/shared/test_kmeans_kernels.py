"""The compiled k-means: same bytes on any thread count, and the edge cases of its kernels."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from shared.pq.kmeans import assign, batched_kmeans
from shared.pq.quantizer import GroupedProductQuantizer, PQConfig, relative_error
from tests.utils.activations import femnist_activations
from tests.utils.reference_kmeans import nearest

# Every kernel path: L = 2 at s = 8 (two centroids per pass), s a multiple of 16 and of 8,
# any other s, many groups, and a subsampled training set with a full final assignment.
SHAPES = [(1152, 1, 2), (288, 1, 16), (144, 1, 32), (4608, 1152, 4), (768, 1, 5), (9216, 1, 3)]

_DIGEST = """
import hashlib, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from shared.pq.quantizer import GroupedProductQuantizer, PQConfig
from tests.utils.activations import femnist_activations
z = femnist_activations(batch=20)
h = hashlib.sha256()
for q, r, ell in {shapes}:
    for threads in (1, 2, None):
        code = GroupedProductQuantizer(9216, PQConfig(q=q, R=r, L=ell, threads=threads)).encode(
            z, seed=5)
        h.update(code.codebook.numpy().tobytes()); h.update(code.codewords.numpy().tobytes())
print(h.hexdigest())
"""


def test_same_bytes_on_one_thread_and_on_two() -> None:
    """Fresh processes with torch on 1 and on 2 threads, and PQConfig.threads 1, 2 and None
    inside each: one digest of every codebook and codeword, at every kernel path."""
    code = _DIGEST.format(shapes=SHAPES)
    digests = {
        subprocess.run(
            [sys.executable, "-c", code, str(threads)], capture_output=True, text=True, check=True
        ).stdout.strip()
        for threads in (1, 2, 1)
    }
    assert len(digests) == 1, digests


@pytest.mark.parametrize(("q", "r", "num_centroids"), SHAPES)
def test_repeated_encodes_are_identical_and_assign_to_the_nearest(
    q: int, r: int, num_centroids: int
) -> None:
    z = femnist_activations(batch=20)
    quantizer = GroupedProductQuantizer(9216, PQConfig(q=q, R=r, L=num_centroids))
    first, second = quantizer.encode(z, seed=3), quantizer.encode(z.clone(), seed=3)
    assert torch.equal(first.codebook, second.codebook)
    assert torch.equal(first.codewords, second.codewords)
    points = quantizer.group_points(z)
    labels = assign(points, first.codebook)
    torch.testing.assert_close(
        labels, first.codewords.reshape(-1, r, q // r).transpose(0, 1).reshape(r, -1)
    )


def test_error_is_not_worse_than_training_on_every_point() -> None:
    """The default subsample (max(4096, 256 L) points per group, drawn when N is over twice
    that: at L = 2, not at L = 16) against all points, median over seeds: within 2.5 %."""
    z = femnist_activations(batch=20)
    for q, num_centroids in [(1152, 2), (288, 16)]:
        errors = {}
        for budget in (256, None):
            quantizer = GroupedProductQuantizer(
                9216, PQConfig(q=q, L=num_centroids, max_points_per_centroid=budget)
            )
            errors[budget] = np.median(
                [relative_error(z, quantizer.quantize(z, seed=s)[1]) for s in range(3)]
            )
        assert errors[256] <= errors[None] * 1.025, (q, errors)


def test_coarse_to_fine_stays_within_half_a_percent_of_plain_lloyd() -> None:
    """The default (first 6 of 10 iterations on half the points, the last 4 on all) against
    every iteration on all points, median over 5 seeds, where the coarse half has enough
    points to run (L = 16, N = 5,760 and L = 32, N = 2,880); the final assignment is the
    nearest centroid of every point either way."""
    z = femnist_activations(batch=20)
    for q, num_centroids in [(288, 16), (144, 32)]:
        errors = {}
        for fraction in (0.5, None):
            quantizer = GroupedProductQuantizer(
                9216, PQConfig(q=q, L=num_centroids, coarse_fraction=fraction)
            )
            code = quantizer.encode(z, seed=0)
            labels = assign(quantizer.group_points(z), code.codebook)
            assert torch.equal(labels, code.codewords.reshape(1, -1))
            errors[fraction] = np.median(
                [relative_error(z, quantizer.quantize(z, seed=s)[1]) for s in range(5)]
            )
        assert errors[0.5] <= errors[None] * 1.005, (q, errors)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5, 1.5])
def test_a_coarse_fraction_outside_zero_one_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="coarse_fraction must be in"):
        PQConfig(q=288, L=16, coarse_fraction=fraction).validate(9216)
    with pytest.raises(ValueError, match="coarse_fraction must be in"):
        batched_kmeans(torch.randn(1, 100, 8), 4, coarse_fraction=fraction)


def test_more_centroids_than_points_reconstructs_exactly() -> None:
    points = torch.randn(3, 5, 4)
    result = batched_kmeans(points, 9, iterations=4, seed=1)
    rebuilt = torch.gather(result.centroids, 1, result.assignments[..., None].expand(-1, -1, 4))
    torch.testing.assert_close(rebuilt, points, rtol=0.0, atol=0.0)


def test_all_equal_points_give_one_used_centroid_and_no_nan() -> None:
    points = torch.full((2, 700, 8), 0.25)
    result = batched_kmeans(points, 16, iterations=5, seed=0)
    assert torch.isfinite(result.centroids).all()
    assert result.assignments.eq(0).all()
    torch.testing.assert_close(result.centroids[:, 0], points[:, 0])


def test_duplicate_points_and_a_size_no_block_divides() -> None:
    """1031 points (prime: every block loop has a remainder), each row repeated 3 times."""
    g = torch.Generator().manual_seed(9)
    base = torch.randn(1, 1031, 24, generator=g)
    points = torch.cat([base, base, base], dim=1)
    result = batched_kmeans(points, 7, iterations=10, seed=2)
    labels = result.assignments[0].numpy()
    np.testing.assert_array_equal(labels[:1031], labels[1031:2062])
    np.testing.assert_array_equal(labels[:1031], labels[2062:])
    d64 = points[0].double().numpy()
    expected = nearest(d64, result.centroids[0].double().numpy())
    assert (expected == labels).mean() > 0.999  # float32 rounding may flip exact near-ties


def test_float16_and_float64_inputs_cluster_like_their_float32_copy() -> None:
    points = femnist_activations(batch=4).reshape(1, -1, 8)[:, :4000]
    reference = batched_kmeans(points.float(), 4, seed=0)
    for dtype in (torch.float16, torch.float64):
        converted = points.to(dtype)
        result = batched_kmeans(converted, 4, seed=0)
        expected = batched_kmeans(converted.float(), 4, seed=0)
        assert result.centroids.dtype == torch.float32
        assert torch.equal(result.centroids, expected.centroids)
        assert torch.equal(result.assignments, expected.assignments)
    assert reference.centroids.shape == (1, 4, 8)
