"""The grouped product quantizer against numpy and faiss oracles and the paper's trends."""

import numpy as np
import pytest
import torch

from shared.pq.kmeans import assign, batched_kmeans
from shared.pq.quantizer import GroupedProductQuantizer, PQCode, PQConfig, relative_error
from tests.utils.activations import femnist_activations
from tests.utils.reference_kmeans import lloyd


def _separated_batch(b: int, d: int, seed: int) -> torch.Tensor:
    """Clustered data (a few prototypes plus noise) so that ties are vanishingly unlikely."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(4, d, generator=g) * 3
    pick = torch.randint(4, (b,), generator=g)
    return prototypes[pick] + 0.3 * torch.randn(b, d, generator=g)


def _reference_groups(z: np.ndarray, q: int, r: int) -> list[np.ndarray]:
    """The paper's grouping written out literally: group k holds subvectors (j, k*q/R + i)."""
    b, d = z.shape
    s, per = d // q, q // r
    groups = []
    for k in range(r):
        rows = [
            z[j, (k * per + i) * s : (k * per + i + 1) * s] for j in range(b) for i in range(per)
        ]
        groups.append(np.stack(rows))
    return groups


# ----------------------------------------------------------------------------- layout


@pytest.mark.parametrize(("q", "r"), [(1, 1), (6, 1), (6, 2), (6, 3), (6, 6), (12, 4)])
def test_group_points_matches_the_papers_definition(q: int, r: int) -> None:
    z = torch.randn(5, 24)
    quantizer = GroupedProductQuantizer(24, PQConfig(q=q, R=r, L=2))

    grouped = quantizer.group_points(z).numpy()

    for k, expected in enumerate(_reference_groups(z.numpy(), q, r)):
        np.testing.assert_array_equal(grouped[k], expected)


def test_decode_places_each_centroid_at_its_position() -> None:
    quantizer = GroupedProductQuantizer(6, PQConfig(q=3, R=3, L=2))
    codebook = torch.arange(3 * 2 * 2, dtype=torch.float32).reshape(3, 2, 2)
    codewords = torch.tensor([[0, 1, 0], [1, 0, 1]])

    z_tilde = quantizer.decode(PQCode(codebook=codebook, codewords=codewords))

    expected = torch.tensor([[0, 1, 6, 7, 8, 9], [2, 3, 4, 5, 10, 11]], dtype=torch.float32)
    torch.testing.assert_close(z_tilde, expected)


# ----------------------------------------------------------------------------- oracles


def test_q1_is_plain_kmeans_on_whole_rows() -> None:
    z = _separated_batch(40, 16, seed=1)
    init = z[[0, 7, 13, 21]].unsqueeze(0)  # (1, L, d)
    quantizer = GroupedProductQuantizer(16, PQConfig(q=1, L=4, iterations=20))

    code = quantizer.encode(z, seed=0, initial_codebook=init)

    centroids, labels = lloyd(z.numpy(), init[0].numpy(), iterations=20)
    np.testing.assert_array_equal(code.codewords[:, 0].numpy(), labels)
    np.testing.assert_allclose(code.codebook[0].numpy(), centroids, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("q", "r"), [(8, 8), (8, 2), (8, 1)])
def test_grouped_pq_is_kmeans_per_group(q: int, r: int) -> None:
    """R = q is vanilla PQ (one codebook per position); any R is k-means on each group."""
    d, b, num_centroids = 32, 30, 3
    z = _separated_batch(b, d, seed=2)
    quantizer = GroupedProductQuantizer(d, PQConfig(q=q, R=r, L=num_centroids, iterations=15))
    groups = _reference_groups(z.numpy(), q, r)
    init = torch.from_numpy(np.stack([g[:num_centroids] for g in groups]))  # (r, l, s)

    code = quantizer.encode(z, seed=0, initial_codebook=init)

    per = q // r
    for k, points in enumerate(groups):
        centroids, labels = lloyd(points, init[k].numpy(), iterations=15)
        got_labels = code.codewords[:, k * per : (k + 1) * per].reshape(-1).numpy()
        np.testing.assert_array_equal(got_labels, labels)
        np.testing.assert_allclose(code.codebook[k].numpy(), centroids, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("q", "r", "num_centroids"), [(1152, 1, 2), (288, 1, 16), (144, 1, 32), (4608, 1152, 4)]
)
def test_every_codeword_is_the_nearest_centroid_of_its_group(
    q: int, r: int, num_centroids: int
) -> None:
    z = femnist_activations(batch=20)
    quantizer = GroupedProductQuantizer(9216, PQConfig(q=q, R=r, L=num_centroids))

    code = quantizer.encode(z, seed=3)

    groups = _reference_groups(z.numpy().astype(np.float64), q, r)
    codebook = code.codebook.numpy().astype(np.float64)
    per = q // r
    for k in range(0, r, max(1, r // 16)):  # 16 groups suffice when R is large
        points = groups[k]
        d2 = ((points[:, None, :] - codebook[k][None]) ** 2).sum(-1)  # (n, l)
        chosen = code.codewords[:, k * per : (k + 1) * per].reshape(-1).numpy()
        # float32 rounding may flip exact near-ties; the chosen centroid must be as near as
        # the best one up to that rounding.
        best = d2.min(axis=1)
        np.testing.assert_allclose(d2[np.arange(len(points)), chosen], best, rtol=1e-4, atol=1e-5)


def test_error_is_close_to_faiss_kmeans_on_the_same_data() -> None:
    """Tolerance: our relative error is at most 3% above faiss's (both 10 iterations, all
    points, best of 3 seeds each: both are heuristics with seed-dependent local optima)."""
    faiss = pytest.importorskip("faiss")
    z = femnist_activations(batch=20)
    for q, num_centroids in [(1, 4), (288, 16), (1152, 2)]:
        quantizer = GroupedProductQuantizer(9216, PQConfig(q=q, L=num_centroids))
        points = quantizer.group_points(z)[0].numpy()
        ours = min(relative_error(z, quantizer.quantize(z, seed=s)[1]) for s in range(3))
        theirs = []
        for s in range(3):
            km = faiss.Kmeans(points.shape[1], num_centroids, niter=10, seed=s + 1)
            km.cp.max_points_per_centroid = 1 << 30  # train on every point, like ours
            km.train(points)
            dist, _ = km.index.search(points, 1)
            theirs.append(float(dist.sum()) / float((points.astype(np.float64) ** 2).sum()))
        assert ours <= min(theirs) * 1.03 + 1e-9, (q, num_centroids, ours, min(theirs))


@pytest.mark.parametrize(
    ("groups", "n", "s", "num_centroids"),
    [
        (1, 500, 8, 2),  # L = 2: one comparison
        (1, 300, 4, 3),  # few centroids, one group
        (3, 200, 2, 8),  # few centroids, several groups
        (5, 90, 2, 4),
        (1, 400, 8, 9),  # many centroids: blocked scores, numpy argmin
        (2, 700, 8, 64),
    ],
)
def test_assign_is_the_nearest_centroid_on_every_code_path(
    groups: int, n: int, s: int, num_centroids: int
) -> None:
    """L=2, L<=8 (one group and many) and blocked L>8 each take their own code path."""
    g = torch.Generator().manual_seed(groups * 1000 + num_centroids)
    points = torch.randn(groups, n, s, generator=g)
    centroids = torch.randn(groups, num_centroids, s, generator=g)

    labels = assign(points, centroids).numpy()

    p64, c64 = points.double().numpy(), centroids.double().numpy()
    d2 = ((p64[:, :, None, :] - c64[:, None, :, :]) ** 2).sum(-1)  # (g, n, l)
    chosen = np.take_along_axis(d2, labels[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(chosen, d2.min(-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_centroids", [2, 4, 16])
def test_ties_go_to_the_lowest_index_on_every_code_path(num_centroids: int) -> None:
    """Duplicate centroids: every point goes to the first copy, never to a later one."""
    base = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
    centroids = base[torch.arange(num_centroids) % 2].unsqueeze(0)  # copies at i and i + 2k
    points = torch.cat([base, base + 0.1, base - 0.1]).unsqueeze(0)

    labels = assign(points, centroids)

    assert labels.tolist() == [[0, 1, 0, 1, 0, 1]]


@pytest.mark.parametrize(("q", "r", "num_centroids"), [(1152, 1, 2), (1152, 8, 4), (48, 1, 64)])
def test_same_seed_gives_identical_output_on_every_code_path(
    q: int, r: int, num_centroids: int
) -> None:
    z = femnist_activations(batch=4)
    quantizer = GroupedProductQuantizer(9216, PQConfig(q=q, R=r, L=num_centroids))

    first, second = quantizer.encode(z, seed=11), quantizer.encode(z.clone(), seed=11)

    assert torch.equal(first.codebook, second.codebook)
    assert torch.equal(first.codewords, second.codewords)


def test_kmeanspp_with_more_centroids_than_points_repeats_points() -> None:
    points = torch.tensor([[[0.0], [1.0], [2.0]]])

    result = batched_kmeans(points, 5, iterations=3, seed=0)

    assert sorted(set(result.centroids.flatten().tolist())) == [0.0, 1.0, 2.0]
    torch.testing.assert_close(
        result.centroids[0, result.assignments[0]], points[0], rtol=0.0, atol=0.0
    )


# ----------------------------------------------------------------------------- trends (Fig. 2)


def test_error_falls_as_L_doubles() -> None:
    z = femnist_activations(batch=20)
    errors = [
        relative_error(
            z, GroupedProductQuantizer(9216, PQConfig(q=288, L=ell)).quantize(z, seed=0)[1]
        )
        for ell in (2, 4, 8, 16, 32)
    ]
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False)), errors


def test_error_falls_as_q_grows_at_fixed_L() -> None:
    # Shorter subvectors, same L: more bits per value, lower error. On unstructured data, not
    # the FEMNIST bottom's: in its channels-last layout a q = 144 subvector is one pixel's 64
    # channels, and an untrained bottom's background pixels are all exactly 0 (zero biases,
    # zero input), so there the layout, not the subvector length, decides the error.
    z = torch.randn(20, 9216, generator=torch.Generator().manual_seed(0))
    errors = [
        relative_error(z, GroupedProductQuantizer(9216, PQConfig(q=q, L=8)).quantize(z, seed=0)[1])
        for q in (144, 288, 1152, 4608)
    ]
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False)), errors


def test_more_groups_lower_the_error_at_fixed_q_and_L() -> None:
    z = femnist_activations(batch=20)
    errors = [
        relative_error(
            z, GroupedProductQuantizer(9216, PQConfig(q=4608, R=r, L=4)).quantize(z, seed=0)[1]
        )
        for r in (1, 384, 2304)
    ]
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False)), errors


# ----------------------------------------------------------------------------- determinism & edges


def test_same_seed_and_input_give_identical_output() -> None:
    z = femnist_activations(batch=20)
    quantizer = GroupedProductQuantizer(9216, PQConfig(q=288, L=16))

    first, second = quantizer.encode(z, seed=7), quantizer.encode(z.clone(), seed=7)
    other = quantizer.encode(z, seed=8)

    assert torch.equal(first.codebook, second.codebook)
    assert torch.equal(first.codewords, second.codewords)
    assert not torch.equal(first.codebook, other.codebook)


def test_fewer_distinct_subvectors_than_L_reconstructs_exactly() -> None:
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [3.0, 4.0]])
    quantizer = GroupedProductQuantizer(2, PQConfig(q=1, L=8))

    code, z_tilde = quantizer.quantize(rows, seed=0)

    torch.testing.assert_close(z_tilde, rows)
    assert code.codebook.shape == (1, 8, 2)
    assert torch.isfinite(code.codebook).all()
    assert len(set(code.codewords[:, 0].tolist())) == 2


def test_L1_sends_the_mean() -> None:
    z = torch.randn(10, 6)
    code, z_tilde = GroupedProductQuantizer(6, PQConfig(q=1, L=1)).quantize(z, seed=0)

    torch.testing.assert_close(z_tilde, z.mean(0, keepdim=True).expand(10, 6))
    assert code.codewords.eq(0).all()


def test_empty_clusters_keep_their_centroid_and_never_become_nan() -> None:
    points = torch.tensor([[[0.0], [0.0], [10.0]]])  # (g=1, n=3, s=1)
    init = torch.tensor([[[0.0], [10.0], [100.0]]])  # the third never wins a point

    result = batched_kmeans(points, 3, iterations=5, initial_centroids=init)

    torch.testing.assert_close(result.centroids, init)
    assert result.assignments.tolist() == [[0, 0, 1]]


def test_early_stop_when_assignments_settle() -> None:
    z = _separated_batch(64, 8, seed=4)
    result = batched_kmeans(z.unsqueeze(0), 4, iterations=100, seed=0)
    assert result.iterations < 100


@pytest.mark.parametrize(
    ("d", "config", "message"),
    [
        (10, PQConfig(q=3, L=2), "must divide d"),
        (12, PQConfig(q=4, R=3, L=2), "must divide q"),
        (12, PQConfig(q=4, L=0), "L"),
        (12, PQConfig(q=4, L=1 << 17), "L"),
        (12, PQConfig(q=0, L=2), "q"),
        (12, PQConfig(q=4, R=0, L=2), "R"),
        (12, PQConfig(q=4, L=2, iterations=-1), "iterations"),
        (0, PQConfig(q=1, L=2), "d"),
    ],
)
def test_invalid_parameters_are_refused(d: int, config: PQConfig, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GroupedProductQuantizer(d, config)


def test_bad_batches_are_refused() -> None:
    quantizer = GroupedProductQuantizer(8, PQConfig(q=2, L=2))
    with pytest.raises(ValueError, match=r"\(B, 8\)"):
        quantizer.encode(torch.zeros(3, 6), seed=0)
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantizer.encode(torch.full((3, 8), float("nan")), seed=0)
    with pytest.raises(ValueError, match="empty"):
        quantizer.encode(torch.zeros(0, 8), seed=0)


def test_clustering_leaves_torchs_thread_setting_alone() -> None:
    before = torch.get_num_threads()
    for threads in (1, 2, None):
        config = PQConfig(q=288, L=16, threads=threads)
        GroupedProductQuantizer(9216, config).encode(femnist_activations(20), seed=0)
        assert torch.get_num_threads() == before


def test_threads_none_leaves_the_process_setting_alone() -> None:
    before = torch.get_num_threads()
    z = femnist_activations(batch=2)

    one = GroupedProductQuantizer(9216, PQConfig(q=1152, L=2)).encode(z, seed=5)
    untouched = GroupedProductQuantizer(9216, PQConfig(q=1152, L=2, threads=None)).encode(z, seed=5)

    assert torch.get_num_threads() == before
    assert torch.equal(one.codewords, untouched.codewords)
