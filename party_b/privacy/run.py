"""A run's privacy (policy + secret) and ``protected_step``, the one call the step protocol
makes (``party_b.service.steps``) in place of ``TopTrainer.compute_step``.

Its randomness comes from secrets party B never sends: the run's own (gradient noise),
drawn at run creation, and its label table's draw (randomized labels, the same in every run
on the table: ``draws``). Seeds derived from the run's seed alone would let party A, who
chose that seed, regenerate the noise and subtract it, or learn which labels the randomized
response flipped.
"""

import numpy as np
from torch import Tensor

from party_b.labels import LabelSource
from party_b.privacy.defences import perturb_gradient, visible_metrics
from party_b.privacy.label_dp import keep_probability, run_targets
from party_b.privacy.secret import OFF, RunPrivacy
from party_b.top import StepOutcome, TopTrainer

__all__ = ["OFF", "RunPrivacy", "protected_step"]


def protected_step(
    trainer: TopTrainer,
    z_tilde: Tensor,
    targets: Tensor,
    side: Tensor | None,
    *,
    rows: np.ndarray,
    labels: LabelSource,
    step: int,
    dropout_seed: int,
    privacy: RunPrivacy,
) -> tuple[StepOutcome, StepOutcome]:
    """``compute_step`` under the run's policy: (outcome, reply).

    ``rows`` (n,): the batch's rows in ``labels``, party B's label source (randomized
    response draws once per row; RRWithPrior fits its prior on the source). ``outcome`` is
    what party B logs (its loss is on the labels it trained on); ``reply`` holds the
    perturbed (rows, d) gradient and only the loss and metrics party A may see. Raises what
    ``compute_step`` raises, before anything changes.
    """
    policy = privacy.policy
    targets = run_targets(privacy, targets, rows, labels.num_outputs, labels)
    keep = None  # the loss corrected for the randomized labels' known flip rate
    if policy.forward_loss and policy.label_epsilon is not None:
        keep = keep_probability(policy.label_epsilon, labels.num_outputs)
    outcome = trainer.compute_step(z_tilde, targets, side, dropout_seed=dropout_seed, keep=keep)
    grad = perturb_gradient(
        outcome.grad, policy, seed=privacy.seed(step, "gradient-noise"), labels=targets
    )
    loss, metrics = visible_metrics(outcome.loss, outcome.metrics, policy)
    return outcome, StepOutcome(loss=loss, metrics=metrics, grad=grad)
