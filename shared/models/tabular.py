"""tabular_mlp: a vertical split on tabular data; party B may add its own columns at the cut."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from shared.models.layers import TopModel, mlp

__all__ = ["TabularBottom", "TabularTop"]


class TabularBottom(nn.Module):
    """(b, in_features) float → (b, cut_dim), ReLU after every layer.

    The ReLU at the cut makes z a true hidden layer; without it the bottom's last Linear and
    the top's first Linear would compose into one linear map.
    """

    def __init__(self, in_features: int, hidden: Sequence[int], cut_dim: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.cut_dim = cut_dim
        self.net = mlp([in_features, *hidden, cut_dim], relu_last=True)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(
                f"tabular_mlp expects x of shape (b, {self.in_features}), got {tuple(x.shape)}"
            )
        z: Tensor = self.net(x)  # (b, cut_dim)
        return z


class TabularTop(TopModel):
    """concat(z̃ (b, cut_dim), side (b, side_features)) → hidden → (b, num_classes)."""

    def __init__(
        self, cut_dim: int, hidden: Sequence[int], num_classes: int, side_features: int
    ) -> None:
        super().__init__(cut_dim, side_features)
        self.net = mlp([cut_dim + side_features, *hidden, num_classes], relu_last=False)

    def logits(self, z: Tensor, side: Tensor | None) -> Tensor:
        h = z if side is None else torch.cat([z, side], dim=1)  # (b, cut_dim + side_features)
        out: Tensor = self.net(h)  # (b, num_classes)
        return out
