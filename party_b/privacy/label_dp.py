"""Label differential privacy by randomized response, once per run: the run's labels.

Party B replaces every label of its table, once per run, by a randomized response
(``defences.randomized_labels``): the label stays with probability e^eps / (e^eps + C - 1)
and otherwise becomes one of the other C - 1 classes, uniformly. The draw of a row depends
only on the run's secret and the row (never on the step, the batch or party A's seed), so a
row keeps one randomized label for the whole run, in every epoch and after every restart
(bit-identical recovery), and party A cannot reproduce it.

With ``prior_fraction`` > 0 a held-aside share of the rows gets that randomized response and
every other row RRWithPrior at the same epsilon, its prior fitted on the held-aside rows'
randomized labels (``party_b.privacy.prior``): each label still goes through one mechanism.

Everything the run then computes from labels, training steps, step losses, evaluations, the
model and its predictions, uses the randomized labels only: it is post-processing of them,
so the whole run is eps-label-DP whatever party A sends and however many steps it observes
(docs/PRIVACY.md, section 2, states the guarantee and how runs compose).
"""

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from party_b.privacy.defences import randomized_labels, row_uniforms
from party_b.privacy.prior import prior_of, rr_with_prior
from party_b.privacy.secret import RunPrivacy

if TYPE_CHECKING:
    from party_b.labels import LabelSource

__all__ = ["auc_bound", "keep_probability", "run_targets"]


def keep_probability(epsilon: float, num_classes: int) -> float:
    """P(a row's randomized label is its true label) under randomized response."""
    return math.exp(epsilon) / (math.exp(epsilon) + num_classes - 1)


def auc_bound(epsilon: float) -> float:
    """The highest AUC any test can reach, for one row, at telling apart two values of its
    label from everything an eps-label-DP run releases: e^eps / (1 + e^eps).

    Its ROC curve lies under TPR = min(e^eps FPR, 1 - e^-eps (1 - FPR)) (the eps-DP trade-off
    curve, Kairouz et al. 2015); the area under that curve is e^eps / (1 + e^eps), reached by
    binary randomized response itself."""
    return math.exp(epsilon) / (1.0 + math.exp(epsilon))


def run_targets(
    privacy: RunPrivacy,
    targets: Tensor,
    rows: np.ndarray,
    num_classes: int,
    labels: "LabelSource | None" = None,
) -> Tensor:
    """The labels of ``rows`` (n,) as the run sees them: randomized under label DP (one draw
    per row and run), ``targets`` (n,) themselves otherwise. ``labels``: party B's label
    source, which RRWithPrior's prior is fitted on (``prior_fraction``)."""
    policy = privacy.policy
    epsilon = policy.label_epsilon
    if epsilon is None:
        return targets
    seed = privacy.seed(0, "label-dp")
    plain = randomized_labels(targets, rows, epsilon=epsilon, num_classes=num_classes, seed=seed)
    if not policy.prior_fraction:
        return plain
    if labels is None:
        raise ValueError("RRWithPrior needs party B's label source for its prior")
    source = labels

    def held_aside() -> tuple[np.ndarray, np.ndarray]:
        every = np.arange(len(source.ids))
        chosen = row_uniforms(seed, every, 3) < policy.prior_fraction
        if source.labeled is not None:
            chosen &= source.labeled
        fit = every[chosen]
        randomized = randomized_labels(
            source.targets(fit), fit, epsilon=epsilon, num_classes=num_classes, seed=seed
        )
        return fit, randomized.numpy()

    held = row_uniforms(seed, rows, 3) < policy.prior_fraction
    prior = prior_of(privacy.secret, source, rows, held_aside)
    draws = (row_uniforms(seed, rows, 4), row_uniforms(seed, rows, 5))
    with_prior = rr_with_prior(targets.numpy().astype(np.int64), prior, draws, epsilon)
    return torch.from_numpy(np.where(held, plain.numpy(), with_prior).astype(np.int64))
