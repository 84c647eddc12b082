"""femnist_cnn: the CNN of Reddi et al. (2020) as FedJAX builds it, split after Flatten
(paper appendix, FEMNIST): Conv-Conv-MaxPool-Dropout-Flatten | Dense-Dropout-Dense."""

from __future__ import annotations

from torch import Tensor, nn

from shared.models.layers import SeededDropout, SequentialTop, TopModel, haiku_init_

__all__ = ["FEMNIST_CUT_DIM", "FemnistBottom", "femnist_cut_dim", "femnist_top"]

FEMNIST_CUT_DIM = 12 * 12 * 64  # 9216: 28 → 26 → 24 (two 3x3 convs) → 12 (2x2 pool), 64 channels


def femnist_cut_dim(width: int = 28) -> int:
    """d of the bottom on images ``width`` columns wide: 64 channels x 12 x (width - 4) // 2
    (two 3x3 convolutions, a 2x2 pool): 9216 for whole images, 3840 for half images."""
    return 64 * 12 * ((width - 4) // 2)


class FemnistBottom(nn.Module):
    """(b, 1, 28, 28) or (b, 784) float images → (b, 9216). 18,816 parameters.

    ``width`` < 28: the images' first or last ``width`` columns only, (b, 1, 28, width) or
    (b, 28 * width) row-major, e.g. 14 for the left or right half of each image held by one
    of two feature parties (docs/PROTOCOL.md section 12) → (b, femnist_cut_dim(width)).

    The cut layer is flattened channels-last, (h, w, c), as Haiku's NHWC convolutions lay it
    out in the paper's FedJAX model: a subvector of d/q consecutive values is then channels of
    one pixel (q = 1152: 8 of the 64 channels at one pooled pixel). Flattening torch's
    NCHW order instead makes a subvector d/q horizontally adjacent pixels of one channel, which
    product quantization compresses far worse (docs/RESULTS.md measures it).
    """

    def __init__(self, width: int = 28) -> None:
        super().__init__()
        if not 6 <= width <= 28:
            raise ValueError(f"femnist_cnn: width={width} must be 6..28 image columns")
        self.width = width
        self.cut_dim = femnist_cut_dim(width)
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3),  # (b, 32, 26, 26)
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3),  # (b, 64, 24, 24)
            nn.ReLU(),
            nn.MaxPool2d(2),  # (b, 64, 12, 12)
            SeededDropout(0.25),
        )
        haiku_init_(self)

    def forward(self, x: Tensor) -> Tensor:
        w = self.width
        if x.dim() == 2 and x.shape[1] == 28 * w:
            x = x.reshape(-1, 1, 28, w)
        if x.dim() != 4 or tuple(x.shape[1:]) != (1, 28, w):
            raise ValueError(
                f"femnist_cnn expects (b, 1, 28, {w}) or (b, {28 * w}), got {tuple(x.shape)}"
            )
        h: Tensor = self.features(x)  # (b, 64, 12, (w - 4) // 2)
        return h.permute(0, 2, 3, 1).flatten(1)  # (b, cut_dim), channels last


def femnist_top(cut_dim: int, num_classes: int) -> TopModel:
    """(b, 9216) → (b, num_classes). 1,187,774 parameters at 62 classes, Haiku's init."""
    net = nn.Sequential(
        nn.Linear(cut_dim, 128),  # (b, 128)
        nn.ReLU(),
        SeededDropout(0.5),
        nn.Linear(128, num_classes),  # (b, num_classes)
    )
    return SequentialTop(cut_dim, haiku_init_(net))
