"""Label-leakage attacks party A can run on what it receives (no label knowledge).

Party A sees, per training step, the ``(rows, d)`` gradient of the loss w.r.t. the cut-layer
activations it sent, one row per sample of the batch, and the reply's loss where the policy
shows it; it knows which of its rows each step held, its own features, and after training
the scores ``predict`` gives it. For binary classification row i of the gradient is
``(p_i - y_i) u_i`` (``u_i`` the gradient of the logit difference w.r.t. the activation):
its direction and size depend on the label the top model trained on.

Per batch (Li et al., "Label leakage and protection in two-party split learning", ICLR
2022; the principal split is the outside probe of issue 16), one score per row and step:

- ``norm``: ||g_i||; ``direction``: cos(g_i, largest-norm row); ``principal``: projection
  on the batch's top right singular vector.

Across steps (each row is visited about steps * batch / rows times; these pool its visits):

- ``chained``: the projection on the batch's top singular vector, its sign carried from step
  to step (each step's direction is turned to agree with a running mean of the previous
  ones), averaged over the row's visits;
- ``energy``: the row's energy outside the batch's top singular direction, relative to the
  batch's median, averaged (in logs) over its visits (Marvell adds noise across that
  direction to one class only);
- ``loss``: the reply's batch loss, detrended, averaged over the batches the row was in;
- ``chained+knn``, ``energy+knn``: those scores smoothed over the row's 10 nearest
  neighbours in party A's own feature space;
- ``probe`` (active party A only): ``chained`` on the steps where party A sent its probe.

A per-batch score is pooled too: standardised within its batch, turned by the batch's sign,
averaged over the row's visits. The sign is the one thing a label-free attacker has to
guess. ``oracle``: the sign that agrees with the true labels (per batch for per-batch
scores, once per run for the others): an upper bound. ``predict``: the sign of the score's
correlation with the attacker's own ``predict`` scores on the same rows: what party A can do.

Each pooled score is scored by AUC over the run's training rows: the ordinary rows against
their true labels (``leak_auc``), and the canaries (``benchmarks.leakage.runs``) against
their coin-flip labels (``canary_auc``), with the sign chosen without looking at canaries.
The benchmark reads labels only to score; no attack sees them.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from sklearn.neighbors import NearestNeighbors

from benchmarks.leakage.runs import Recorded

__all__ = [
    "BATCH_ATTACKS",
    "SIGNS",
    "AttackResult",
    "attack_run",
    "batch_auc",
    "chance_auc",
    "cross_step_scores",
    "drawn_auc",
]

Scores = NDArray[np.float64]
SIGNS = ("oracle", "predict")
NEIGHBOURS = 10


def roc_auc_score(labels: NDArray[np.int64], scores: Scores) -> float:
    """The AUC of ``scores`` against binary ``labels`` (ties count one half), by the rank-sum
    formula: sklearn's answer, a few hundred times faster on a 256-row batch."""
    positive = labels == 1
    n1 = int(positive.sum())
    n0 = len(labels) - n1
    _, where, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2)[where]  # 1-based, ties at their mean rank
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def norm_scores(grad: NDArray[np.float64]) -> Scores:
    """Li et al.'s norm scoring: ||g_i|| (the minority class is the one the model gets wrong
    more often, with larger gradients)."""
    norms: Scores = np.linalg.norm(grad, axis=1)
    return norms


def direction_scores(grad: NDArray[np.float64]) -> Scores:
    """Li et al.'s direction scoring: cos(g_i, g_ref), the reference being the batch's
    largest-norm row."""
    norms = np.linalg.norm(grad, axis=1)
    ref = grad[int(np.argmax(norms))]
    cosines: Scores = (grad @ ref) / np.maximum(norms * np.linalg.norm(ref), 1e-300)
    return cosines


def _top_direction(grad: NDArray[np.float64]) -> NDArray[np.float64]:
    """The (d,) top right singular vector of the (uncentred) batch gradient."""
    if not np.any(grad):
        return np.zeros(grad.shape[1])
    _, _, vt = np.linalg.svd(grad, full_matrices=False)
    top: NDArray[np.float64] = vt[0]
    return top


def principal_scores(grad: NDArray[np.float64]) -> Scores:
    """Projection of each row on the batch's top right singular vector."""
    projections: Scores = grad @ _top_direction(grad)
    return projections


def energy_scores(grad: NDArray[np.float64]) -> Scores:
    """log of each row's energy outside the top singular direction, over the batch median."""
    top = _top_direction(grad)
    residual = grad - np.outer(grad @ top, top)
    energy = np.einsum("ij,ij->i", residual, residual) + 1e-300
    logs: Scores = np.log(energy / np.median(energy))
    return logs


BATCH_ATTACKS: dict[str, Callable[[NDArray[np.float64]], Scores]] = {
    "norm": norm_scores,
    "direction": direction_scores,
    "principal": principal_scores,
}


@dataclass(frozen=True)
class AttackResult:
    """One attack on one run: AUCs per sign rule, on the ordinary rows and the canaries;
    ``batch_auc``: the per-batch measure of the previous benchmark (per-batch attacks only:
    per-batch AUC with the best sign per batch, mean weighted by rows)."""

    attack: str
    leak_auc: dict[str, float]  # sign rule -> AUC over the ordinary training rows
    canary_auc: dict[str, float]  # sign rule -> AUC over the canaries
    batch_auc: float | None = None


class _Run:
    """A recorded run as the attacks read it: rows are positions in the aligned id list."""

    def __init__(self, rec: Recorded) -> None:
        self.rec = rec
        self.n = len(rec.labels)
        self.train = rec.train_positions
        self.ordinary = self.train[~rec.canary[self.train]]
        self.canaries = self.train[rec.canary[self.train]]
        self.predicted = np.full(self.n, np.nan)
        if len(rec.predict_scores):
            self.predicted[self.train] = rec.predict_scores
        self.grads = [g.astype(np.float64) for g in rec.grads]
        self.probe = rec.probe if rec.probe else [False] * len(rec.grads)
        self.neighbours: dict[bytes, NDArray[np.int64]] = {}  # rows -> their 10 neighbours

    def batch_sign(self, rows: NDArray[np.int64], scores: Scores, rule: str) -> float:
        """The sign a per-batch score gets under ``rule`` (oracle: from the batch's ordinary
        rows' true labels; predict: from its correlation with the predict scores)."""
        if rule == "oracle":
            keep = ~self.rec.canary[rows]
            y = self.rec.labels[rows][keep]
            if len(np.unique(y)) < 2:
                return 1.0
            return 1.0 if roc_auc_score(y, scores[keep]) >= 0.5 else -1.0
        return _correlation_sign(scores, self.predicted[rows])

    def run_sign(self, scores: Scores, rule: str) -> float:
        """The one sign of a pooled score under ``rule``."""
        rows = self.ordinary[np.isfinite(scores[self.ordinary])]
        if rule == "oracle":
            return 1.0 if roc_auc_score(self.rec.labels[rows], scores[rows]) >= 0.5 else -1.0
        return _correlation_sign(scores[rows], self.predicted[rows])

    def result(
        self, attack: str, scores: dict[str, Scores], batch: float | None = None
    ) -> AttackResult:
        """AUCs of pooled ``scores`` (sign rule -> (n,) oriented score, NaN where unvisited)."""
        return AttackResult(
            attack,
            {rule: self._auc(self.ordinary, s) for rule, s in scores.items()},
            {rule: self._auc(self.canaries, s) for rule, s in scores.items()},
            batch,
        )

    def _auc(self, rows: NDArray[np.int64], scores: Scores) -> float:
        rows = rows[np.isfinite(scores[rows])]
        y = self.rec.labels[rows]
        if len(np.unique(y)) < 2:
            return float("nan")
        return float(roc_auc_score(y, scores[rows]))


def _correlation_sign(scores: Scores, reference: Scores) -> float:
    ok = np.isfinite(reference) & np.isfinite(scores)
    if ok.sum() < 3 or np.std(scores[ok]) == 0 or np.std(reference[ok]) == 0:
        return 1.0
    return 1.0 if np.corrcoef(scores[ok], reference[ok])[0, 1] >= 0 else -1.0


def _pool(n: int, visits: list[tuple[NDArray[np.int64], Scores]]) -> Scores:
    """Mean over each row's visits of its per-visit scores; NaN for rows never visited."""
    total, count = np.zeros(n), np.zeros(n)
    for rows, scores in visits:
        np.add.at(total, rows, scores)
        np.add.at(count, rows, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        pooled: Scores = total / count
    return pooled


def _standardised(scores: Scores) -> Scores:
    sd = float(np.std(scores))
    out: Scores = (scores - np.mean(scores)) / sd if sd > 0 else np.zeros_like(scores)
    return out


def _per_batch(run: _Run, name: str) -> AttackResult:
    attack = BATCH_ATTACKS[name]
    steps = [i for i, p in enumerate(run.probe) if not p]
    per_step = [(run.rec.positions[i], attack(run.grads[i])) for i in steps]
    pooled = {}
    for rule in SIGNS:
        visits = [(rows, run.batch_sign(rows, s, rule) * _standardised(s)) for rows, s in per_step]
        pooled[rule] = _pool(run.n, visits)
    return run.result(
        name, pooled, batch_auc([s for _, s in per_step], [run.rec.labels[r] for r, _ in per_step])
    )


def _chained(run: _Run, steps: list[int]) -> Scores:
    """Projections on each step's top direction, turned to agree with the running mean of
    the directions before (one unknown sign for the whole run), pooled per row."""
    reference: NDArray[np.float64] | None = None
    visits = []
    for i in steps:
        top = _top_direction(run.grads[i])
        if reference is not None and top @ reference < 0:
            top = -top
        reference = top if reference is None else 0.5 * reference + 0.5 * top
        reference /= max(float(np.linalg.norm(reference)), 1e-300)
        projections = run.grads[i] @ top
        scale = float(np.sqrt(np.mean(projections**2)))
        visits.append((run.rec.positions[i], projections / scale if scale > 0 else projections))
    return _pool(run.n, visits)


def _energy(run: _Run, steps: list[int]) -> Scores:
    return _pool(run.n, [(run.rec.positions[i], energy_scores(run.grads[i])) for i in steps])


def _loss(run: _Run, steps: list[int]) -> Scores | None:
    """Each step's reply loss minus the median of the 21 steps around it, pooled; None when
    the replies carry no loss."""
    losses = np.array([run.rec.losses[i] for i in steps])
    if not len(losses) or not np.isfinite(losses).all():
        return None
    trend = np.array([np.median(losses[max(0, k - 10) : k + 11]) for k in range(len(losses))])
    detrended = losses - trend
    return _pool(
        run.n,
        [
            (run.rec.positions[i], np.full(len(run.rec.positions[i]), d))
            for i, d in zip(steps, detrended, strict=True)
        ],
    )


def _smoothed(run: _Run, scores: Scores) -> Scores:
    """Each training row's score averaged with its nearest neighbours' in party A's features
    (the neighbours among the rows that have a score; found once per set of rows)."""
    rows = run.train[np.isfinite(scores[run.train])]
    key = rows.tobytes()
    if key not in run.neighbours:
        finder = NearestNeighbors(n_neighbors=min(NEIGHBOURS, len(rows)))
        finder.fit(run.rec.features[rows])
        run.neighbours[key] = finder.kneighbors(run.rec.features[rows])[1]
    out = np.full(run.n, np.nan)
    out[rows] = scores[rows][run.neighbours[key]].mean(axis=1)
    return out


def _signed(run: _Run, scores: Scores) -> dict[str, Scores]:
    return {rule: run.run_sign(scores, rule) * scores for rule in SIGNS}


def attack_run(rec: Recorded) -> list[AttackResult]:
    """Every attack on one recorded run (those that apply: ``loss`` needs reply losses,
    ``probe`` an active party A)."""
    run = _Run(rec)
    honest = [i for i, p in enumerate(run.probe) if not p]
    probes = [i for i, p in enumerate(run.probe) if p]
    results = [_per_batch(run, name) for name in BATCH_ATTACKS]
    chained = _chained(run, honest)
    energy = _energy(run, honest)
    results.append(run.result("chained", _signed(run, chained)))
    results.append(run.result("energy", _signed(run, energy)))
    results.append(run.result("chained+knn", _signed(run, _smoothed(run, chained))))
    results.append(run.result("energy+knn", _signed(run, _smoothed(run, energy))))
    loss = _loss(run, honest)
    if loss is not None:
        results.append(run.result("loss", _signed(run, loss)))
    if probes:
        results.append(run.result("probe", _signed(run, _chained(run, probes))))
    return results


def cross_step_scores(rec: Recorded) -> Scores:
    """The cross-step attack (``chained``) on one run's honest steps: a pooled score per
    aligned row (NaN where unvisited), with the oracle's sign, standardised over the visited
    rows; the multi-run attack (``benchmarks.leakage.multirun``) sums it over runs."""
    run = _Run(rec)
    scores = _chained(run, [i for i, probe in enumerate(run.probe) if not probe])
    seen = np.isfinite(scores)
    out: Scores = np.full(len(scores), np.nan)
    if seen.any():
        sign = run.run_sign(scores, "oracle")
        out[seen] = sign * _standardised(scores[seen])
    return out


def predict_auc(rec: Recorded) -> dict[str, float]:
    """What the attacker's ``predict`` scores alone give on its training rows (ordinary rows
    and canaries): the model's own inference, for comparison with the attacks."""
    run = _Run(rec)
    if not len(rec.predict_scores):
        return {"ordinary": float("nan"), "canary": float("nan")}
    return {
        "ordinary": run._auc(run.ordinary, run.predicted),
        "canary": run._auc(run.canaries, run.predicted),
    }


def batch_auc(scores: list[Scores], labels: list[NDArray[np.int64]]) -> float:
    """The previous benchmark's measure: per batch max(AUC, 1 - AUC), averaged weighted by
    the batch's rows; batches of one class are skipped."""
    total = weight = 0.0
    for s, y in zip(scores, labels, strict=True):
        if len(np.unique(y)) < 2:
            continue
        auc = float(roc_auc_score(y, s))
        total += len(y) * max(auc, 1.0 - auc)
        weight += len(y)
    return total / weight if weight else float("nan")


def drawn_auc(rec: Recorded) -> float:
    """The AUC of the labels party B trained on (randomized under label DP) as a score of
    the canaries' labels: what the run's draw itself gives away on them. Its expectation is
    the label-DP bound; over ~90 canaries (breast) it scatters by a few hundredths."""
    run = _Run(rec)
    rows = run.canaries
    if not len(rows) or len(np.unique(rec.labels[rows])) < 2:
        return float("nan")
    return float(roc_auc_score(rec.labels[rows], rec.randomized[rows].astype(np.float64)))


def chance_auc(rec: Recorded, seed: int = 0) -> dict[str, float]:
    """The AUCs of scores that know nothing (uniform noise) with the oracle sign, on the
    ordinary rows and the canaries: the floors of ``leak_auc`` and ``canary_auc``."""
    run = _Run(rec)
    noise = np.random.default_rng(seed).random(run.n)
    oriented = run.run_sign(noise, "oracle") * noise
    return {
        "ordinary": run._auc(run.ordinary, oriented),
        "canary": run._auc(run.canaries, oriented),
    }
