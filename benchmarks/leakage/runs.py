"""A real training run whose downlink is recorded as party A receives it.

Party A is ``party_a.trainer.PartyATrainer``; party B is the product's ``Service`` on its
own SQLite file with the privacy policy under test, reached through
``party_b.inprocess.InProcessTransport``. ``RecordingTransport`` sits between them and
decodes every step reply's bytes (``shared.codec``), which are exactly what an HTTP party A
would get: the attacks read those gradients. The labels of each step's rows are read from
party B's side only to score the attack afterwards.
"""

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from experiments.runner import EXPERIMENT_LIMITS, RunConfig
from experiments.tasks import load_task
from party_a.bottom import StepResult
from party_a.config import load_config
from party_a.errors import problem_from_body
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer, TrainSummary
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.privacy import parse_policy
from shared import codec

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
    """What party A received per step, and (benchmark side) the true labels of its rows."""

    grads: list[NDArray[np.float32]] = field(default_factory=list)  # (rows, d) per step
    labels: list[NDArray[np.int64]] = field(default_factory=list)  # (rows,) per step
    losses: list[float] = field(default_factory=list)  # as the reply carried them
    metrics: list[dict[str, float]] = field(default_factory=list)
    model_auc: float = float("nan")
    downlink_bytes: int = 0
    auc_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out AUC)


class RecordingTransport(InProcessTransport):
    """The in-process transport, recording each step reply as party A decodes it."""

    def __init__(self, inner: InProcessTransport, recorded: Recorded) -> None:
        super().__init__(inner.service, inner.caller, problem=problem_from_body)
        self.recorded = recorded

    def step(self, run_id: str, body: bytes) -> bytes:
        answer = super().step(run_id, body)
        reply = codec.decode_step_response(answer)
        state = self.service.context.cache.owned(self.caller, run_id)
        rows = state.label_rows[state.batch(reply.step).positions]
        targets = self.service.context.labels.targets(rows).numpy().astype(np.int64)
        self.recorded.grads.append(reply.grad)
        self.recorded.labels.append(targets)
        self.recorded.losses.append(reply.loss)
        self.recorded.metrics.append(dict(reply.metrics))
        self.recorded.downlink_bytes += len(answer)
        return answer


def train_recorded(run: LeakRun, workdir: Path) -> Recorded:
    """Train ``run`` end to end; the downlink as received, and the held-out model AUC.

    Runs of one task share ``workdir``: party B's database (each run a new service on it,
    with the run's policy, as after a restart with another switch) and party A's store, so
    the private set intersection runs once per task and is cached after (it costs more CPU
    than a short training run).
    """
    task = load_task(run.task)
    overrides: dict[str, Any] = run.party_a_config().party_a_config(task)
    # party A's store keeps every run under its name: a fresh one per training
    name = f"{run.task}-{run.downlink}-{run.privacy}-s{run.seed}"[:110]
    overrides["run.name"] = f"{name}-{uuid.uuid4().hex[:8]}"
    overrides["run.downlink"] = run.downlink
    overrides["run.checkpoint_interval"] = run.steps
    recorded = Recorded()
    workdir.mkdir(parents=True, exist_ok=True)
    service, caller = in_process_party_b(
        task.labels,
        workdir / "party_b.sqlite",
        limits=EXPERIMENT_LIMITS,
        privacy=parse_policy(run.privacy),
    )
    inner = InProcessTransport(service, caller, problem=problem_from_body)
    trainer = PartyATrainer(
        config=load_config(None, overrides),
        features=task.features,
        transport=RecordingTransport(inner, recorded),
        store=LocalStore.in_directory(workdir / "party_a"),
        server="in-process",
    )
    if run.eval_every:

        def evaluate_now(result: StepResult, summary: TrainSummary) -> None:
            if summary.last_step % run.eval_every == 0 and summary.last_step < run.steps:
                auc = float(trainer.evaluate().metrics["auc"])
                recorded.auc_curve.append((summary.last_step, auc))

        trainer.on_step = evaluate_now
    try:
        trainer.prepare()
        trainer.train()
        recorded.model_auc = float(trainer.evaluate().metrics["auc"])
        recorded.auc_curve.append((run.steps, recorded.model_auc))
        trainer.finish()
    finally:
        trainer.close()
    return recorded
