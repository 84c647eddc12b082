"""Gradient correction of FedLite (Wang et al., section 3.2, eq. q_grad).

Party B can only differentiate its loss at the quantized activations z~, so party A receives
dh/dz~ instead of the dh/dz it needs. A first-order Taylor expansion of dh/dz around z~ with the
Hessian replaced by lambda*I gives the corrected gradient

    g = dh/dz~ + lambda * (z - z~)

which party A back-propagates through its bottom model. It is exactly the gradient of the
surrogate loss ||z - z_hat||^2 + lambda/2 ||z - z~||^2 with z_hat = z - dh/dz~ / 2 and z~
held fixed (paper, Appendix A). lambda = 0 is the plain straight-through gradient.

The lambda convention (the paper's units): h is one client's *batch-mean* loss, and a client
is one quantized chunk of the step (one codebook). Party B's loss is the mean over all n rows
of the step, so the gradient it returns for a row of chunk c (n_c rows) is n_c / n times that
client's dh/dz~; the correction is scaled by the same n_c / n. A vertical run has one chunk,
so there g = dL/dz~ + lambda * (z - z~) exactly as the paper writes it, with L the step's mean
loss; a FEMNIST step of 10 clients x 20 rows weights each client's correction by 1/10.
"""

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["chunk_weights", "correct_gradient"]


def chunk_weights(chunk_rows: Sequence[int]) -> Tensor:
    """(n, 1) float32: n_c / n for every row of chunk c, chunks in order (n = sum of rows)."""
    if not chunk_rows or any(int(r) < 1 for r in chunk_rows):
        raise ValueError(f"chunk rows must be positive, got {list(chunk_rows)}")
    n = sum(int(r) for r in chunk_rows)
    weights = torch.tensor([int(r) / n for r in chunk_rows], dtype=torch.float32)
    return weights.repeat_interleave(torch.tensor([int(r) for r in chunk_rows]))[:, None]


def correct_gradient(
    grad_z_tilde: Tensor,
    z: Tensor,
    z_tilde: Tensor,
    lam: float,
    *,
    chunk_rows: Sequence[int] | None = None,
) -> Tensor:
    """The corrected gradient with respect to the bottom model's output z.

    Args:
        grad_z_tilde: (n, d) gradient of party B's step loss (a mean over n rows) w.r.t. z~.
        z: (n, d) the activations the bottom model produced (only its values are used).
        z_tilde: (n, d) the dequantized activations party B saw.
        lam: lambda >= 0 in the paper's units (per client batch-mean; FEMNIST: 1e-5 to 5e-4).
        chunk_rows: rows of each chunk (client batch) of the step, in order; None = one chunk.

    Returns:
        (n, d) tensor g = grad_z_tilde + lam * (n_c / n) * (z - z_tilde), no autograd history.
    """
    if lam < 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    if not grad_z_tilde.shape == z.shape == z_tilde.shape:
        raise ValueError(
            "shape mismatch: grad "
            f"{tuple(grad_z_tilde.shape)}, z {tuple(z.shape)}, z~ {tuple(z_tilde.shape)}"
        )
    with torch.no_grad():
        if lam == 0:
            return grad_z_tilde.detach().clone()
        gap = z.detach() - z_tilde.detach()  # (n, d)
        if chunk_rows is None or len(chunk_rows) == 1:
            return torch.add(grad_z_tilde, gap, alpha=lam)
        weights = chunk_weights(chunk_rows)  # (n, 1)
        if weights.shape[0] != gap.shape[0]:
            raise ValueError(f"chunk rows {list(chunk_rows)} do not add up to {gap.shape[0]} rows")
        return grad_z_tilde + lam * weights.to(gap.device, gap.dtype) * gap
