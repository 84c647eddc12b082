"""Party B's label-privacy policy: what a run's gradients, losses and metrics give away.

The label owner decides, never party A: the operator sets one switch, ``FEDLITE_B_PRIVACY``
(``fedlite-b serve --privacy``), and every run created while it is set stores the policy it
got (``party_b.store``: table ``run_privacy``), so a run keeps its policy across restarts and
a later change of the switch (bit-identical resume, exactly-once replay). Runs stored before
policies existed train as ``off``, as they did.

The switch is a preset name, optionally followed by ``key=value`` overrides::

    protected                             the default: label DP at the measured epsilon,
                                          no loss or accuracy in step replies
    protected,label_epsilon=2             the same at another epsilon
    off                                   nothing hidden in replies (predict still refuses
                                          training ids: predict_train_ids=true allows them)
    recommended                           Marvell's gradient noise (no formal guarantee)
    metrics=loss,max_norm=true,noise=0.5  from ``off``, field by field

A party B started without the switch gives new runs ``protected`` (``DEFAULT_PRESET``);
``off`` is the operator's explicit choice, and logged as such.

Fields (docs/PRIVACY.md measures what each costs):

- ``metrics``: what a step reply (and the step log party A can read) carries besides the
  gradient: ``all`` (loss and batch accuracy), ``loss`` (the loss only) or ``none`` (the
  loss is NaN on the wire; "n", the batch's sample count, which party A knows, always goes).
- ``max_norm``: Li et al.'s norm alignment: Gaussian noise on every row so that its expected
  norm equals the batch's largest, which hides the norm signal.
- ``noise``: isotropic Gaussian noise on every gradient row, standard deviation
  ``noise * max_i ||g_i|| / sqrt(d)`` per coordinate (so a row's noise has about ``noise``
  times the batch's largest row norm); hides the direction signal.
- ``directional``: Gaussian noise along the batch's top ``directions`` principal directions
  (right singular vectors of the true (rows, d) gradient), standard deviation ``directional``
  times the batch's largest row norm per direction and row. A simplified Marvell (Li et al.
  2022 optimise the noise covariance per class; here the noise goes where the two classes'
  gradients differ, which for binary labels is the top principal direction): it hides the
  direction and principal-direction signals with about d / directions times less noise
  energy than isotropic noise of the same effect.
- ``marvell``: Li et al.'s Marvell (``party_b.privacy.marvell``), binary classification
  only: per batch, party B fits each class's gradients (mean, per-coordinate variance) and
  adds to each row Gaussian noise of its class's covariance, the pair of covariances that
  minimises the symmetrized KL divergence between the two classes' perturbed gradients
  under a power budget ``p tr(S_1) + (1 - p) tr(S_0) <= marvell * ||m_1 - m_0||^2`` (the
  paper's "Marvell with s", s = ``marvell``). Batches of one class get none.
- ``centred``: subtract, per coordinate, the batch mean of all the noise above, so that the
  noise sums to zero over the batch's rows: party A's bottom-model gradient, a sum over rows,
  then loses the noise's common part (large, as the bottom's ReLU activations are all >= 0)
  while each row's noise keeps (1 - 1/rows) of its variance. The price: the batch's summed
  gradient reaches party A exactly (it always did up to noise of sqrt(rows) times a row's).
- ``label_epsilon``: label differential privacy by randomized response (classification only):
  each label is replaced once per label table (``party_b.privacy.draws``: every run on it
  sees the same), by itself with probability e^eps / (e^eps + C - 1) and otherwise by
  another class drawn uniformly; training,
  evaluation and the logs then see only the randomized labels, so everything party A
  receives is eps-label-DP (``party_b.privacy.label_dp``; docs/PRIVACY.md states the
  guarantee).
- ``prior_fraction``: RRWithPrior (Ghazi et al. 2021) instead of plain randomized response
  for all but this share of the rows, which are held aside, get plain randomized response,
  and give the others their prior: a regression of their randomized labels on party B's own
  feature columns (``party_b.privacy.prior``). The same epsilon; measured in docs/PRIVACY.md.
- ``forward_loss``: under label DP, the top model trains on the loss corrected for the
  randomization's known flip rate (``party_b.top.forward_corrected``; Patrini et al. 2017):
  the model then estimates the true labels' posterior and stops memorising flipped labels.
  Post-processing of the randomized labels: the same epsilon. Plain randomized response
  only: a ``prior_fraction`` override turns the preset's ``forward_loss`` off.
- ``predict_train_ids``: whether ``predict`` answers for ids of the run's training split.
  Unset (the default) means: yes under label DP, whose guarantee covers the model's outputs
  (post-processing), no otherwise (the scores of a model on the rows it was trained on are
  a direct view of what it memorised of their labels). Runs stored before the field existed
  answered for every id, and still do.
"""

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, cast

__all__ = [
    "DEFAULT_BUDGET_DRAWS",
    "DEFAULT_PRESET",
    "METRICS_POLICIES",
    "PRESETS",
    "PrivacyPolicy",
    "default_budget",
    "parse_policy",
]

MetricsPolicy = Literal["all", "loss", "none"]
METRICS_POLICIES: tuple[MetricsPolicy, ...] = ("all", "loss", "none")


@dataclass(frozen=True)
class PrivacyPolicy:
    """One run's defences; ``PrivacyPolicy()`` is ``off``."""

    metrics: MetricsPolicy = "all"
    max_norm: bool = False
    noise: float = 0.0  # Gaussian noise, in units of the batch's largest row norm
    directional: float = 0.0  # noise along the top principal directions, same units
    directions: int = 2  # how many principal directions get ``directional`` noise
    marvell: float = 0.0  # Marvell's power budget, in units of ||m_1 - m_0||^2; 0 = none
    centred: bool = False  # the noise sums to zero over the batch
    label_epsilon: float | None = None  # randomized response; None = labels as they are
    prior_fraction: float = 0.0  # RRWithPrior: share of rows held aside for its prior; 0 = RR
    forward_loss: bool = False  # label DP: the top's loss corrected for the known flip rate
    predict_train_ids: bool | None = None  # None: allowed exactly under label DP

    def __post_init__(self) -> None:
        if self.metrics not in METRICS_POLICIES:
            raise ValueError(
                f"metrics must be one of {', '.join(METRICS_POLICIES)}, not {self.metrics!r}"
            )
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise ValueError(f"noise must be a finite number >= 0, not {self.noise!r}")
        if not (math.isfinite(self.directional) and self.directional >= 0):
            raise ValueError(f"directional must be a finite number >= 0, not {self.directional!r}")
        if not (math.isfinite(self.marvell) and self.marvell >= 0):
            raise ValueError(f"marvell must be a finite number >= 0, not {self.marvell!r}")
        if not (isinstance(self.directions, int) and 1 <= self.directions <= 64):
            raise ValueError(f"directions must be an integer from 1 to 64, not {self.directions!r}")
        eps = self.label_epsilon
        if eps is not None and not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"label_epsilon must be a finite number > 0, not {eps!r}")
        fraction = self.prior_fraction
        if not (math.isfinite(fraction) and 0 <= fraction < 1):
            raise ValueError(f"prior_fraction must be a number from 0 to below 1, not {fraction!r}")
        if fraction and eps is None:
            raise ValueError("prior_fraction (RRWithPrior) needs label_epsilon")
        if self.forward_loss and (eps is None or fraction):
            raise ValueError(
                "forward_loss corrects the loss for plain randomized response: it needs "
                "label_epsilon, and RRWithPrior's rows have no common flip rate (with "
                "prior_fraction give forward_loss=false)"
            )
        if self.predict_train_ids not in (None, True, False):
            raise ValueError(
                f"predict_train_ids is true, false or unset, not {self.predict_train_ids!r}"
            )

    @property
    def epsilon(self) -> float | None:
        """The run's label-DP epsilon, for everything party A receives from it; None when the
        policy gives no formal guarantee (off, or gradient noise alone)."""
        return self.label_epsilon

    @property
    def answers_training_ids(self) -> bool:
        """Whether ``predict`` answers for ids of the run's training split."""
        if self.predict_train_ids is not None:
            return self.predict_train_ids
        return self.label_epsilon is not None

    @property
    def is_off(self) -> bool:
        """Nothing hidden: no label DP, no gradient noise, loss and accuracy in every reply."""
        return self.label_epsilon is None and not self.perturbs_gradient and self.metrics == "all"

    @property
    def perturbs_gradient(self) -> bool:
        return self.max_norm or self.noise > 0 or self.directional > 0 or self.marvell > 0

    def check_labels(self, task: str, num_outputs: int) -> None:
        """Raise ValueError if a label source of this ``task`` ("classification", ...) and
        ``num_outputs`` cannot run this policy's defences."""
        if self.label_epsilon is not None and task != "classification":
            raise ValueError(
                f"label_epsilon (randomized response) needs class labels; this label source "
                f"is a {task} task. The default policy ('protected') is label DP: choose one "
                "for this source explicitly, e.g. FEDLITE_B_PRIVACY=metrics=none (no formal "
                "guarantee, see docs/PRIVACY.md) or off"
            )
        if self.marvell > 0 and (task != "classification" or num_outputs != 2):
            raise ValueError(
                f"marvell needs binary class labels; this label source is a {task} task with "
                f"{num_outputs} outputs (the recommended preset uses marvell: override it, "
                "e.g. 'recommended,marvell=0,noise=4', see docs/PRIVACY.md)"
            )

    def to_stored(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_stored(cls, stored: dict[str, Any] | None) -> "PrivacyPolicy":
        """The policy a run was created with, as it was: a run stored before policies trains
        as off, one stored before a field existed gets that field's old behaviour (its
        defence off; ``predict`` answering for every id)."""
        if stored is None:
            return cls(predict_train_ids=True)
        return cls(**{"predict_train_ids": True, **stored})

    def describe(self) -> str:
        """The policy as the switch would spell it, from ``off``."""
        parts = [f"metrics={self.metrics}"]
        if self.max_norm:
            parts.append("max_norm=true")
        if self.noise:
            parts.append(f"noise={self.noise:g}")
        if self.directional:
            parts.append(f"directional={self.directional:g},directions={self.directions}")
        if self.marvell:
            parts.append(f"marvell={self.marvell:g}")
        if self.centred:
            parts.append("centred=true")
        if self.label_epsilon is not None:
            parts.append(f"label_epsilon={self.label_epsilon:g}")
        if self.prior_fraction:
            parts.append(f"prior_fraction={self.prior_fraction:g}")
        if self.forward_loss:
            parts.append("forward_loss=true")
        if self.predict_train_ids is not None:
            parts.append(f"predict_train_ids={str(self.predict_train_ids).lower()}")
        return ",".join(parts)


# The protected preset's epsilon is the one docs/PRIVACY.md picks from the leakage benchmark
# (benchmarks/leakage: the smallest epsilon of the measured frontier whose model costs at
# most 0.01 AUC on default_credit); change both together. It is spent once per label table
# (party_b.privacy.draws), whatever the number of runs.
PROTECTED_EPSILON = 2.0
# A token's budget when the operator set none (FEDLITE_B_LIMIT_EPSILON_BUDGET unset): this
# many draws at the epsilon new runs get, so that one new draw (a redraw, a changed table)
# passes and the next is the operator's call.
DEFAULT_BUDGET_DRAWS = 2


def default_budget(configured: float | None, policy: PrivacyPolicy) -> float | None:
    """A token's budget where the operator gave it none: ``configured``
    (``FEDLITE_B_LIMIT_EPSILON_BUDGET``; 0: none), else ``DEFAULT_BUDGET_DRAWS`` draws at
    ``policy``'s epsilon (the policy new runs get); None: no budget."""
    if configured is not None:
        return configured or None
    return DEFAULT_BUDGET_DRAWS * policy.epsilon if policy.epsilon is not None else None


PRESETS: dict[str, PrivacyPolicy] = {
    "protected": PrivacyPolicy(metrics="none", label_epsilon=PROTECTED_EPSILON, forward_loss=True),
    "off": PrivacyPolicy(),
    # Marvell (Li et al.), the default of the release before label DP: empirical only
    "recommended": PrivacyPolicy(metrics="loss", marvell=10.0),
}
DEFAULT_PRESET = "protected"  # what a party B started without FEDLITE_B_PRIVACY gives runs


def _field_value(key: str, raw: str) -> object:
    if key == "metrics":
        return raw
    if key == "predict_train_ids" and raw.lower() == "unset":
        return None
    if key in ("max_norm", "centred", "predict_train_ids", "forward_loss"):
        if raw.lower() not in ("true", "false"):
            raise ValueError(f"{key} is true or false, not {raw!r}")
        return raw.lower() == "true"
    if key == "label_epsilon" and raw.lower() == "none":
        return None
    if key == "directions":
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"directions must be an integer, not {raw!r}") from None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{key} must be a number, not {raw!r}") from None


def parse_policy(text: str) -> PrivacyPolicy:
    """``FEDLITE_B_PRIVACY``: a preset (``off``, ``recommended``) and/or ``key=value``
    overrides, comma separated; raises ValueError naming what is wrong."""
    policy = PRESETS["off"]
    overrides: dict[str, object] = {}
    known = [f.name for f in fields(PrivacyPolicy)]
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise ValueError(f"empty privacy policy; use one of {', '.join(PRESETS)}")
    for i, item in enumerate(items):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            if i or key not in PRESETS:
                raise ValueError(
                    f"unknown privacy preset {item!r}: a policy starts with one of "
                    f"{', '.join(PRESETS)}, then key=value overrides ({', '.join(known)})"
                )
            policy = PRESETS[key]
            continue
        if key not in known:
            raise ValueError(f"unknown privacy field {key!r}; known: {', '.join(known)}")
        overrides[key] = _field_value(key, raw.strip())
    if "forward_loss" not in overrides and (
        overrides.get("prior_fraction") or overrides.get("label_epsilon", 0) is None
    ):
        # the preset's correction, where nothing is left to correct (no label DP) or no
        # common flip rate is (RRWithPrior)
        overrides["forward_loss"] = False
    return replace(policy, **cast(Any, overrides))  # checked once, whatever the order
