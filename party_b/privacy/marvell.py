"""Marvell (Li et al., "Label leakage and protection in two-party split learning", ICLR 2022,
Sec. 4): per-batch optimized Gaussian noise, one covariance per class, for binary labels.

Party B knows the batch's labels. It models each class's (rows, d) gradient rows as an
isotropic Gaussian: class c has mean m_c and per-coordinate variance (u for class 0, v for
class 1), and looks for the noise covariances Sigma_0, Sigma_1 that minimise the symmetrized
KL divergence between the two perturbed class distributions (the quantity Li et al. bound
every label attack's AUC with) under a noise-power budget::

    min  KL(N(m_1, vI + S_1) || N(m_0, uI + S_0)) + KL(N(m_0, uI + S_0) || N(m_1, vI + S_1))
    s.t. p tr(S_1) + (1 - p) tr(S_0) <= P,     P = s ||m_1 - m_0||^2

p being the batch's share of class 1 and s the policy's ``marvell`` budget (the paper's
"Marvell with s"). As in the paper, each S_c has two parameters: variance ``along[c]`` in the
direction of m_1 - m_0 and ``across[c]`` in each of the d - 1 orthogonal directions. Only
the class of smaller variance ever gets noise across (it pays to equalise the two classes'
spread, never to widen the larger), and for a fixed amount across, the rest of the budget
splits along between the classes by a convex one-dimensional problem whose optimum is in
closed form (the paper's). The amount across is found by a grid and a fixed-iteration golden
section, in float64: the same batch always gets the same covariances, so a recomputed step's
bytes do not change (bit-identical resume).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["MarvellCovariance", "marvell_noise", "solve_marvell", "sum_kl"]

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_ITERATIONS = 60  # golden-section steps: the bracket shrinks by 0.618^60 ~ 3e-13
_GRID = 16  # coarse grid of the outer search, before its golden section


@dataclass(frozen=True)
class MarvellCovariance:
    """The two classes' noise: variance ``along`` m_1 - m_0 and ``across`` it (per
    orthogonal direction), indexed by class (0, 1); ``sum_kl`` is the optimum's objective."""

    along: tuple[float, float]
    across: tuple[float, float]
    sum_kl: float


def sum_kl(u: float, v: float, d: int, g: float, cov: MarvellCovariance) -> float:
    """Symmetrized KL between N(m_1, vI + S_1) and N(m_0, uI + S_0); ``g`` = ||m_1 - m_0||^2."""
    a1, b1 = v + cov.along[1], u + cov.along[0]  # along the mean difference
    a2, b2 = v + cov.across[1], u + cov.across[0]  # each orthogonal direction
    across = (d - 1) * (a2 / b2 + b2 / a2) if d > 1 else 0.0
    return 0.5 * (across + (b1 + g) / a1 + (a1 + g) / b1) - d


def _golden_min(f: Callable[[float], float], lo: float, hi: float) -> float:
    """argmin of a unimodal ``f`` on [lo, hi] (the better end point if it is there)."""
    a, b = lo, hi
    c, e = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fe = f(c), f(e)
    for _ in range(_ITERATIONS):
        if fc <= fe:
            b, e, fe = e, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, e, fe
            e = a + _GOLDEN * (b - a)
            fe = f(e)
    candidates = [(f(lo), lo), (fc, c), (fe, e), (f(hi), hi)]
    return min(candidates)[1]


def solve_marvell(
    u: float, v: float, d: int, g: float, p: float, power: float
) -> MarvellCovariance:
    """The optimal two-parameter covariances (see the module docstring).

    ``u``, ``v``: per-coordinate gradient variance of class 0 and class 1; ``d``: the
    gradient's width; ``g``: ||m_1 - m_0||^2; ``p``: share of class 1 (0 < p < 1);
    ``power``: the budget P, in the gradient's squared units. Degenerate variances are
    floored at 1e-12 of the scale, where the KL would be infinite without noise.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"Marvell needs both classes in the batch: p = {p}")
    floor = 1e-12 * max(g, u, v, 1e-300)
    u, v = max(u, floor), max(v, floor)
    small = 0 if u <= v else 1  # the class with less spread: the only one noised across
    weight = (1.0 - p, p)  # the budget's weight of each class's trace
    gap = abs(v - u)

    def split_along(across: float) -> tuple[float, MarvellCovariance]:
        """The best split of what the budget leaves after ``across``: (objective, cov)."""
        left = max(power - weight[small] * (d - 1) * across, 0.0)
        across_c = (across, 0.0) if small == 0 else (0.0, across)
        # Along m_1 - m_0 the objective is convex on the budget's line; its stationary point
        # has (v + y) = e (u + x) with e below (Li et al.), clipped to the line's ends.
        total = left + p * v + (1.0 - p) * u
        e = math.sqrt((total + (1.0 - p) * g) / (total + p * g))
        x = (left / p + v - e * u) / (e + (1.0 - p) / p)
        x = min(max(x, 0.0), left / (1.0 - p))
        y = max((left - (1.0 - p) * x) / p, 0.0)
        cov = MarvellCovariance((x, y), across_c, 0.0)
        return sum_kl(u, v, d, g, cov), cov

    top = min(gap, power / (weight[small] * (d - 1))) if d > 1 else 0.0
    if top > 0.0:
        grid = [top * i / _GRID for i in range(_GRID + 1)]
        i = min(range(len(grid)), key=lambda j: split_along(grid[j])[0])
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, _GRID)]
        across = _golden_min(lambda a: split_along(a)[0], lo, hi)
    else:
        across = 0.0
    objective, cov = split_along(across)
    return MarvellCovariance(cov.along, cov.across, objective)


def marvell_noise(
    g: Tensor, labels: Tensor, budget: float, generator: torch.Generator
) -> tuple[Tensor, MarvellCovariance | None]:
    """(rows, d) float64 noise for the (rows, d) float64 gradient ``g`` of a binary batch
    (``labels`` (rows,) in {0, 1}) and its covariances; zero noise and None when the batch
    holds one class only (there is no class difference to hide, and no m_1 - m_0 to aim at).
    Draws one (rows, d) standard normal from ``generator`` when it noises."""
    positive = labels == 1
    n1 = int(positive.sum())
    if n1 == 0 or n1 == len(labels):
        return torch.zeros_like(g), None
    d = g.shape[1]
    g1, g0 = g[positive], g[~positive]
    m1, m0 = g1.mean(dim=0), g0.mean(dim=0)
    u = float((g0 - m0).pow(2).mean())  # mean over rows and coordinates: per-coordinate var
    v = float((g1 - m1).pow(2).mean())
    diff = m1 - m0
    gap2 = float(diff.pow(2).sum())
    if gap2 == 0.0:
        return torch.zeros_like(g), None
    p = n1 / len(labels)
    cov = solve_marvell(u, v, d, gap2, p, budget * gap2)
    unit = diff / math.sqrt(gap2)
    # per row: sqrt(across) * xi + (sqrt(along) - sqrt(across)) (unit . xi) unit, xi ~ N(0, I)
    xi = torch.randn(g.shape, generator=generator, dtype=torch.float64)
    cls = positive.long()
    across = torch.tensor(cov.across, dtype=torch.float64).sqrt()[cls]
    along = torch.tensor(cov.along, dtype=torch.float64).sqrt()[cls]
    noise = across[:, None] * xi + ((along - across) * (xi @ unit))[:, None] * unit[None, :]
    return noise, cov
