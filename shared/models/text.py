"""The language models of the paper's appendix: so_tag (bag of words -> tags, one dense layer a
side) and next_token_lstm (Embedding-LSTM-tanh-Dense on party A, Dense(vocab) on party B),
initialised as the paper's Haiku models are (docs/AUDIT.md)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from shared.models.layers import haiku_init_

__all__ = ["NextTokenBottom", "SoTagBottom", "haiku_lstm_init_"]


def haiku_lstm_init_(lstm: nn.LSTM) -> nn.LSTM:
    """Make a one-layer ``nn.LSTM`` start and train like Haiku's ``hk.LSTM``, in place.

    hk.LSTM is one ``hk.Linear(4 * hidden)`` over concat(x, h): weights truncated normal with
    stddev 1/sqrt(in + hidden) (the fan-in of that joint matrix, shared by torch's weight_ih
    and weight_hh), one zero bias, and a constant +1 on the forget gate. Here bias_ih holds
    that bias, starting at 1 on the forget gate (torch's gate order is i, f, g, o), and
    bias_hh is frozen at 0, so the LSTM has Haiku's one trainable bias per gate: with two, the
    optimizer would move the effective bias twice as fast.
    """
    if lstm.num_layers != 1 or lstm.bidirectional or not lstm.bias:
        raise ValueError("haiku_lstm_init_ takes a one-layer, one-way LSTM with biases")
    hidden = lstm.hidden_size
    std = (lstm.input_size + hidden) ** -0.5
    for name in ("weight_ih_l0", "weight_hh_l0"):
        weight = lstm.get_parameter(name)
        nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)
    bias, second = lstm.get_parameter("bias_ih_l0"), lstm.get_parameter("bias_hh_l0")
    with torch.no_grad():
        bias.zero_()
        bias[hidden : 2 * hidden] = 1.0  # the forget gate's +1
        second.zero_()
    second.requires_grad_(False)
    return lstm


class SoTagBottom(nn.Module):
    """(b, vocab_size) float bag of words → (b, cut_dim); one Linear, no activation, Haiku's
    init (truncated normal, stddev 1/sqrt(vocab_size), zero bias)."""

    def __init__(self, vocab_size: int, cut_dim: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.cut_dim = cut_dim
        self.dense = nn.Linear(vocab_size, cut_dim)
        haiku_init_(self)

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

    FedJAX's ``create_lstm_model`` (the paper's): Embed(vocab, 96) -> hk.LSTM(670) -> tanh ->
    Linear(96), the cut after that Linear. Haiku's init: embeddings truncated normal with
    stddev 1, the LSTM as ``haiku_lstm_init_``, the Linear truncated normal 1/sqrt(670) with a
    zero bias. 3,080,360 trainable parameters at the paper's sizes (one bias per gate, as
    Haiku and Keras have; torch's second LSTM bias is kept frozen at 0). The appendix prints
    3,680,360, which matches no layer sizes; 3,080,360 is the Haiku / Keras total.
    """

    def __init__(self, vocab_size: int, embed_dim: int, hidden: int, cut_dim: int) -> None:
        super().__init__()
        self.cut_dim = cut_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, batch_first=True)
        self.dense = nn.Linear(hidden, cut_dim)
        nn.init.trunc_normal_(self.embedding.weight, mean=0.0, std=1.0, a=-2.0, b=2.0)
        haiku_lstm_init_(self.lstm)
        haiku_init_(self.dense)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"next_token_lstm expects (b, t) integer tokens, got {tuple(x.shape)} {x.dtype}"
            )
        e = self.embedding(x)  # (b, t, embed_dim)
        h, _ = self.lstm(e)  # (b, t, hidden)
        # FedJAX puts a tanh between the LSTM and the projection (its DeepRNN is
        # [LSTM, tanh, Linear]); h = o * tanh(c) is already in (-1, 1), tanh squashes it again.
        z: Tensor = self.dense(torch.tanh(h))  # (b, t, cut_dim)
        return z.reshape(-1, self.cut_dim)  # (b*t, cut_dim)
