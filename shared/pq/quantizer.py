"""The grouped product quantizer of FedLite (Wang et al., section 3.1).

A batch of activations Z (B, d) is cut into q subvectors of s = d/q dimensions each. Subvector
positions are stacked into R groups: group r holds positions r*q/R ... (r+1)*q/R - 1 of every
row, i.e. N = B*q/R points of s dimensions. Each group is clustered into L centroids; the
codebook is (R, L, s) and each subvector is sent as the index of its nearest centroid, giving
codewords (B, q). Special cases: q = 1 is plain k-means on whole rows; R = q is vanilla product
quantization (one codebook per position); R = 1 shares one codebook across all positions.

Message size (paper): phi*d*R*L/q + B*q*log2(L) bits against phi*d*B for the raw batch.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from shared.pq.kmeans import (
    Backend,
    InitMethod,
    KMeansResult,
    batched_kmeans,
    batched_kmeans_many,
)
from shared.types import WireFloat

__all__ = ["PQConfig", "PQCode", "GroupedProductQuantizer", "MAX_CENTROIDS", "relative_error"]

# Codewords travel as at most 16-bit integers (see shared/wire/bitpack.py).
MAX_CENTROIDS = 1 << 16

# Rows per block when assigning to a fixed codebook: bounds the (rows*q/R, L, s) distance
# tensor (64 FEMNIST rows with q=1152, L=2: 1.2 M floats).
_ASSIGN_ROWS = 64


@dataclass(frozen=True)
class PQConfig:
    """Hyper-parameters of the grouped product quantizer."""

    q: int  # subvectors per activation row; must divide d
    L: int  # centroids per group (codewords carry ceil(log2 L) bits)
    R: int = 1  # groups of subvector positions sharing a codebook; must divide q
    iterations: int = 10  # Lloyd iteration budget per batch (early stop when settled)
    init: InitMethod = "kmeans++"  # centroid seeding
    # train on a subsample of max(4096, L * this) points per group when N is over twice that
    # (faiss: 256 L when N is over it); None: all
    max_points_per_centroid: int | None = 256
    # coarse to fine: all but the last 4 iterations on a seeded random half of the training
    # points where that keeps max(1024, 16 L) per group (shared/pq/kmeans.py); None: plain Lloyd
    coarse_fraction: float | None = 0.5
    # threads one k-means assignment pass may run on; None (default): torch's intra-op setting.
    # The bytes do not depend on it (shared/pq/_threads.py)
    threads: int | None = None
    # k-means backend: "auto" (torch for activations on a GPU, numba kernels for host memory),
    # or "numba" / "torch" to force one (shared/pq/kmeans.py); the bytes differ in rounding only
    backend: Backend = "auto"

    def validate(self, d: int) -> None:
        """Raise ValueError with a precise message if this config cannot quantize width d."""
        if d < 1:
            raise ValueError(f"activation width d must be >= 1, got {d}")
        if self.q < 1:
            raise ValueError(f"q (subvectors per row) must be >= 1, got {self.q}")
        if d % self.q != 0:
            raise ValueError(f"q={self.q} must divide d={d} (subvectors of equal size d/q)")
        if self.R < 1:
            raise ValueError(f"R (groups) must be >= 1, got {self.R}")
        if self.q % self.R != 0:
            raise ValueError(f"R={self.R} must divide q={self.q} (equal-size groups)")
        if not 1 <= self.L <= MAX_CENTROIDS:
            raise ValueError(
                f"L (centroids per group) must be in [1, {MAX_CENTROIDS}], got {self.L}"
            )
        if self.iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {self.iterations}")
        if self.backend not in ("auto", "numba", "torch"):
            raise ValueError(f"backend must be 'auto', 'numba' or 'torch', got {self.backend!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 or None, got {self.threads}")
        if self.max_points_per_centroid is not None and self.max_points_per_centroid < 1:
            raise ValueError(
                f"max_points_per_centroid must be >= 1 or None, got {self.max_points_per_centroid}"
            )
        if self.coarse_fraction is not None and not 0.0 < self.coarse_fraction < 1.0:
            raise ValueError(
                f"coarse_fraction must be in (0, 1) or None, got {self.coarse_fraction}"
            )


@dataclass(frozen=True)
class PQCode:
    """One quantized batch: what party A sends.

    codebook:  (R, L, s) float32 centroids, s = d/q
    codewords: (B, q) int64, codewords[b, j] indexes the codebook of group j // (q/R)
    """

    codebook: Tensor
    codewords: Tensor

    @property
    def batch_size(self) -> int:
        return int(self.codewords.shape[0])

    @property
    def dim(self) -> int:
        return int(self.codewords.shape[1] * self.codebook.shape[2])

    def rounded(self, dtype: WireFloat) -> "PQCode":
        """This code as the receiver decodes it when the codebook travels as ``dtype``: the
        sender rebuilds z~ from the same float16-rounded centroids (float32: unchanged)."""
        if dtype == "float32":
            return self
        return PQCode(self.codebook.half().float(), self.codewords)


class GroupedProductQuantizer:
    """Quantizes (B, d) activation batches with a fresh codebook per batch.

    The codebook is rebuilt for every batch, as in the paper: codebooks from earlier batches
    would be stale. Output is a pure function of (z, seed).
    """

    def __init__(self, d: int, config: PQConfig) -> None:
        config.validate(d)
        self.d = d
        self.config = config
        self.sub_dim = d // config.q  # s
        self.positions_per_group = config.q // config.R  # q/R
        # Row offset of each position's group inside the flattened (R*L, s) codebook.
        group_of_position = torch.arange(config.q) // self.positions_per_group  # (q,)
        self._codebook_offset = group_of_position * config.L  # (q,)

    def group_points(self, z: Tensor) -> Tensor:
        """Rearrange (B, d) into the R groups of subvectors: (R, B*q/R, s)."""
        b = z.shape[0]
        cfg = self.config
        grouped = z.reshape(b, cfg.R, self.positions_per_group, self.sub_dim)  # (b, r, q/r, s)
        return grouped.transpose(0, 1).reshape(cfg.R, b * self.positions_per_group, self.sub_dim)

    def encode(self, z: Tensor, *, seed: int, initial_codebook: Tensor | None = None) -> PQCode:
        """Cluster every group and return the codebook and codewords of z (B, d).

        ``initial_codebook`` (R, L, s) replaces the seeded init (warm start / oracle tests).
        """
        self._check_batch(z)
        b = z.shape[0]
        cfg = self.config
        points = self.group_points(z.detach().to(torch.float32))  # (r, b*q/r, s)
        result = batched_kmeans(
            points,
            cfg.L,
            iterations=cfg.iterations,
            seed=seed,
            init=cfg.init,
            max_points_per_centroid=cfg.max_points_per_centroid,
            coarse_fraction=cfg.coarse_fraction,
            initial_centroids=initial_codebook,
            threads=cfg.threads,
            backend=cfg.backend,
        )
        return self._code(result, b)

    def encode_many(self, batches: Sequence[Tensor], *, seeds: Sequence[int]) -> list[PQCode]:
        """``encode(batches[i], seed=seeds[i])`` for every i: a training step's client chunks.

        The same codes as one call each (to the bit on a CPU); on a GPU the chunks of equal
        size are clustered in one stacked k-means (``kmeans.batched_kmeans_many``), whose
        batched products may round differently from single ones, the same way every run.
        """
        self._check_batches(batches)
        cfg = self.config
        results = batched_kmeans_many(
            [self.group_points(z.detach().to(torch.float32)) for z in batches],
            cfg.L,
            seeds=seeds,
            iterations=cfg.iterations,
            init=cfg.init,
            max_points_per_centroid=cfg.max_points_per_centroid,
            coarse_fraction=cfg.coarse_fraction,
            threads=cfg.threads,
            backend=cfg.backend,
        )
        return [self._code(r, z.shape[0]) for r, z in zip(results, batches, strict=True)]

    def _code(self, result: KMeansResult, b: int) -> PQCode:
        """The code of b rows from their groups' k-means result."""
        cfg = self.config
        # assignments (r, b*q/r) -> (b, r, q/r) -> (b, q), position-major within each row
        codewords = (
            result.assignments.reshape(cfg.R, b, self.positions_per_group)
            .transpose(0, 1)
            .reshape(b, cfg.q)
        )
        return PQCode(codebook=result.centroids, codewords=codewords)

    def assign(self, z: Tensor, codebook: Tensor) -> PQCode:
        """Codewords of z (B, d) against a fixed ``codebook`` (R, L, s): each subvector's
        nearest centroid (the lowest index on a tie).

        Row-independent by construction: a row's codewords depend on that row and the codebook
        only, never on the other rows of the batch (distances are elementwise differences, not
        a batched matrix product whose rounding could depend on the batch's size). This is what
        serving with a codebook frozen at the end of training relies on.
        """
        self._check_batch(z)
        cfg = self.config
        expected = (cfg.R, cfg.L, self.sub_dim)
        if tuple(codebook.shape) != expected:
            raise ValueError(f"codebook shape {tuple(codebook.shape)} != {expected}")
        centroids = codebook.to(z.device, torch.float32)
        parts = []
        for block in torch.split(z.detach().to(torch.float32), _ASSIGN_ROWS):
            points = self.group_points(block)  # (r, b*q/r, s)
            distance = ((points[:, :, None, :] - centroids[:, None, :, :]) ** 2).sum(-1)
            nearest = distance.argmin(dim=2)  # (r, b*q/r)
            parts.append(
                nearest.reshape(cfg.R, block.shape[0], self.positions_per_group)
                .transpose(0, 1)
                .reshape(block.shape[0], cfg.q)
            )
        return PQCode(codebook=centroids, codewords=torch.cat(parts))

    def decode(self, code: PQCode) -> Tensor:
        """Rebuild Z~ (B, d) float32 from a codebook (R, L, s) and codewords (B, q), on the
        codebook's device."""
        cfg = self.config
        expected = (cfg.R, cfg.L, self.sub_dim)
        if tuple(code.codebook.shape) != expected:
            raise ValueError(f"codebook shape {tuple(code.codebook.shape)} != {expected}")
        if code.codewords.ndim != 2 or code.codewords.shape[1] != cfg.q:
            raise ValueError(f"codewords must be (B, {cfg.q}), got {tuple(code.codewords.shape)}")
        flat = code.codebook.reshape(cfg.R * cfg.L, self.sub_dim)
        if flat.device.type != "cpu":  # a gather where the codes are (a GPU): same values
            offset = self._codebook_offset.to(flat.device)
            rows = code.codewords.to(flat.device, torch.int64) + offset
            return flat[rows].reshape(-1, self.d)
        flat_codebook = flat.numpy()
        rows_np = (code.codewords.to(torch.int64) + self._codebook_offset).numpy()  # (b, q)
        # numpy's take: a fraction of torch's embedding's per-call cost at these sizes
        return torch.from_numpy(flat_codebook.take(rows_np, axis=0).reshape(-1, self.d))

    def quantize(self, z: Tensor, *, seed: int) -> tuple[PQCode, Tensor]:
        """Encode z and decode it again: returns the code and Z~ (B, d)."""
        code = self.encode(z, seed=seed)
        return code, self.decode(code)

    def _check_batch(self, z: Tensor) -> None:
        self._check_batches([z])

    def _check_batches(self, batches: Sequence[Tensor]) -> None:
        for z in batches:
            if z.ndim != 2 or z.shape[1] != self.d:
                raise ValueError(f"activations must be (B, {self.d}), got {tuple(z.shape)}")
            if z.shape[0] < 1:
                raise ValueError("cannot quantize an empty batch")
        # A finite sum proves every element finite (NaN and Inf propagate) in one pass (and,
        # on a GPU, one wait for all batches); only a sum that overflowed needs the
        # elementwise check.
        sums = [z.detach().sum() for z in batches]
        total = float(sums[0] if len(sums) == 1 else torch.stack(sums).sum())
        if not math.isfinite(total) and not all(bool(torch.isfinite(z).all()) for z in batches):
            raise ValueError("activations contain NaN or Inf; refusing to quantize")


def relative_error(z: Tensor, z_tilde: Tensor) -> float:
    """Quantization error ||Z - Z~||^2 / ||Z||^2 (dimensionless)."""
    num = float(((z - z_tilde) ** 2).sum())
    den = float((z**2).sum())
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))
