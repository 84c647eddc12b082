"""Building blocks every split model shares: seeded construction and dropout, the top-model
base class that checks what arrives from the wire, Haiku's initialisation, MLP stacks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor, nn

from shared.types import Task

__all__ = [
    "KwargValue",
    "SeededDropout",
    "SequentialTop",
    "Task",
    "TopModel",
    "build_seeded",
    "haiku_init_",
    "mlp",
    "seed_dropout",
]

"""The loss party B applies to the top's logits.

- ``classification``: cross-entropy, logits (n, classes), integer targets (n,)
- ``multilabel``: BCE-with-logits, logits (n, tags), 0/1 targets (n, tags)
- ``sequence``: cross-entropy per token, logits (b*t, vocab), targets (b*t,); the caller masks
  pad / OOV tokens
"""

KwargValue = int | list[int]
M = TypeVar("M", bound=nn.Module)

# Initialisation draws from torch's process-wide RNG, so seeding it and building a model must be
# one atomic act: two threads building at once (party B serving several runs, a party A process
# with several sessions, both parties in one experiment process) would interleave their draws
# and get weights that depend on timing. One lock for the whole process, shared by both parties.
_INIT_LOCK = threading.Lock()


def build_seeded(build: Callable[[], M], seed: int) -> M:
    """``build()`` with torch's global RNG seeded to ``seed``, atomically across threads.

    The caller's RNG state is restored afterwards (``fork_rng``), so building a model never
    disturbs anyone else's random stream.
    """
    with _INIT_LOCK, torch.random.fork_rng():
        torch.manual_seed(seed)
        return build()


# ---------------------------------------------------------------------------------------------
# Top base class: one place that checks what arrives from the wire
# ---------------------------------------------------------------------------------------------


class SeededDropout(nn.Module):
    """Dropout that draws its mask from a per-module generator when one is set.

    torch's global RNG is shared by every thread of a process, so a server training several
    runs at once cannot make nn.Dropout reproducible. A trainer calls :func:`seed_dropout`
    before each step with a seed derived from (run seed, step): a replayed or resumed step
    then draws the identical mask. Without a generator it behaves exactly like nn.Dropout.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.generator: torch.Generator | None = None

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.generator is None:
            return nn.functional.dropout(x, self.p, training=True)
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=self.generator)
        return x * keep / (1.0 - self.p)


def seed_dropout(module: nn.Module, seed: int) -> None:
    """Give every SeededDropout inside ``module`` its own generator, derived from ``seed``, on
    the module's device (a CUDA generator draws other masks than a CPU one from one seed:
    the same run on another device type is another run, as its float rounding already makes
    it)."""
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    for index, child in enumerate(m for m in module.modules() if isinstance(m, SeededDropout)):
        child.generator = torch.Generator(device).manual_seed((seed + index) % (1 << 63))


class TopModel(nn.Module):
    """Base of every top model: validates (z̃, side) and returns logits.

    Subclasses implement ``logits(z, side)``; ``forward`` checks shapes first so a badly shaped
    z̃ from the wire fails with a ValueError that names both shapes, not a matmul error.
    """

    def __init__(self, cut_dim: int, side_features: int = 0) -> None:
        super().__init__()
        self.cut_dim = cut_dim  # d: width of each row of z̃
        self.side_features = side_features  # columns of party B's own features, 0 = none

    def forward(self, z: Tensor, side: Tensor | None = None) -> Tensor:
        """z: (n, cut_dim) float; side: (n, side_features) float or None → logits (n, out)."""
        if z.dim() != 2 or z.shape[1] != self.cut_dim:
            raise ValueError(f"top expects z of shape (n, {self.cut_dim}), got {tuple(z.shape)}")
        if self.side_features == 0 and side is not None:
            raise ValueError(
                f"this top takes no side features (side_features=0) but got side of shape "
                f"{tuple(side.shape)}"
            )
        if self.side_features > 0:
            if side is None:
                raise ValueError(
                    f"this top needs side features of shape (n, {self.side_features}), got None"
                )
            if side.dim() != 2 or side.shape != (z.shape[0], self.side_features):
                raise ValueError(
                    f"side must have shape ({z.shape[0]}, {self.side_features}) to match z of "
                    f"shape {tuple(z.shape)}, got {tuple(side.shape)}"
                )
        return self.logits(z, side)

    def logits(self, z: Tensor, side: Tensor | None) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class SequentialTop(TopModel):
    """A top that is one nn.Sequential over z̃ (no side features)."""

    def __init__(self, cut_dim: int, net: nn.Sequential) -> None:
        super().__init__(cut_dim)
        self.net = net

    def logits(self, z: Tensor, side: Tensor | None) -> Tensor:
        out: Tensor = self.net(z)
        return out


def haiku_init_(module: M) -> M:
    """Initialise every Conv2d / Linear inside ``module`` as Haiku does by default, in place.

    Haiku's ``Conv2D`` and ``Linear`` draw weights from a normal with stddev 1/sqrt(fan_in)
    truncated at two standard deviations (``jax.random.truncated_normal(-2, 2) * stddev``: the
    stddev is the untruncated one, exactly torch's ``trunc_normal_``) and start biases at 0.
    fan_in is in_channels * kh * kw for a convolution, in_features for a dense layer. The
    paper's models are Haiku's (FedJAX); torch's defaults (uniform, ~1/sqrt(3) of that scale,
    non-zero biases) leave the FEMNIST CNN on a long initial loss plateau.
    """
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            fan_in = layer.weight[0].numel()
            std = fan_in**-0.5
            nn.init.trunc_normal_(layer.weight, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return module


def mlp(widths: Sequence[int], *, relu_last: bool) -> nn.Sequential:
    """Linear layers through ``widths`` with ReLU between them (and after the last if asked)."""
    layers: list[nn.Module] = []
    for i, (w_in, w_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        layers.append(nn.Linear(w_in, w_out))
        if relu_last or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
