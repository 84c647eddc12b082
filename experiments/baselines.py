"""Baselines that are *not* the product: FedAvg and the party-B-only model.

Kept apart on purpose. Neither runs through party A / party B: FedAvg trains the whole split
model (bottom + top) on every client, and the party-B-only model is what the label holder
could train on its own columns without party A. Both use the same samples, the same
held-out set and the same bits accounting as the split runs (``experiments.runner``).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from experiments.tasks import TaskData, load_task
from party_b.top import TopTrainer
from shared.accounting import PAPER_PHI
from shared.models import build_bottom, build_top, cut_dim, output_kwarg, takes_tokens
from shared.schedule import split_train_eval

__all__ = ["FedAvgConfig", "PartyBOnlyConfig", "run_fedavg", "run_party_b_only"]


def _aligned_order(ids: list[str]) -> np.ndarray:
    """Rows in the order both parties align them (by raw id), so that ``split_train_eval``
    with the run seed draws exactly the held-out set of the split runs."""
    return np.argsort(np.asarray(ids, dtype=str), kind="stable")


def _evaluate(top: TopTrainer, z: Tensor, targets: Tensor, side: Tensor | None) -> dict[str, Any]:
    """Held-out metrics computed by party B's own code (accuracy, AUC, recall@5)."""
    outcome = top.evaluate(z, targets, side)
    return {
        "eval_loss": outcome.loss,
        "eval_n": outcome.n,
        **{f"eval_{k}": v for k, v in outcome.metrics.items()},
    }


class _FullModel(nn.Module):
    """bottom + top of a split model in one module (FedAvg trains it whole on each client)."""

    def __init__(self, task: TaskData, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.bottom = build_bottom(task.model, **task.bottom)
        d = cut_dim(task.model, **task.bottom)
        self.top = build_top(task.model, cut_dim=d, **{**task.top, **_output_kwarg(task)})

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.top(self.bottom(x))
        return out


def _output_kwarg(task: TaskData) -> dict[str, int]:
    return {output_kwarg(task.model): task.labels.num_outputs}


def _inputs(task: TaskData, rows: np.ndarray) -> Tensor:
    x = torch.from_numpy(np.ascontiguousarray(task.features.x[rows]))
    return x.long() if takes_tokens(task.model) else x.float()


# ---------------------------------------------------------------------------------------------
# FedAvg
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FedAvgConfig:
    """McMahan et al.'s FedAvg with the split model trained whole on every client."""

    task: str
    rounds: int
    clients_per_round: int
    batch_size: int  # local mini-batch
    local_epochs: int
    lr: float  # client SGD learning rate; the server takes the weighted average (lr 1)
    seed: int = 0
    eval_fraction: float = 0.1
    eval_every: int = 10
    task_options: dict[str, Any] = field(default_factory=dict)
    method: str = "fedavg"

    @property
    def key(self) -> str:
        return f"{self.task}-fedavg-E{self.local_epochs}-s{self.seed}-T{self.rounds}"


def run_fedavg(config: FedAvgConfig) -> dict[str, Any]:
    """FedAvg: per round, sample clients, train locally, average by sample count.

    Uplink in the paper's accounting: every sampled client uploads the whole model,
    |w| floats of 64 bits, per round.
    """
    started = time.perf_counter()
    task = load_task(config.task, **config.task_options)
    if task.features.groups is None:
        raise ValueError(f"task {config.task} has no clients")
    order = _aligned_order(task.features.ids)
    train_pos, eval_pos = split_train_eval(
        len(order), seed=config.seed, eval_fraction=config.eval_fraction
    )
    train_rows, eval_rows = order[train_pos], order[eval_pos]
    groups = np.asarray(task.features.groups, dtype=str)
    clients = sorted(set(groups[train_rows].tolist()))
    members = {c: train_rows[groups[train_rows] == c] for c in clients}
    model = _FullModel(task, config.seed)
    params = sum(p.numel() for p in model.parameters())
    top_eval = TopTrainer(
        model=task.model,
        top_kwargs={**task.top, **_output_kwarg(task)},
        cut_dim=cut_dim(task.model, **task.bottom),
        optimizer={"name": "sgd", "lr": config.lr},
        task=task.labels.task,
        seed=config.seed,
        accuracy_excludes=task.labels.accuracy_excludes,
        prediction_excludes=task.labels.prediction_excludes,
    )
    rng = np.random.default_rng([config.seed, 0xFEDA6])
    curve: list[dict[str, Any]] = []
    uplink = 0.0
    losses: list[float] = []
    for round_ in range(1, config.rounds + 1):
        chosen = sorted(
            rng.choice(
                len(clients), size=min(config.clients_per_round, len(clients)), replace=False
            ).tolist()
        )
        states, weights = [], []
        for c in chosen:
            local = copy.deepcopy(model)
            local.train()
            optimizer = torch.optim.SGD(local.parameters(), lr=config.lr)
            rows = members[clients[c]]
            for _ in range(config.local_epochs):
                for batch in np.array_split(
                    rng.permutation(rows), max(1, int(np.ceil(len(rows) / config.batch_size)))
                ):
                    logits = local(_inputs(task, batch))
                    loss, _n = top_eval._loss(logits, task.labels.targets(batch))
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()  # type: ignore[no-untyped-call]
                    optimizer.step()
                    losses.append(float(loss.detach()))
            states.append(local.state_dict())
            weights.append(len(rows))
        total = float(sum(weights))
        averaged = {
            k: sum(s[k].float() * (w / total) for s, w in zip(states, weights, strict=True))
            for k in states[0]
        }
        model.load_state_dict(averaged)
        uplink += len(chosen) * params * PAPER_PHI
        if round_ % config.eval_every == 0 or round_ == config.rounds:
            model.eval()
            top_eval.model.load_state_dict(model.top.state_dict())
            with torch.no_grad():
                z = torch.cat(
                    [
                        model.bottom(_inputs(task, part))
                        for part in np.array_split(eval_rows, max(1, len(eval_rows) // 256))
                    ]
                )
            metrics = _evaluate(top_eval, z, task.labels.targets(eval_rows), None)
            curve.append(
                {
                    "step": round_,
                    "train_loss": float(np.mean(losses)) if losses else None,
                    **metrics,
                    "paper_uplink_bits": uplink,
                    "seconds": time.perf_counter() - started,
                }
            )
            losses.clear()
    return {
        "key": config.key,
        "config": asdict(config),
        "task_notes": task.notes,
        "model_params": params,
        "final": {k: v for k, v in curve[-1].items() if k.startswith("eval_")},
        "curve": curve,
        "seconds": time.perf_counter() - started,
    }


# ---------------------------------------------------------------------------------------------
# Party B alone
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartyBOnlyConfig:
    """What the label holder gets from its own columns alone: an MLP on the guest features,
    trained with the split runs' batch size, steps, optimizer and held-out set."""

    task: str
    steps: int
    batch_size: int
    lr: float
    optimizer: str = "adam"
    hidden: int = 32
    seed: int = 0
    eval_fraction: float = 0.2
    eval_every: int = 50
    task_options: dict[str, Any] = field(default_factory=dict)
    method: str = "party_b_only"

    @property
    def key(self) -> str:
        return f"{self.task}-party_b_only-s{self.seed}-T{self.steps}"


def run_party_b_only(config: PartyBOnlyConfig) -> dict[str, Any]:
    started = time.perf_counter()
    task = load_task(config.task, **config.task_options)
    labels = task.labels
    order = _aligned_order(labels.ids)
    train_pos, eval_pos = split_train_eval(
        len(order), seed=config.seed, eval_fraction=config.eval_fraction
    )
    train_rows, eval_rows = order[train_pos], order[eval_pos]
    # party B's own columns are the top model's only input: a TabularTop with a zero-width cut
    # would do the same; a tabular_mlp top over a 1-wide constant cut keeps the product's code.
    top = TopTrainer(
        model="tabular_mlp",
        top_kwargs={
            "hidden": [config.hidden],
            "num_classes": labels.num_outputs,
            "side_features": labels.side_width,
        },
        cut_dim=1,
        optimizer={"name": config.optimizer, "lr": config.lr},
        task=labels.task,
        seed=config.seed,
    )
    rng = np.random.default_rng([config.seed, 0xB0])
    curve = []
    for step in range(1, config.steps + 1):
        rows = train_rows[rng.choice(len(train_rows), size=config.batch_size, replace=False)]
        top.train_step(
            torch.zeros(len(rows), 1), labels.targets(rows), labels.side(rows), dropout_seed=step
        )
        if step % config.eval_every == 0 or step == config.steps:
            metrics = _evaluate(
                top,
                torch.zeros(len(eval_rows), 1),
                labels.targets(eval_rows),
                labels.side(eval_rows),
            )
            curve.append({"step": step, **metrics, "seconds": time.perf_counter() - started})
    return {
        "key": config.key,
        "config": asdict(config),
        "task_notes": task.notes,
        "final": {k: v for k, v in curve[-1].items() if k.startswith("eval_")},
        "curve": curve,
        "seconds": time.perf_counter() - started,
    }
