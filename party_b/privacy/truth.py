"""A run's quality under label DP, for each party: party A's estimate, party B's truth.

Under label DP every evaluation party A gets is on the run's randomized labels: a model
with held-out AUC 0.86 on breast read 0.49 on them (the audit of issue 33). Two things
make the quality visible without weakening the guarantee:

- **party A's reply** also carries, for two classes, ``label_rate``: the share of the
  evaluated rows whose randomized label is class 1. With the flip rate, which is public
  (``RunPrivacyOut.label_keep``), party A can then debias the AUC and the accuracy it got
  into estimates of the true-label ones (``party_a.cli.report``). It is a function of the
  randomized labels, so post-processing: the run's epsilon covers it.
- **party B's operator**, who owns the labels, gets every evaluation scored against the
  true labels too (``operator_evaluation``; table ``operator_evaluations``), shown by
  ``fedlite-b runs show``, ``fedlite-b evaluate`` and the dashboard, never by a route party
  A can call.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from party_b.privacy.secret import RunPrivacy

if TYPE_CHECKING:
    from party_b.labels import LabelSource
    from party_b.top import TopTrainer

__all__ = ["label_rate", "operator_evaluation"]


def label_rate(privacy: RunPrivacy, targets: Tensor, num_classes: int) -> dict[str, float]:
    """``{"label_rate": share of class 1 among ``targets`` (n,)}``, the randomized labels an
    evaluation scored, under label DP with two classes; ``{}`` otherwise (without label DP
    the reply's metrics are on the true labels already; with more classes there is no AUC
    to debias)."""
    if privacy.policy.label_epsilon is None or num_classes != 2 or targets.dim() != 1:
        return {}
    return {"label_rate": float((targets == 1).double().mean()) if len(targets) else float("nan")}


def operator_evaluation(
    trainer: "TopTrainer",
    z: Tensor,
    labels: "LabelSource",
    rows: np.ndarray,
    side: Tensor | None,
    keys: Sequence[bytes],
) -> dict[str, object]:
    """The operator's view of an evaluation: the (rows, d) activations ``z`` of label rows
    ``rows`` (n,), aligned keys ``keys``, scored against the true labels; the fields of
    ``store.log_operator_evaluation``. The model's class probabilities are kept where each
    sample is one row of a classification (not for tags or token sequences)."""
    outcome = trainer.evaluate(z, labels.targets(rows), side)
    keep = labels.task == "classification" and len(keys) == z.shape[0]
    scores = trainer.predict(z, side).numpy().astype(np.float32) if keep else None
    return {
        "n": outcome.n,
        "loss": _finite(outcome.loss),
        "metrics": {k: _finite(v) for k, v in outcome.metrics.items()},
        "keys": b"".join(keys) if scores is not None else None,
        "scores": scores.tobytes() if scores is not None else None,
        "classes": int(scores.shape[1]) if scores is not None else labels.num_outputs,
    }


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None
