"""Estimates of true-label metrics from an evaluation on randomized labels.

Under party B's label DP (docs/PRIVACY.md) an evaluation's metrics are on the run's
randomized labels: each label kept with probability ``keep`` (public:
``RunPrivacyOut.label_keep``) and otherwise replaced by another class uniformly. For rows
the model was not trained on (the held-out split) the randomization is independent of the
model's scores given the true label, so the expected randomized-label metric is an affine
function of the true-label one, which can be inverted:

- accuracy: E[acc~] = c + (keep - c) acc, c = (1 - keep) / (C - 1);
- AUC (two classes): with q the share of randomized positives (the reply's ``label_rate``)
  and pi = (q - (1 - keep)) / (2 keep - 1) the true share, a randomized positive is a true
  one with probability a = keep pi / q and a randomized negative with b = (1 - keep) pi /
  (1 - q), so E[AUC~] - 1/2 = (a - b) (AUC - 1/2).

Each estimate comes with a normal 95 % interval from the randomized metric's sampling error
(binomial for accuracy, Hanley and McNeil 1982 for AUC) scaled by the same factor: the
smaller epsilon, the wider. The estimates need nothing party A may not have: they are
post-processing of what party B sent.
"""

import math
from dataclasses import dataclass

__all__ = ["Estimate", "true_accuracy", "true_auc"]

Z95 = 1.959964  # the standard normal's 97.5 % quantile
MIN_SCALE = 0.02  # below this factor the estimate says nothing: none is given


@dataclass(frozen=True)
class Estimate:
    """A true-label metric estimated from a randomized-label one, and its 95 % interval."""

    value: float
    low: float
    high: float


def _estimate(value: float, se: float) -> Estimate:
    return Estimate(_clip(value), _clip(value - Z95 * se), _clip(value + Z95 * se))


def _clip(x: float) -> float:
    """A metric lies in [0, 1]: so do its estimate and interval."""
    return min(1.0, max(0.0, x))


def true_accuracy(accuracy: float, *, keep: float, classes: int, n: int) -> Estimate | None:
    """The true-label accuracy of ``n`` held-out rows whose randomized-label accuracy is
    ``accuracy``; None where it cannot be estimated."""
    other = (1.0 - keep) / (classes - 1)
    scale = keep - other
    if not (math.isfinite(accuracy) and n > 0 and scale >= MIN_SCALE):
        return None
    se = math.sqrt(max(accuracy * (1.0 - accuracy), 1e-12) / n) / scale
    return _estimate((accuracy - other) / scale, se)


def true_auc(auc: float, *, keep: float, label_rate: float, n: int) -> Estimate | None:
    """The true-label AUC of ``n`` held-out rows (two classes) whose randomized-label AUC is
    ``auc``, a share ``label_rate`` of their randomized labels positive; None where it
    cannot be estimated (the labels' share says they carry no signal, or too little)."""
    q = label_rate
    if not (math.isfinite(auc) and math.isfinite(q) and 0.0 < q < 1.0 and n > 1):
        return None
    pi = (q - (1.0 - keep)) / (2.0 * keep - 1.0)
    if not 0.0 < pi < 1.0:
        return None
    scale = keep * pi / q - (1.0 - keep) * pi / (1.0 - q)
    if scale < MIN_SCALE:
        return None
    positives, negatives = max(q * n, 1.0), max((1.0 - q) * n, 1.0)
    q1, q2 = auc / (2.0 - auc), 2.0 * auc * auc / (1.0 + auc)
    variance = (
        auc * (1.0 - auc)
        + (positives - 1.0) * (q1 - auc * auc)
        + (negatives - 1.0) * (q2 - auc * auc)
    ) / (positives * negatives)
    return _estimate(0.5 + (auc - 0.5) / scale, math.sqrt(max(variance, 0.0)) / scale)
