"""The torch k-means backend (shared/pq/_torch.py) on CPU tensors: the numba kernels' result,
to the bit, at the quantizer's shapes; deterministic; stacked calls equal single ones; and it
runs (and shared.pq imports) without numba.

On a GPU the same code differs from the kernels in float rounding only; benchmarks/
device_check.py measures by how much on a real card."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.pq import GroupedProductQuantizer, PQConfig
from shared.pq._sampling import subsample_indices
from shared.pq._seeding import subsample_groups
from shared.pq.kmeans import batched_kmeans, batched_kmeans_many
from tests.utils.activations import femnist_activations

# L = 2 at s = 8 (the headline), L = 16 at s = 32, vanilla PQ (many groups), odd s
SHAPES = [(1152, 1, 2), (288, 1, 16), (4608, 1152, 4), (768, 1, 5)]
SUBSAMPLED = {"max_points_per_centroid": 256, "coarse_fraction": 0.5}  # the quantizer's


def _same(a: object, b: object) -> bool:
    return (
        torch.equal(a.centroids, b.centroids)  # type: ignore[attr-defined]
        and torch.equal(a.assignments, b.assignments)  # type: ignore[attr-defined]
        and a.iterations == b.iterations  # type: ignore[attr-defined]
    )


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 3000),
    data=st.data(),
    groups=st.integers(1, 3),
)
def test_subsample_indices_are_the_numba_kernels_choice(
    n: int, data: st.DataObject, groups: int
) -> None:
    keep = data.draw(st.integers(1, n))
    seed = data.draw(st.integers(0, 2**32 - 1))
    uniforms = np.random.default_rng(seed).random((groups, keep))
    if data.draw(st.booleans()):  # many draws into the last slots: long chains of swaps
        uniforms[:, : keep // 2] = 0.999999
    points = np.broadcast_to(np.arange(n, dtype=np.float32)[None, :, None], (groups, n, 1))
    expected = subsample_groups(np.ascontiguousarray(points), uniforms)[:, :, 0]
    np.testing.assert_array_equal(subsample_indices(n, uniforms), expected.astype(np.int64))


@pytest.mark.parametrize(("q", "r", "num"), SHAPES)
@pytest.mark.parametrize("init", ["kmeans++", "random"])
def test_torch_on_a_cpu_gives_the_kernels_bits(q: int, r: int, num: int, init: str) -> None:
    """Same draws, same centroids (float64 sums rounded to float32), same labels: at these
    shapes the two backends agree to the bit; on a GPU only float rounding may differ."""
    points = GroupedProductQuantizer(9216, PQConfig(q=q, R=r, L=num)).group_points(
        femnist_activations(batch=20)
    )
    kwargs = {"iterations": 10, "seed": 7, "init": init, **SUBSAMPLED}
    kernels = batched_kmeans(points, num, backend="numba", **kwargs)  # type: ignore[arg-type]
    backend = batched_kmeans(points, num, backend="torch", **kwargs)  # type: ignore[arg-type]
    assert _same(kernels, backend)


def test_edge_cases_agree_too() -> None:
    """Fewer distinct points than L (duplicate centroids, lowest index wins), fewer points
    than L (random init with replacement), no iterations, a given start."""
    few = torch.tensor([[[0.0, 1.0], [0.0, 1.0], [2.0, 0.0]]])  # 2 distinct of 3
    for kwargs in (
        {"num_centroids": 3, "iterations": 5},
        {"num_centroids": 4, "iterations": 5, "init": "random"},
        {"num_centroids": 2, "iterations": 0},
        {"num_centroids": 2, "iterations": 3, "initial_centroids": torch.ones(1, 2, 2)},
    ):
        a = batched_kmeans(few, seed=1, backend="numba", **kwargs)  # type: ignore[arg-type]
        b = batched_kmeans(few, seed=1, backend="torch", **kwargs)  # type: ignore[arg-type]
        assert _same(a, b), kwargs


def test_the_torch_backend_is_deterministic_run_to_run() -> None:
    points = torch.randn(3, 5000, 8, generator=torch.Generator().manual_seed(0))
    runs = [batched_kmeans(points, 8, seed=4, backend="torch", **SUBSAMPLED) for _ in range(2)]
    assert _same(*runs)


def test_stacked_calls_equal_one_call_each() -> None:
    """A step's chunks clustered in one stacked call (equal shapes) or one by one: the same
    codes, and on a CPU the encode of each chunk on its own."""
    z = femnist_activations(batch=60)
    chunks = [z[:20], z[20:40], z[40:55]]  # two of one shape, one of another
    seeds = [11, 12, 13]
    quantizer = GroupedProductQuantizer(9216, PQConfig(q=1152, L=2, backend="torch"))
    points = [quantizer.group_points(c) for c in chunks]
    stacked = batched_kmeans_many(points, 2, seeds=seeds, backend="torch", **SUBSAMPLED)
    single = [
        batched_kmeans(p, 2, seed=s, backend="torch", **SUBSAMPLED)
        for p, s in zip(points, seeds, strict=True)
    ]
    assert all(_same(a, b) for a, b in zip(stacked, single, strict=True))
    kernels = GroupedProductQuantizer(9216, PQConfig(q=1152, L=2))
    many = kernels.encode_many(chunks, seeds=seeds)
    for chunk, seed, code in zip(chunks, seeds, many, strict=True):
        alone = kernels.encode(chunk, seed=seed)
        assert torch.equal(alone.codebook, code.codebook)
        assert torch.equal(alone.codewords, code.codewords)


def test_a_bad_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backend"):
        batched_kmeans(torch.zeros(1, 4, 2), 2, backend="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend"):
        PQConfig(q=2, L=2, backend="gpu").validate(8)  # type: ignore[arg-type]


def test_without_numba_the_quantizer_imports_and_the_torch_backend_runs() -> None:
    """A GPU machine may lack numba: shared.pq still imports, the torch backend clusters, and
    the CPU path says what is missing."""
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import torch\n"
        "from shared.pq import GroupedProductQuantizer, PQConfig\n"
        "z = torch.rand(20, 96, generator=torch.Generator().manual_seed(0))\n"
        "torch_pq = GroupedProductQuantizer(96, PQConfig(q=12, L=4, backend='torch'))\n"
        "code = torch_pq.encode(z, seed=1)\n"
        "assert code.codewords.shape == (20, 12)\n"
        "try:\n"
        "    GroupedProductQuantizer(96, PQConfig(q=12, L=4)).encode(z, seed=1)\n"
        "except RuntimeError as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "refused: k-means on CPU tensors needs numba" in done.stdout
