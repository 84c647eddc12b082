"""Label-leakage attacks party A can run on the gradients it receives (no label knowledge).

Party A sees, per training step, the ``(rows, d)`` gradient of the loss w.r.t. the cut-layer
activations it sent, one row per sample of the batch. For binary classification with a
softmax or sigmoid top, row i is ``J_i^T (p_i - y_i)``: its direction and size depend on the
label y_i, which is what these attacks read (Li et al., "Label leakage and protection in
two-party split learning", ICLR 2022; the principal-direction split is the outside probe of
issue 16). Each attack gives one score per row; the score separates the two classes up to
an unknown sign per batch, so an attack's AUC is taken per batch as ``max(auc, 1 - auc)``
(the attacker's best sign flip) and averaged over batches, weighted by rows.

The benchmark keeps the labels (only to score the attack); an attack never sees them.
"""

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray
from sklearn.metrics import roc_auc_score

__all__ = ["ATTACKS", "AttackScores", "chance_auc", "leak_auc", "score_batches"]

Scores = NDArray[np.float64]
Attack = Callable[[NDArray[np.float32]], Scores]


def norm_scores(grad: NDArray[np.float32]) -> Scores:
    """Li et al.'s norm scoring: ||g_i||. The minority class gets the larger gradients
    (its rows are the ones the model gets wrong more often)."""
    norms: Scores = np.linalg.norm(grad.astype(np.float64), axis=1)
    return norms


def direction_scores(grad: NDArray[np.float32]) -> Scores:
    """Li et al.'s direction scoring: cos(g_i, g_ref), the reference being the batch's
    largest-norm row (party A needs no known label: the sign flip absorbs the reference's
    class). Rows of one class point one way, the other class the other way."""
    g = grad.astype(np.float64)
    norms = np.linalg.norm(g, axis=1)
    ref = g[int(np.argmax(norms))]
    cosines: Scores = (g @ ref) / np.maximum(norms * np.linalg.norm(ref), 1e-300)
    return cosines


def principal_scores(grad: NDArray[np.float32]) -> Scores:
    """The principal-direction split: each row's projection on the top right singular
    vector of the batch's gradients (uncentred, so the axis joining the two classes'
    opposite directions is found even when one class dominates)."""
    g = grad.astype(np.float64)
    if not np.any(g):
        return np.zeros(len(g))
    _, _, vt = np.linalg.svd(g, full_matrices=False)
    projections: Scores = g @ vt[0]
    return projections


ATTACKS: dict[str, Attack] = {
    "norm": norm_scores,
    "direction": direction_scores,
    "principal": principal_scores,
}


AttackScores = dict[str, list[Scores]]  # attack -> one score array per batch


def score_batches(grads: Sequence[NDArray[np.float32]]) -> AttackScores:
    """Every attack's scores for every batch (``grads``: one (rows, d) array per step)."""
    return {name: [attack(g) for g in grads] for name, attack in ATTACKS.items()}


def leak_auc(scores: Sequence[Scores], labels: Sequence[NDArray[np.int64]]) -> float:
    """The attacker's AUC: per batch max(auc, 1 - auc), averaged weighted by the batch's
    rows; batches holding one class only carry no AUC and are skipped."""
    total = weight = 0.0
    for s, y in zip(scores, labels, strict=True):
        if len(np.unique(y)) < 2:
            continue
        auc = float(roc_auc_score(y, s))
        total += len(y) * max(auc, 1.0 - auc)
        weight += len(y)
    if not weight:
        raise ValueError("no batch holds both classes: the leak AUC is undefined")
    return total / weight


def chance_auc(labels: Sequence[NDArray[np.int64]], seed: int = 0) -> float:
    """The same measure for scores that know nothing (uniform noise): the floor that a best
    sign flip per batch gives for free (about 0.53 for 256 rows, 0.58 for 32)."""
    rng = np.random.default_rng(seed)
    return leak_auc([rng.random(len(y)) for y in labels], labels)
