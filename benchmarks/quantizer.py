"""Quantizer benchmark: time per batch and relative error at the paper's shapes.

For every shape it times our grouped product quantizer (encode + decode) beside faiss-cpu's
k-means and scikit-learn's KMeans on the same points with the same iteration budget, and
reports the relative error ||Z - Z~||^2 / ||Z||^2 of each. faiss and scikit-learn have no
notion of groups, so for R > 1 they loop over the R groups, as a user of them would.

Data: by default, activation-like batches made by the paper's bottom models on real inputs
(the FEMNIST CNN on scikit-learn's bundled digits; the next-token LSTM on a fixed text);
``--activations FILE.npz`` with arrays named ``femnist`` (B, 9216) and ``nwp`` (B, 96) uses
real cut-layer activations saved by the experiments instead.

    python benchmarks/quantizer.py [--repeats 7] [--out benchmarks/results/quantizer.json]
"""

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shared.models import build_bottom
from shared.quantizer import GroupedProductQuantizer, PQConfig, relative_error


@dataclass(frozen=True)
class Shape:
    name: str  # which paper setting the shape comes from
    batch: int  # B, rows per batch
    d: int  # activation width
    q: int
    L: int
    R: int = 1


SHAPES = [
    Shape("femnist", 20, 9216, 1152, 2),
    Shape("femnist", 20, 9216, 288, 16),
    Shape("femnist", 20, 9216, 144, 32),
    Shape("femnist", 20, 9216, 4608, 4, R=1152),
    Shape("nwp", 3840, 96, 12, 240),
]
ITERATIONS = 10


def femnist_batch(batch: int, seed: int) -> torch.Tensor:
    """FEMNIST CNN bottom on real 8x8 digits upsampled to 28x28: (batch, 9216)."""
    from sklearn.datasets import load_digits

    torch.manual_seed(seed)
    bottom = build_bottom("femnist_cnn").eval()
    images = torch.from_numpy(load_digits().images.astype(np.float32) / 16.0).unsqueeze(1)
    idx = np.random.default_rng(seed).choice(len(images), size=batch, replace=False)
    x = torch.nn.functional.interpolate(images[idx], size=(28, 28), mode="bilinear")
    with torch.no_grad():
        return bottom(x)


def nwp_batch(rows: int, seed: int) -> torch.Tensor:
    """Next-token LSTM bottom (d=96) on character codes of a fixed text: (rows, 96)."""
    torch.manual_seed(seed)
    seq_len = 30
    source = Path(__file__).read_text()
    text = (source * (rows // len(source) + 1)).encode("ascii", "replace")
    tokens = torch.tensor(list(text[:rows]), dtype=torch.int64) % 128
    bottom = build_bottom("next_token_lstm", vocab_size=128).eval()
    with torch.no_grad():
        return bottom(tokens.reshape(rows // seq_len, seq_len))


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first calls pay allocator and thread-pool start-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def ours(z: torch.Tensor, shape: Shape, repeats: int) -> dict[str, Any]:
    quantizer = GroupedProductQuantizer(
        shape.d, PQConfig(q=shape.q, L=shape.L, R=shape.R, iterations=ITERATIONS)
    )
    ms = median_ms(lambda: quantizer.quantize(z, seed=0), repeats)
    errors = [relative_error(z, quantizer.quantize(z, seed=s)[1]) for s in range(3)]
    return {"ms": ms, "rel_error": statistics.median(errors)}


def faiss_kmeans(points: np.ndarray, shape: Shape, repeats: int) -> dict[str, Any] | None:
    try:
        import faiss
    except ImportError:
        return None

    def run(seed: int) -> float:
        sq_err = 0.0
        for group in points:  # (n, s) per group
            km = faiss.Kmeans(group.shape[1], shape.L, niter=ITERATIONS, seed=seed + 1)
            km.train(group)
            dist, _ = km.index.search(group, 1)
            sq_err += float(dist.sum())
        return sq_err

    ms = median_ms(lambda: run(0), repeats)
    total = float((points.astype(np.float64) ** 2).sum())
    return {"ms": ms, "rel_error": statistics.median(run(s) / total for s in range(3))}


def sklearn_kmeans(points: np.ndarray, shape: Shape, repeats: int) -> dict[str, Any]:
    from sklearn.cluster import KMeans

    def run(seed: int) -> float:
        sq_err = 0.0
        for group in points:
            km = KMeans(shape.L, init="random", n_init=1, max_iter=ITERATIONS, random_state=seed)
            km.fit(group)
            sq_err += float(km.inertia_)
        return sq_err

    # scikit-learn looping over 1152 groups takes seconds per batch: fewer repeats suffice
    ms = median_ms(lambda: run(0), repeats if len(points) == 1 else 1)
    total = float((points.astype(np.float64) ** 2).sum())
    return {"ms": ms, "rel_error": statistics.median(run(s) / total for s in range(3))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--activations", type=Path, help="npz with 'femnist' and 'nwp' arrays")
    parser.add_argument("--no-sklearn", action="store_true", help="skip scikit-learn (slow)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/quantizer.json"))
    args = parser.parse_args()

    torch.set_num_threads(torch.get_num_threads())
    saved = dict(np.load(args.activations)) if args.activations else {}
    source = str(args.activations) if args.activations else "models on bundled inputs"
    rows = []
    for shape in SHAPES:
        if shape.name in saved:
            z = torch.from_numpy(saved[shape.name][: shape.batch].astype(np.float32))
        elif shape.name == "femnist":
            z = femnist_batch(shape.batch, seed=0)
        else:
            z = nwp_batch(shape.batch, seed=0)
        quantizer = GroupedProductQuantizer(shape.d, PQConfig(q=shape.q, L=shape.L, R=shape.R))
        points = quantizer.group_points(z).numpy()  # (R, n, s), the exact points we cluster
        row: dict[str, Any] = {**asdict(shape), "iterations": ITERATIONS}
        row["ours"] = ours(z, shape, args.repeats)
        row["faiss"] = faiss_kmeans(points, shape, args.repeats)
        if not args.no_sklearn:
            row["sklearn"] = sklearn_kmeans(points, shape, args.repeats)
        rows.append(row)
        print(json.dumps(row))

    result = {
        "benchmark": "quantizer",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "data": source,
        "repeats": args.repeats,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
