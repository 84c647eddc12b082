"""Label differential privacy by randomized response, once per label table: a run's labels.

Party B replaces every label of its table by a randomized response
(``defences.randomized_labels``): the label stays with probability e^eps / (e^eps + C - 1)
and otherwise becomes one of the other C - 1 classes, uniformly. An id's draw depends only
on the key of its table's label draw and the id (``draws``: never on the run, the step, the
batch or party A's seed), so an id keeps one randomized label in every run on the table, in
every epoch and after every restart (bit-identical recovery), and party A cannot reproduce
it. A run created before label draws existed draws from its own secret by row, as it did.

With ``prior_fraction`` > 0 a held-aside share of the rows gets that randomized response and
every other row RRWithPrior at the same epsilon, its prior fitted on the held-aside rows'
randomized labels (``party_b.privacy.prior``): each label still goes through one mechanism.

Everything the run then computes from labels, training steps, step losses, evaluations, the
model and its predictions, uses the randomized labels only: it is post-processing of them,
so the whole run is eps-label-DP whatever party A sends and however many steps it observes
(docs/PRIVACY.md, section 2, states the guarantee and how runs compose).
"""

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from party_b.privacy.defences import randomized_labels, row_uniforms
from party_b.privacy.draws import id_codes
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
    per id and label table, or per row and run for a run created before label draws),
    ``targets`` (n,) themselves otherwise. ``labels``: party B's label source, whose ids key
    a table draw's labels and whose features RRWithPrior's prior is fitted on; needed under
    label DP but for those older runs without ``prior_fraction``."""
    policy = privacy.policy
    epsilon = policy.label_epsilon
    if epsilon is None:
        return targets
    draw = _Draws.of(privacy, labels)
    plain = randomized_labels(
        targets, draw.keys(rows), epsilon=epsilon, num_classes=num_classes, seed=draw.seed
    )
    if not policy.prior_fraction:
        return plain
    if labels is None:
        raise ValueError("RRWithPrior needs party B's label source for its prior")
    source = labels

    def held_aside() -> tuple[np.ndarray, np.ndarray]:
        every = np.arange(len(source.ids))
        chosen = row_uniforms(draw.seed, draw.keys(every), 3) < policy.prior_fraction
        if source.labeled is not None:
            chosen &= source.labeled
        fit = every[chosen]
        randomized = randomized_labels(
            source.targets(fit), draw.keys(fit), epsilon=epsilon, num_classes=num_classes,
            seed=draw.seed,
        )  # fmt: skip
        return fit, randomized.numpy()

    keys = draw.keys(rows)
    held = row_uniforms(draw.seed, keys, 3) < policy.prior_fraction
    prior = prior_of(draw.identity, source, rows, held_aside)
    draws = (row_uniforms(draw.seed, keys, 4), row_uniforms(draw.seed, keys, 5))
    with_prior = rr_with_prior(targets.numpy().astype(np.int64), prior, draws, epsilon)
    return torch.from_numpy(np.where(held, plain.numpy(), with_prior).astype(np.int64))


@dataclass(frozen=True)
class _Draws:
    """Where a run's random label draws come from: a seed, the value each row's draws are
    keyed by, and what identifies the draw (RRWithPrior's prior is cached by it)."""

    seed: int
    identity: bytes
    source: "LabelSource | None"
    key: bytes | None  # the table draw's key; None: the run's own draws, keyed by row

    @classmethod
    def of(cls, privacy: RunPrivacy, labels: "LabelSource | None") -> "_Draws":
        key = privacy.label_key
        if key is None:  # a run created before label draws: by row, from its own secret
            return cls(privacy.seed(0, "label-dp"), privacy.secret, labels, None)
        if labels is None:
            raise ValueError("a run's table draw keys its labels by id: pass the label source")
        seed = int.from_bytes(hashlib.sha256(key + b"label-dp").digest()[:8], "big") >> 1
        return cls(seed, key, labels, key)

    def keys(self, rows: np.ndarray) -> np.ndarray:
        """(n,) the value the draws of each of ``rows`` are keyed by: its id's code under
        the table draw's key, or (a run's own draws) the row itself."""
        if self.key is None:
            return rows
        assert self.source is not None
        return id_codes(self.key, self.source.ids, rows)
