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
- ``next_token_lstm`` (sequence): Embedding-LSTM-tanh-Dense, one row per token | Dense(d → vocab)

Kwargs are plain JSON values (ints, lists of ints) since party B reads them from a run config.
``build_bottom`` and ``cut_dim`` take the bottom's kwargs, ``build_top`` the top's kwargs plus
the ``cut_dim`` it receives from party A.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from shared.models.femnist import FemnistBottom, femnist_cut_dim, femnist_top
from shared.models.layers import (
    KwargValue,
    SeededDropout,
    SequentialTop,
    Task,
    TopModel,
    build_seeded,
    haiku_init_,
    seed_dropout,
)
from shared.models.tabular import TabularBottom, TabularTop
from shared.models.text import NextTokenBottom, SoTagBottom

__all__ = [
    "MODEL_NAMES",
    "SeededDropout",
    "Task",
    "TopModel",
    "build_bottom",
    "build_seeded",
    "build_top",
    "bottom_kwargs",
    "categories_kwarg",
    "cut_dim",
    "haiku_init_",
    "input_width_kwarg",
    "output_kwarg",
    "seed_dropout",
    "takes_tokens",
    "task",
    "top_kwargs",
]


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
    # bottom kwarg party A sets to its categorical columns' codes (None: numbers only)
    categories_kwarg: str | None = None
    token_input: bool = False  # the bottom takes integer token ids, not floats


_SPECS: dict[str, _Spec] = {
    "femnist_cnn": _Spec(
        task="classification",
        # width < 28: a feature party holding some columns of each image (its half)
        bottom_defaults={"width": 28},
        top_defaults={"num_classes": 62},
        make_bottom=FemnistBottom,
        make_top=femnist_top,
        cut_dim=femnist_cut_dim,
    ),
    "tabular_mlp": _Spec(
        task="classification",
        # in_features=20 is the host half of FATE's breast pair (party B holds the other 10)
        # categories: filled in by party A from its table's categorical columns
        bottom_defaults={
            "in_features": 20,
            "hidden": [64],
            "cut_dim": 32,
            "categories": [],
            "one_hot_max": 16,
            "embedding_dim": 16,
        },
        top_defaults={"hidden": [32], "num_classes": 2, "side_features": 0},
        make_bottom=TabularBottom,
        make_top=TabularTop,
        cut_dim=lambda in_features, hidden, cut_dim, **_encoding: cut_dim,
        input_width_kwarg="in_features",
        categories_kwarg="categories",
    ),
    "so_tag": _Spec(
        task="multilabel",
        # paper: 5000 words → 2000 → 1000 tags; the bundled data set has 100 tags
        bottom_defaults={"vocab_size": 5000, "cut_dim": 2000},
        top_defaults={"num_tags": 1000},
        make_bottom=SoTagBottom,
        make_top=lambda cut_dim, num_tags: SequentialTop(
            cut_dim, haiku_init_(nn.Sequential(nn.Linear(cut_dim, num_tags)))
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
        make_top=lambda cut_dim, vocab_size: SequentialTop(
            cut_dim, haiku_init_(nn.Sequential(nn.Linear(cut_dim, vocab_size)))
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


def categories_kwarg(name: str) -> str | None:
    """The bottom kwarg that party A fills with its categorical columns' codes, if the model
    takes categorical columns at all."""
    return _spec(name).categories_kwarg


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
