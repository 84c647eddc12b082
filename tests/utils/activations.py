"""Activation-like test data: real images through the paper's FEMNIST bottom model."""

import functools

import numpy as np
import torch
from sklearn.datasets import load_digits

from shared.models import build_bottom


@functools.cache
def _digit_images() -> np.ndarray:
    """scikit-learn's bundled 8x8 digits, upsampled to 28x28 in [0, 1]: (1797, 1, 28, 28)."""
    images = load_digits().images.astype(np.float32) / 16.0  # (n, 8, 8)
    t = torch.from_numpy(images).unsqueeze(1)
    return torch.nn.functional.interpolate(t, size=(28, 28), mode="bilinear").numpy()


def femnist_activations(batch: int = 20, seed: int = 0) -> torch.Tensor:
    """Cut-layer activations of the FEMNIST CNN bottom on real digit images: (batch, 9216)."""
    torch.manual_seed(seed)
    bottom = build_bottom("femnist_cnn").eval()
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(_digit_images()), size=batch, replace=False)
    with torch.no_grad():
        return bottom(torch.from_numpy(_digit_images()[idx]))
