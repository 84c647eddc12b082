"""The defences of a ``PrivacyPolicy``, each a pure function of its inputs and a seed.

Nothing here draws from a global random state: the gradient noise of step t comes from
``step_seed(run seed, t, "privacy")`` and a row's randomized label from (seed, row key),
so a step recomputed after a rollback or a restart gets the same bytes (bit-identical resume)
and the same row keeps the same randomized label in every epoch (which is what makes the
randomized response eps-label-DP over the whole run, not once per epoch).
"""

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from party_b.privacy.marvell import marvell_noise
from party_b.privacy.policy import PrivacyPolicy

__all__ = ["perturb_gradient", "randomized_labels", "row_uniforms", "visible_metrics"]

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: Any) -> Any:
    """SplitMix64's finaliser on uint64 (wrapping arithmetic): a fixed, well-mixed hash."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return x ^ (x >> np.uint64(31))


def row_uniforms(seed: int, rows: np.ndarray, stream: int) -> np.ndarray:
    """(n,) float64 in [0, 1): one fixed draw per (seed, row key, stream); a row key is the
    sample's id code under its table's label draw (``draws.id_codes``), or its row in the
    label source for a run that draws its own labels."""
    key = _splitmix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) ^ np.uint64(stream * 0x5851F42D))
    h = _splitmix64(rows.astype(np.uint64) ^ key)
    uniforms: np.ndarray = (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return uniforms


def randomized_labels(
    targets: Tensor, rows: np.ndarray, *, epsilon: float, num_classes: int, seed: int
) -> Tensor:
    """Randomized response on class labels (n,) int64: each label stays with probability
    e^eps / (e^eps + C - 1), otherwise becomes one of the C - 1 other classes uniformly.
    ``rows`` (n,): the samples' row keys (``row_uniforms``), which fix their draws."""
    keep_p = math.exp(epsilon) / (math.exp(epsilon) + num_classes - 1)
    keep = row_uniforms(seed, rows, 1) < keep_p
    # another class: shift by 1..C-1, uniformly
    shift = 1 + np.floor(row_uniforms(seed, rows, 2) * (num_classes - 1)).astype(np.int64)
    y = targets.numpy()
    flipped = np.where(keep, y, (y + shift) % num_classes)
    return torch.from_numpy(flipped.astype(np.int64))


def perturb_gradient(
    grad: Tensor, policy: PrivacyPolicy, *, seed: int, labels: Tensor | None = None
) -> Tensor:
    """(rows, d) float32 gradient -> the one party A gets: max-norm alignment, isotropic noise
    of ``policy.noise`` and noise along the top principal directions of ``policy.directional``
    times the batch's largest row norm, then Marvell's class-wise noise of budget
    ``policy.marvell``, which needs the rows' binary ``labels`` (rows,) (see
    ``PrivacyPolicy``). All noise is drawn from one generator seeded with ``seed``, in a fixed
    order (new defences draw last, so the older ones' draws do not move)."""
    if not policy.perturbs_gradient or grad.numel() == 0:
        return grad
    if policy.marvell > 0 and labels is None:
        raise ValueError("marvell noise needs the batch's labels")
    generator = torch.Generator().manual_seed(seed & 0x7FFFFFFFFFFFFFFF)
    g = grad.detach().to(torch.float64)
    d = g.shape[1]
    norms = g.norm(dim=1)
    largest = float(norms.max())
    sigma = torch.zeros_like(norms)
    if policy.max_norm:
        # Li et al.: E||g_i + n_i||^2 = ||g_i||^2 + d sigma_i^2 = max_j ||g_j||^2
        sigma = ((largest**2 - norms**2).clamp(min=0.0) / d).sqrt()
    if policy.noise > 0:
        sigma = (sigma**2 + (policy.noise * largest) ** 2 / d).sqrt()
    noise = torch.randn(g.shape, generator=generator, dtype=torch.float64)
    out = g + noise * sigma[:, None]
    if policy.directional > 0:
        out += _principal_noise(g, policy, largest, generator)
    if policy.marvell > 0:
        assert labels is not None
        out += marvell_noise(g, labels, policy.marvell, generator)[0]
    if policy.centred and g.shape[0] > 1:
        noise_sum = out - g
        out = g + (noise_sum - noise_sum.mean(dim=0, keepdim=True))
    return out.to(grad.dtype)


def _principal_noise(
    g: Tensor, policy: PrivacyPolicy, largest: float, generator: torch.Generator
) -> Tensor:
    """(rows, d) noise along the top ``policy.directions`` right singular vectors of ``g``,
    each direction's coefficient N(0, (directional * largest)^2) per row."""
    k = min(policy.directions, *g.shape)
    _, _, vh = torch.linalg.svd(g, full_matrices=False)
    v = vh[:k]  # (k, d); a singular vector's sign is arbitrary: fix it so the bytes are too
    signs = torch.sign(v.gather(1, v.abs().argmax(dim=1, keepdim=True)))
    v = v * torch.where(signs == 0, 1.0, signs)
    coefficients = torch.randn((g.shape[0], k), generator=generator, dtype=torch.float64)
    noise: Tensor = (coefficients * policy.directional * largest) @ v
    return noise


def visible_metrics(
    loss: float, metrics: dict[str, float], policy: PrivacyPolicy
) -> tuple[float, dict[str, float]]:
    """The loss and metrics a step reply may carry: all, the loss only, or neither (the loss
    goes as NaN; "n", the sample count party A already knows, always goes)."""
    if policy.metrics == "all":
        return loss, metrics
    kept = {k: v for k, v in metrics.items() if k == "n"}
    return (loss if policy.metrics == "loss" else float("nan")), kept
