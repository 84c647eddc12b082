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

    ``categories``: the codes of each categorical column (party A's preparation,
    ``party_a.preparation``), whose code columns are the last ``len(categories)`` of x; code
    0 is "no bucket". A column of at most ``one_hot_max`` buckets is one-hot encoded (code 0:
    a zero row), a larger one embedded in min(``embedding_dim``, 1.6 n^0.56) dimensions
    (code 0: the zero padding row, never trained), so a column of a thousand buckets is a
    few thousand weights, not a thousand inputs. Without categories the network, its
    initialisation and its state dict are those of a numbers-only bottom.
    """

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int],
        cut_dim: int,
        categories: Sequence[int] = (),
        one_hot_max: int = 16,
        embedding_dim: int = 16,
    ) -> None:
        super().__init__()
        if len(categories) > in_features:
            raise ValueError(f"{len(categories)} categorical columns for {in_features} inputs")
        self.in_features = in_features
        self.cut_dim = cut_dim
        self.dense = in_features - len(categories)  # numbers and missing indicators
        self.categories = tuple(categories)
        self.one_hot = tuple(n - 1 <= one_hot_max for n in self.categories)
        widths = [
            n - 1 if hot else _embedding_width(n, embedding_dim)
            for n, hot in zip(self.categories, self.one_hot, strict=True)
        ]
        self.net = mlp([self.dense + sum(widths), *hidden, cut_dim], relu_last=True)
        # after the MLP, so that a numbers-only bottom draws the same initial weights
        self.embeddings = nn.ModuleList(
            nn.Embedding(n, w, padding_idx=0)
            for n, w, hot in zip(self.categories, widths, self.one_hot, strict=True)
            if not hot
        )

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(
                f"tabular_mlp expects x of shape (b, {self.in_features}), got {tuple(x.shape)}"
            )
        if not self.categories:
            h = x
        else:
            codes = x[:, self.dense :].long()  # (b, c): bucket codes carried as floats
            parts = [x[:, : self.dense]]
            embeddings = iter(self.embeddings)
            for j, (n, hot) in enumerate(zip(self.categories, self.one_hot, strict=True)):
                column = codes[:, j]  # (b,)
                if hot:  # (b, n - 1): code 0 matches no column
                    buckets = torch.arange(1, n, device=x.device)
                    parts.append((column.unsqueeze(1) == buckets).to(x.dtype))
                else:  # (b, width)
                    parts.append(next(embeddings)(column))
            h = torch.cat(parts, dim=1)
        z: Tensor = self.net(h)  # (b, cut_dim)
        return z


def _embedding_width(codes: int, largest: int) -> int:
    """Dimensions of a categorical column's embedding: fastai's rule of thumb, capped."""
    return max(1, min(largest, int(round(1.6 * (codes - 1) ** 0.56))))


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
