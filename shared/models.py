"""Bottom / top model pairs of the split network, selectable by name.

Party A builds only the bottom, party B only the top; the two never see each other's weights.

    party A:  z = bottom(x)                      # (n, d), the cut-layer activations
    party B:  logits = top(z̃, side)              # z̃ = dequantized z, side = B's own columns

Every bottom returns a flat (n, d) matrix because the quantizer works on rows of length d.
For the sequence model n = batch * seq_len: each token's activation is one row.

Registered pairs (defaults are the paper appendix's sizes, except ``tabular_mlp``):

- ``femnist_cnn`` (classification): Conv-Conv-MaxPool-Dropout-Flatten | Dense-Dropout-Dense
- ``tabular_mlp`` (classification): MLP to the cut | MLP over [z̃, party B's side columns]
- ``so_tag`` (multilabel): Dense(vocab → d) | Dense(d → tags)
- ``next_token_lstm`` (sequence): Embedding-LSTM-Dense, one row per token | Dense(d → vocab)

Kwargs are plain JSON values (ints, lists of ints) since party B reads them from a run config.
``build_bottom`` and ``cut_dim`` take the bottom's kwargs, ``build_top`` the top's kwargs plus
the ``cut_dim`` it receives from party A.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn

__all__ = [
    "MODEL_NAMES",
    "SeededDropout",
    "Task",
    "TopModel",
    "build_bottom",
    "build_seeded",
    "build_top",
    "haiku_init_",
    "bottom_kwargs",
    "cut_dim",
    "input_width_kwarg",
    "output_kwarg",
    "seed_dropout",
    "takes_tokens",
    "task",
    "top_kwargs",
]

Task = Literal["classification", "multilabel", "sequence"]
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
    """Give every SeededDropout inside ``module`` its own generator, derived from ``seed``."""
    for index, child in enumerate(m for m in module.modules() if isinstance(m, SeededDropout)):
        child.generator = torch.Generator().manual_seed((seed + index) % (1 << 63))


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


class _SequentialTop(TopModel):
    """A top that is one nn.Sequential over z̃ (no side features)."""

    def __init__(self, cut_dim: int, net: nn.Sequential) -> None:
        super().__init__(cut_dim)
        self.net = net

    def logits(self, z: Tensor, side: Tensor | None) -> Tensor:
        out: Tensor = self.net(z)
        return out


# ---------------------------------------------------------------------------------------------
# femnist_cnn: the CNN of Reddi et al. (2020) split after Flatten (paper appendix, FEMNIST)
# ---------------------------------------------------------------------------------------------

FEMNIST_CUT_DIM = 12 * 12 * 64  # 9216: 28 → 26 → 24 (two 3x3 convs) → 12 (2x2 pool), 64 channels


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


class FemnistBottom(nn.Module):
    """(b, 1, 28, 28) or (b, 784) float images → (b, 9216). 18,816 parameters.

    The cut layer is flattened channels-last, (h, w, c), as Haiku's NHWC convolutions lay it
    out in the paper's FedJAX model: a subvector of d/q consecutive values is then channels of
    one pixel (q = 1152: 8 of the 64 channels at one pooled pixel). Flattening torch's
    NCHW order instead makes a subvector d/q horizontally adjacent pixels of one channel, which
    product quantization compresses far worse (docs/RESULTS.md measures it).
    """

    def __init__(self) -> None:
        super().__init__()
        self.cut_dim = FEMNIST_CUT_DIM
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
        if x.dim() == 2 and x.shape[1] == 28 * 28:
            x = x.reshape(-1, 1, 28, 28)
        if x.dim() != 4 or tuple(x.shape[1:]) != (1, 28, 28):
            raise ValueError(
                f"femnist_cnn expects (b, 1, 28, 28) or (b, 784), got {tuple(x.shape)}"
            )
        h: Tensor = self.features(x)  # (b, 64, 12, 12)
        return h.permute(0, 2, 3, 1).flatten(1)  # (b, 12 * 12 * 64), channels last


def _femnist_top(cut_dim: int, num_classes: int) -> TopModel:
    """(b, 9216) → (b, num_classes). 1,187,774 parameters at 62 classes, Haiku's init."""
    net = nn.Sequential(
        nn.Linear(cut_dim, 128),  # (b, 128)
        nn.ReLU(),
        SeededDropout(0.5),
        nn.Linear(128, num_classes),  # (b, num_classes)
    )
    return _SequentialTop(cut_dim, haiku_init_(net))


# ---------------------------------------------------------------------------------------------
# tabular_mlp: vertical split on tabular data; party B may add its own columns at the cut
# ---------------------------------------------------------------------------------------------


def _mlp(widths: Sequence[int], *, relu_last: bool) -> nn.Sequential:
    """Linear layers through ``widths`` with ReLU between them (and after the last if asked)."""
    layers: list[nn.Module] = []
    for i, (w_in, w_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        layers.append(nn.Linear(w_in, w_out))
        if relu_last or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class TabularBottom(nn.Module):
    """(b, in_features) float → (b, cut_dim), ReLU after every layer.

    The ReLU at the cut makes z a true hidden layer; without it the bottom's last Linear and
    the top's first Linear would compose into one linear map.
    """

    def __init__(self, in_features: int, hidden: Sequence[int], cut_dim: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.cut_dim = cut_dim
        self.net = _mlp([in_features, *hidden, cut_dim], relu_last=True)

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
        self.net = _mlp([cut_dim + side_features, *hidden, num_classes], relu_last=False)

    def logits(self, z: Tensor, side: Tensor | None) -> Tensor:
        h = z if side is None else torch.cat([z, side], dim=1)  # (b, cut_dim + side_features)
        out: Tensor = self.net(h)  # (b, num_classes)
        return out


# ---------------------------------------------------------------------------------------------
# so_tag: bag of words → tags, one dense layer on each side (paper appendix, SO Tag)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# next_token_lstm: Embedding-LSTM-Dense on A, Dense(vocab) on B (paper appendix, SO NWP)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Registry: adding a model is one entry in _SPECS. Both parties, party B's service and the
# experiments know models only through the lookup functions below.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    task: Task
    bottom_defaults: Mapping[str, KwargValue]  # every kwarg build_bottom / cut_dim accept
    top_defaults: Mapping[str, KwargValue]  # every kwarg build_top accepts (besides cut_dim)
    make_bottom: Callable[..., nn.Module]  # (**bottom kwargs) -> bottom
    make_top: Callable[..., TopModel]  # (cut_dim, **top kwargs) -> top
    cut_dim: Callable[..., int]  # (**bottom kwargs) -> d
    # what the parties fill in from their own data, and how party A feeds the bottom:
    output_kwarg: str = "num_classes"  # top kwarg party B sets to its label set's outputs
    input_width_kwarg: str | None = None  # bottom kwarg party A sets to its feature columns
    token_input: bool = False  # the bottom takes integer token ids, not floats


_SPECS: dict[str, _Spec] = {
    "femnist_cnn": _Spec(
        task="classification",
        bottom_defaults={},
        top_defaults={"num_classes": 62},
        make_bottom=FemnistBottom,
        make_top=_femnist_top,
        cut_dim=lambda: FEMNIST_CUT_DIM,
    ),
    "tabular_mlp": _Spec(
        task="classification",
        # in_features=20 is the host half of FATE's breast pair (party B holds the other 10)
        bottom_defaults={"in_features": 20, "hidden": [64], "cut_dim": 32},
        top_defaults={"hidden": [32], "num_classes": 2, "side_features": 0},
        make_bottom=TabularBottom,
        make_top=TabularTop,
        cut_dim=lambda in_features, hidden, cut_dim: cut_dim,
        input_width_kwarg="in_features",
    ),
    "so_tag": _Spec(
        task="multilabel",
        # paper: 5000 words → 2000 → 1000 tags; the bundled data set has 100 tags
        bottom_defaults={"vocab_size": 5000, "cut_dim": 2000},
        top_defaults={"num_tags": 1000},
        make_bottom=SoTagBottom,
        make_top=lambda cut_dim, num_tags: _SequentialTop(
            cut_dim, nn.Sequential(nn.Linear(cut_dim, num_tags))
        ),
        cut_dim=lambda vocab_size, cut_dim: cut_dim,
        output_kwarg="num_tags",
    ),
    "next_token_lstm": _Spec(
        task="sequence",
        # paper: 10,000 words + 4 specials (pad, oov, bos, eos) = 10,004
        bottom_defaults={"vocab_size": 10004, "embed_dim": 96, "hidden": 670, "cut_dim": 96},
        top_defaults={"vocab_size": 10004},
        make_bottom=NextTokenBottom,
        make_top=lambda cut_dim, vocab_size: _SequentialTop(
            cut_dim, nn.Sequential(nn.Linear(cut_dim, vocab_size))
        ),
        cut_dim=lambda vocab_size, embed_dim, hidden, cut_dim: cut_dim,
        output_kwarg="vocab_size",
        token_input=True,
    ),
}

MODEL_NAMES: tuple[str, ...] = tuple(_SPECS)

_MAY_BE_ZERO = frozenset({"side_features"})  # every other int kwarg is a width and must be > 0


def _spec(name: str) -> _Spec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _resolve(
    name: str, side: str, defaults: Mapping[str, KwargValue], given: Mapping[str, Any]
) -> dict[str, Any]:
    """Defaults overlaid with ``given``, checked against the defaults' types; lists → tuples."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        valid = ", ".join(sorted(defaults)) or "none"
        raise ValueError(f"{name} {side}: unknown kwargs {unknown}; valid kwargs: {valid}")
    out: dict[str, Any] = {}
    for key, default in defaults.items():
        value = given.get(key, default)
        where = f"{name} {side}: {key}={value!r}"
        if isinstance(default, list):
            if not isinstance(value, list | tuple) or not all(_is_int(v) and v > 0 for v in value):
                raise ValueError(f"{where} must be a list of positive ints")
            out[key] = tuple(value)
        else:
            low = 0 if key in _MAY_BE_ZERO else 1
            if not _is_int(value) or value < low:
                raise ValueError(f"{where} must be an int >= {low}")
            out[key] = value
    return out


def task(name: str) -> Task:
    """The loss the top party applies to this model's logits (see ``Task``)."""
    return _spec(name).task


def bottom_kwargs(name: str) -> dict[str, KwargValue]:
    """The kwargs ``build_bottom`` / ``cut_dim`` accept for ``name``, with their defaults."""
    return {
        k: list(v) if isinstance(v, list) else v for k, v in _spec(name).bottom_defaults.items()
    }


def top_kwargs(name: str) -> dict[str, KwargValue]:
    """The kwargs ``build_top`` accepts for ``name`` (besides ``cut_dim``), with defaults."""
    return {k: list(v) if isinstance(v, list) else v for k, v in _spec(name).top_defaults.items()}


def output_kwarg(name: str) -> str:
    """The top kwarg that party B fills from its label set: its number of outputs."""
    return _spec(name).output_kwarg


def input_width_kwarg(name: str) -> str | None:
    """The bottom kwarg that party A fills from its feature table's width, if any."""
    return _spec(name).input_width_kwarg


def takes_tokens(name: str) -> bool:
    """Whether the bottom's input is integer token ids (int64) rather than floats."""
    return _spec(name).token_input


def cut_dim(name: str, **kwargs: Any) -> int:
    """d, the width of each row the bottom built with these kwargs returns."""
    spec = _spec(name)
    return spec.cut_dim(**_resolve(name, "bottom", spec.bottom_defaults, kwargs))


def build_bottom(name: str, **kwargs: Any) -> nn.Module:
    """Party A's half: ``forward(x) -> (n, cut_dim(name, **kwargs))``.

    Initialisation uses torch's default RNG: seed with ``torch.manual_seed`` for repeatability.
    """
    spec = _spec(name)
    return spec.make_bottom(**_resolve(name, "bottom", spec.bottom_defaults, kwargs))


def build_top(name: str, *, cut_dim: int, **kwargs: Any) -> TopModel:
    """Party B's half: ``forward(z̃ (n, cut_dim), side=None) -> logits (n, out)``.

    ``cut_dim`` is the d party A's bottom produces (``cut_dim(name, **bottom_kwargs)``).
    """
    spec = _spec(name)
    if not _is_int(cut_dim) or cut_dim < 1:
        raise ValueError(f"{name} top: cut_dim={cut_dim!r} must be an int >= 1")
    return spec.make_top(cut_dim, **_resolve(name, "top", spec.top_defaults, kwargs))
