"""Gradient correction of FedLite (Wang et al., section 3.2, eq. q_grad).

Party B can only differentiate its loss at the quantized activations z~, so party A receives
dh/dz~ instead of the dh/dz it needs. A first-order Taylor expansion of dh/dz around z~ with the
Hessian replaced by lambda*I gives the corrected gradient

    g = dh/dz~ + lambda * (z - z~)

which party A back-propagates through its bottom model. It is exactly the gradient of the
surrogate loss ||z - z_hat||^2 + lambda/2 ||z - z~||^2 with z_hat = z - dh/dz~ / 2 and z~
held fixed (paper, Appendix A). lambda = 0 is the plain straight-through gradient.
"""

import torch
from torch import Tensor

__all__ = ["correct_gradient"]


def correct_gradient(
    grad_z_tilde: Tensor,
    z: Tensor,
    z_tilde: Tensor,
    lam: float,
    *,
    sample_weight: float = 1.0,
) -> Tensor:
    """The corrected gradient with respect to the bottom model's output z.

    Args:
        grad_z_tilde: (B, d) gradient of party B's loss with respect to z~.
        z: (B, d) the activations the bottom model produced (only its values are used).
        z_tilde: (B, d) the dequantized activations party B saw.
        lam: lambda >= 0, the correction strength (paper: 1e-5 ... 5e-4 on FEMNIST).
        sample_weight: the weight party B's loss gives each sample. The paper's formula is per
            sample; when the loss is a mean over N samples, dh/dz~ already carries 1/N, so the
            correction must be scaled by the same 1/N to stay the gradient of the mean of the
            per-sample surrogate losses. Pass 1.0 for a per-sample or summed loss.

    Returns:
        (B, d) tensor g = grad_z_tilde + lam * sample_weight * (z - z_tilde), no autograd history.
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
        return torch.add(grad_z_tilde, z.detach() - z_tilde.detach(), alpha=lam * sample_weight)
