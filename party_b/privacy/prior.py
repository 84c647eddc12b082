"""RRWithPrior (Ghazi et al., "Deep Learning with Label Differential Privacy", NeurIPS 2021,
Algorithm 2) with a prior from party B's own features: the policy field ``prior_fraction``.

Randomized response spends its epsilon on telling every class apart from every other. With a
prior p (C,) over a row's label that does not depend on that label, RRWithPrior first keeps
only the k classes the prior ranks highest, k maximising (sum of their prior) *
e^eps / (e^eps + k - 1), then answers randomized response over those k: the true label with
probability e^eps / (e^eps + k - 1) if it is among them, each other of the k with
probability 1 / (e^eps + k - 1); a uniform one of the k if it is not. Every output's
probability under one label is at most e^eps times its probability under another, so the
row is eps-label-DP for any prior that does not depend on its own label.

The prior, as the paper's two stages: a seeded share ``prior_fraction`` of party B's rows
(the held-aside part, chosen by the label draw) gets plain randomized response at the same
epsilon; a multinomial logistic regression of those randomized labels on party B's own
feature columns is the prior of every other row, which gets RRWithPrior. Each label goes
through exactly one of the two mechanisms, and the prior depends on the held-aside rows'
randomized labels only (not on any other row's label): the run stays eps-label-DP. Without
feature columns the regression is the randomized labels' class frequencies.

Deterministic: the regression runs a fixed number of full-batch gradient steps in float64
with numpy's own reductions (no BLAS, whose sums may depend on threads), so a restarted
party B recomputes the same prior and the same labels (bit-identical recovery).
"""

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from party_b.labels import LabelSource

__all__ = ["fit_prior", "prior_of", "rr_with_prior"]

ITERATIONS = 300  # full-batch gradient steps of the prior's regression
STEP = 0.5  # their size (the features are z-scored; the loss is a mean)
MAX_ROWS = 50_000  # held-aside rows the regression reads, at most (in row order)
_CACHE: "OrderedDict[bytes, NDArray[np.float64]]" = OrderedDict()  # run secret -> weights
_CACHED = 64


def rr_with_prior(
    targets: NDArray[np.int64],
    prior: NDArray[np.float64],
    uniforms: tuple[NDArray[np.float64], NDArray[np.float64]],
    epsilon: float,
) -> NDArray[np.int64]:
    """RRWithPrior's outputs for labels ``targets`` (n,) under ``prior`` (n, C), from two
    uniform draws (n,) per row (``uniforms``): keep-or-not, and which class."""
    n, classes = prior.shape
    order = np.argsort(-prior, axis=1, kind="stable")  # classes by prior, highest first
    top = np.cumsum(np.take_along_axis(prior, order, axis=1), axis=1)  # (n, C)
    k_range = np.arange(1, classes + 1)
    weight = top * (math.exp(epsilon) / (math.exp(epsilon) + k_range - 1))
    k = np.argmax(weight, axis=1) + 1  # (n,) the first best k
    rank = np.argmax(order == targets[:, None], axis=1)  # the true label's place
    inside = rank < k
    keep = uniforms[0] < math.exp(epsilon) / (math.exp(epsilon) + k - 1)
    # inside: another of the k uniformly (skipping the label's own place); else any of the k
    others = np.floor(uniforms[1] * np.maximum(k - 1, 1)).astype(np.int64)
    others = others + (others >= rank)
    anyone = np.floor(uniforms[1] * k).astype(np.int64)
    place = np.where(inside, np.where(keep, rank, others), anyone)
    place = np.minimum(place, k - 1)  # k == 1 inside: kept (keep is then always true)
    out: NDArray[np.int64] = order[np.arange(n), place]
    return out


def _standardised_side(labels: "LabelSource", rows: NDArray[np.int64]) -> NDArray[np.float64]:
    if labels.side_width == 0:
        return np.zeros((len(rows), 0))
    side: NDArray[np.float64] = labels.side(rows).numpy().astype(np.float64)
    return side


def fit_prior(
    side: NDArray[np.float64], randomized: NDArray[np.int64], classes: int
) -> NDArray[np.float64]:
    """Weights (k + 1, C) of a multinomial logistic regression of ``randomized`` (m,) on
    ``side`` (m, k) (last row: the intercepts), by fixed full-batch gradient steps."""
    m, k = side.shape
    x = np.concatenate([side, np.ones((m, 1))], axis=1)
    onehot = np.zeros((m, classes))
    onehot[np.arange(m), randomized] = 1.0
    weights = np.zeros((k + 1, classes))
    for _ in range(ITERATIONS):
        p = _softmax(_linear(x, weights))
        gradient = np.einsum("mk,mc->kc", x, p - onehot, optimize=False) / max(m, 1)
        weights = weights - STEP * gradient
    return weights


def _linear(x: NDArray[np.float64], weights: NDArray[np.float64]) -> NDArray[np.float64]:
    logits: NDArray[np.float64] = np.einsum("mk,kc->mc", x, weights, optimize=False)
    return logits


def _softmax(logits: NDArray[np.float64]) -> NDArray[np.float64]:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    out: NDArray[np.float64] = shifted / shifted.sum(axis=1, keepdims=True)
    return out


def prior_of(
    secret: bytes,
    labels: "LabelSource",
    rows: NDArray[np.int64],
    held_aside: Callable[[], tuple[NDArray[np.int64], NDArray[np.int64]]],
) -> NDArray[np.float64]:
    """The prior (n, C) of ``rows``: the run's regression applied to their feature columns.
    It is fitted once per label draw (cached by its key; a run from before draws: by its
    secret) on ``held_aside()``: the held-aside rows, ascending, and their randomized
    labels."""
    weights = _CACHE.get(secret)
    if weights is None:
        fit_rows, randomized = held_aside()
        weights = fit_prior(
            _standardised_side(labels, fit_rows[:MAX_ROWS]),
            randomized[:MAX_ROWS],
            labels.num_outputs,
        )
        _CACHE[secret] = weights
        while len(_CACHE) > _CACHED:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(secret)
    side = _standardised_side(labels, rows)
    x = np.concatenate([side, np.ones((len(rows), 1))], axis=1)
    return _softmax(_linear(x, weights))
