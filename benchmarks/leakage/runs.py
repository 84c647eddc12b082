"""A real training run, recorded as party A receives it, for the attacks to read.

Party A is ``party_a.trainer.PartyATrainer``; party B is the product's ``Service`` on its
own SQLite file with the privacy policy under test, reached through
``party_b.inprocess.InProcessTransport``. ``RecordingTransport`` sits between them and
decodes every step reply's bytes (``shared.codec``), which are exactly what an HTTP party A
would get. What the attacker (party A) has: the decoded replies, which of its rows each
step held, its own features, and the scores ``predict`` gives it after training. What only
the benchmark reads, to score the attacks: the labels party B trained on and which rows are
canaries. The model's quality is measured at party B on the true held-out labels (under
label DP, the evaluation party A gets back is on the run's randomized labels).

**Canaries.** A share of the training rows (``canary_fraction``) get a label drawn uniformly
at random, independent of every feature, before training. An attack's AUC on them measures
what training leaks of a row's own label: generalisation cannot predict a canary's label, so
it is exactly the quantity label DP bounds (e^eps / (1 + e^eps)). On the other rows an
attack also profits from what the model predicts from the features (docs/PRIVACY.md).

**Active party A** (``active=True``): on every second step party A sends, instead of its
rows' activations, the batch's mean activation for every row (a probe that party A
chooses): the top model then sees identical inputs from party A, and the gradient rows
differ only through party B's side features and the labels.
"""

import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from experiments.runner import EXPERIMENT_LIMITS, RunConfig
from experiments.tasks import load_task
from party_a.bottom import BottomTrainer, PendingStep, StepResult
from party_a.config import load_config
from party_a.errors import ProblemResponse, problem_from_body
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer, TrainSummary
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.labels import LabelTable
from party_b.privacy import parse_policy
from party_b.privacy.label_dp import run_targets
from party_b.service import activations
from shared import codec
from shared.schedule import step_seed

__all__ = ["LeakRun", "Recorded", "RecordingTransport", "train_recorded"]


@dataclass(frozen=True)
class LeakRun:
    """One run of the leakage benchmark: a task's product setting, a downlink, a policy."""

    task: str  # "breast" or "default_credit" (experiments.tasks)
    steps: int
    batch_size: int
    q: int
    L: int
    privacy: str = "off"  # FEDLITE_B_PRIVACY text
    downlink: str = "float32"  # the run's downlink representation (shared.wire.downlink)
    lam: float = 1e-3
    lr: float = 0.003
    seed: int = 0
    eval_fraction: float = 0.2
    eval_every: int = 0  # also evaluate the model every this many steps (learning curve)
    canary_fraction: float = 0.0  # training rows whose label is replaced by a coin flip
    active: bool = False  # party A probes the top model on every second step

    def party_a_config(self) -> RunConfig:
        return RunConfig(
            task=self.task,
            method="fedlite",
            steps=self.steps,
            batch_size=self.batch_size,
            lr_bottom=self.lr,
            lr_top=self.lr,
            optimizer="adam",
            seed=self.seed,
            q=self.q,
            L=self.L,
            lam=self.lam,
            eval_fraction=self.eval_fraction,
        )


@dataclass
class Recorded:
    """What party A received and had, per step and at the end, and (benchmark side only)
    the labels of its rows. Rows are positions in the run's aligned id list."""

    grads: list[NDArray[np.float32]] = field(default_factory=list)  # (rows, d) per step
    positions: list[NDArray[np.int64]] = field(default_factory=list)  # (rows,) per step
    probe: list[bool] = field(default_factory=list)  # the step was an active probe
    losses: list[float] = field(default_factory=list)  # as the reply carried them
    metrics: list[dict[str, float]] = field(default_factory=list)
    train_positions: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    features: NDArray[np.float32] = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    predict_scores: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    predict_ids: str = ""  # which ids carried predict's requests: "train" or "eval"
    # bench only: the labels of every aligned row (canaries' coin flips included), and the
    # ones party B trained on (randomized under label DP)
    labels: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    randomized: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))  # bench
    canary: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))  # bench
    model_auc: float = float("nan")  # held-out AUC on the true labels, computed at party B
    downlink_bytes: int = 0
    auc_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out AUC)


class RecordingTransport(InProcessTransport):
    """The in-process transport, recording each step reply as party A decodes it, and the
    model's held-out AUC on the true labels at each evaluation."""

    def __init__(self, inner: InProcessTransport, recorded: Recorded, truth: LabelTable) -> None:
        super().__init__(inner.service, inner.caller, problem=problem_from_body)
        self.recorded = recorded
        self.truth = truth  # party B's table before canaries (the held-out rows have none)
        self.true_auc = float("nan")

    def step(self, run_id: str, body: bytes) -> bytes:
        answer = super().step(run_id, body)
        reply = codec.decode_step_response(answer)
        self.recorded.grads.append(reply.grad)
        self.recorded.losses.append(reply.loss)
        self.recorded.metrics.append(dict(reply.metrics))
        self.recorded.downlink_bytes += len(answer)
        return answer

    def evaluate(self, run_id: str, body: bytes, split: str = "eval") -> bytes:
        answer = super().evaluate(run_id, body, split)
        # the benchmark's measure: the same activations against the true labels, at party B
        state = self.service.context.cache.owned(self.caller, run_id)
        request = activations.decode(
            codec.decode_evaluate_request, body, activations.decode_limits(EXPERIMENT_LIMITS)
        )
        positions = state.positions_of(split)
        rows = state.label_rows[positions]
        z = activations.dequantize(
            state.plan, 0, request.chunks, rows=len(positions), allow_raw=True
        )
        side = self.service.context.labels.side(rows) if state.trainer.model.side_features else None
        with state.lock:
            outcome = state.trainer.evaluate(z, self.truth.targets(rows), side)
        self.true_auc = float(outcome.metrics["auc"])
        return answer


def _probing(bottom: BottomTrainer, recorded: Recorded) -> None:
    """Make ``bottom`` an active party A: on even steps every row of the batch sends the
    batch's mean activation (the bottom model still gets the probe's gradient, through the
    mean)."""
    honest = bottom.request

    def request(step: int, x: np.ndarray, digest: bytes, **kwargs: Any) -> PendingStep:
        recorded.probe.append(step % 2 == 0)
        if step % 2:
            return honest(step, x, digest, **kwargs)
        bottom.model.train()
        z = bottom.model(bottom._input(x))
        probe = z.mean(dim=0, keepdim=True).expand(z.shape)
        sizes = kwargs.get("chunk_sizes")
        chunks, z_tilde = bottom._compress(probe, step, "kmeans", sizes)
        body = codec.encode_step_request(
            codec.StepRequest(step=step, batch_digest=digest, chunks=chunks),
            codebook_dtype=bottom.codebook_dtype,
            codewords=bottom.codewords,
        )
        rows = tuple(c.B for c in chunks)
        return PendingStep(step=step, z=probe, z_tilde=z_tilde, body=body, chunk_sizes=rows)

    bottom.request = request  # type: ignore[method-assign]


def _canaries(run: LeakRun, labels: LabelTable, label_rows: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Replace the labels of a seeded ``canary_fraction`` of the training rows (party B
    rows ``label_rows``) by coin flips, in place; the canary mask over ``label_rows``."""
    rng = np.random.default_rng(step_seed(run.seed, 0, "leakage-canaries"))
    chosen = rng.random(len(label_rows)) < run.canary_fraction
    labels.labels[label_rows[chosen]] = rng.integers(0, labels.num_outputs, int(chosen.sum()))
    return chosen


def _predict_scores(trainer: PartyATrainer, recorded: Recorded) -> None:
    """The attacker's scores for its training rows: P(class 1) from ``predict``, with the
    training rows' ids where the run's policy answers for them, else under held-out ids
    (party B then joins its side features of those rows: the attacker's best substitute)."""
    positions = recorded.train_positions
    data = trainer.data
    assert data is not None, "prepared"
    x = data.inputs(positions)
    chunks = trainer.bottom.activations(x, chunk_size=len(x))
    for carrier in ("train", "eval"):
        pool = positions if carrier == "train" else trainer.eval_pos
        ids = [data.aligned[p].hex() for p in np.resize(pool, len(positions))]
        body = codec.encode_predict_request(
            codec.PredictRequest(ids=ids, chunks=chunks),
            codebook_dtype=trainer.bottom.codebook_dtype,
        )
        try:
            answer = codec.decode_predict_response(trainer.transport.predict(trainer.run_id, body))
        except ProblemResponse as exc:
            if exc.status == 403 and carrier == "train":  # the policy refuses training ids
                continue
            raise
        recorded.predict_scores = answer.scores[:, 1].astype(np.float64)
        recorded.predict_ids = carrier
        return


def train_recorded(run: LeakRun, workdir: Path) -> Recorded:
    """Train ``run`` end to end; what party A received, and the model's held-out AUC.

    Runs of one task share ``workdir``: party B's database (each run a new service on it,
    with the run's policy, as after a restart with another switch) and party A's store, so
    the private set intersection runs once per task and is cached after (it costs more CPU
    than a short training run).
    """
    task = load_task(run.task)
    truth = task.labels
    assert isinstance(truth, LabelTable), "the leakage tasks are label tables"
    labels = replace(truth, labels=truth.labels.copy())  # canaries go into this copy only
    overrides: dict[str, Any] = run.party_a_config().party_a_config(task)
    # party A's store keeps every run under its name: a fresh one per training
    name = f"{run.task}-{run.privacy}-{'a' if run.active else 'p'}-s{run.seed}"[:110]
    overrides["run.name"] = f"{name}-{uuid.uuid4().hex[:8]}"
    overrides["run.downlink"] = run.downlink
    overrides["run.checkpoint_interval"] = run.steps
    recorded = Recorded()
    workdir.mkdir(parents=True, exist_ok=True)
    service, caller = in_process_party_b(
        labels,
        workdir / "party_b.sqlite",
        # no default budget: one token makes every setting's runs, each setting a draw
        limits=EXPERIMENT_LIMITS.model_copy(update={"epsilon_budget": 0.0}),
        privacy=parse_policy(run.privacy),
    )
    inner = InProcessTransport(service, caller, problem=problem_from_body)
    transport = RecordingTransport(inner, recorded, truth)
    trainer = PartyATrainer(
        config=load_config(None, overrides),
        features=task.features,
        transport=transport,
        store=LocalStore.in_directory(workdir / "party_a"),
        server="in-process",
    )
    if run.active:
        _probing(trainer.bottom, recorded)

    def after_step(result: StepResult, summary: TrainSummary) -> None:
        recorded.positions.append(trainer.batch(summary.last_step).positions.astype(np.int64))
        if run.eval_every and summary.last_step % run.eval_every == 0:
            if summary.last_step < run.steps:
                trainer.evaluate()
                recorded.auc_curve.append((summary.last_step, transport.true_auc))

    trainer.on_step = after_step
    try:
        trainer.prepare()
        state = service.context.cache.owned(caller, trainer.run_id)
        data = trainer.data
        assert data is not None, "prepared"
        recorded.train_positions = np.asarray(data.train_pos, dtype=np.int64)
        canary = _canaries(run, labels, state.label_rows[recorded.train_positions])
        recorded.canary = np.zeros(len(data.aligned), dtype=np.bool_)
        recorded.canary[recorded.train_positions[canary]] = True
        recorded.labels = labels.labels[state.label_rows].astype(np.int64)
        recorded.features = data.x[data.rows].astype(np.float32)
        trainer.train()
        trainer.evaluate()
        recorded.model_auc = transport.true_auc
        recorded.auc_curve.append((run.steps, recorded.model_auc))
        # the labels party B trained on (randomized under label DP), to check attacks against
        rows = state.label_rows
        trained_on = run_targets(
            state.privacy, labels.targets(rows), rows, labels.num_outputs, labels
        )
        recorded.randomized = trained_on.numpy().astype(np.int64)
        _predict_scores(trainer, recorded)
        trainer.finish()
    finally:
        trainer.close()
    return recorded
