"""The language models of the paper's appendix: so_tag (bag of words -> tags, one dense layer a
side) and next_token_lstm (Embedding-LSTM-Dense on party A, Dense(vocab) on party B)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["NextTokenBottom", "SoTagBottom"]


class SoTagBottom(nn.Module):
    """(b, vocab_size) float bag of words → (b, cut_dim); one Linear, no activation."""

    def __init__(self, vocab_size: int, cut_dim: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.cut_dim = cut_dim
        self.dense = nn.Linear(vocab_size, cut_dim)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.vocab_size:
            raise ValueError(
                f"so_tag expects x of shape (b, {self.vocab_size}), got {tuple(x.shape)}"
            )
        z: Tensor = self.dense(x)  # (b, cut_dim)
        return z


class NextTokenBottom(nn.Module):
    """(b, t) int64 tokens → (b*t, cut_dim): one row per token, so the quantizer sees b*t rows.

    Rows are in row-major (batch, time) order: row i*t + j is token j of sequence i, the same
    order as ``targets.reshape(-1)`` for targets of shape (b, t).

    3,083,040 parameters at the paper's sizes. Keras's LSTM has one bias vector per gate where
    torch's has two, so the Keras count is 4 * 670 = 2,680 lower: 3,080,360. (The appendix
    prints 3,680,360, which matches no layer sizes; 3,080,360 is the Keras total.)
    """

    def __init__(self, vocab_size: int, embed_dim: int, hidden: int, cut_dim: int) -> None:
        super().__init__()
        self.cut_dim = cut_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, batch_first=True)
        self.dense = nn.Linear(hidden, cut_dim)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"next_token_lstm expects (b, t) integer tokens, got {tuple(x.shape)} {x.dtype}"
            )
        e = self.embedding(x)  # (b, t, embed_dim)
        h, _ = self.lstm(e)  # (b, t, hidden)
        z: Tensor = self.dense(h)  # (b, t, cut_dim)
        return z.reshape(-1, self.cut_dim)  # (b*t, cut_dim)
