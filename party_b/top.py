"""Party B's half of a training step: the top model, its loss, optimizer and metrics.

Pure torch: no HTTP, no database. The service (and the experiment harness, through the
service) feeds it dequantized activations z~ and gets back the loss, batch metrics and
d loss / d z~ for party A.

Losses are means over samples, so the gradient party A receives already carries 1/n per
sample; ``metrics["n"]`` reports that n so party A can scale its gradient correction the same
way (see shared.correction.correct_gradient's ``sample_weight``).
"""

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import Tensor

from shared.models import build_seeded, build_top, seed_dropout
from shared.training import make_optimizer, state_from_bytes, state_to_bytes

__all__ = ["DivergedError", "EvalOutcome", "StepOutcome", "TopTrainer"]

Task = Literal["classification", "multilabel", "sequence"]
IGNORE = -100  # sequence targets with this value (padding) take no part in loss or accuracy


class DivergedError(ValueError):
    """The loss or a gradient is NaN/Inf; the optimizer step was not taken."""


@dataclass(frozen=True)
class StepOutcome:
    loss: float  # mean loss over the n samples
    metrics: dict[str, float]  # at least "n"; "accuracy" where defined
    grad: Tensor  # (rows, d) d loss / d z~


@dataclass(frozen=True)
class EvalOutcome:
    n: int
    loss: float
    metrics: dict[str, float]


class TopTrainer:
    """Top model + optimizer of one run. Not thread-safe: the service holds a per-run lock."""

    def __init__(
        self,
        *,
        model: str,
        top_kwargs: dict[str, Any],
        cut_dim: int,
        optimizer: dict[str, Any],
        task: Task,
        seed: int,
        accuracy_excludes: tuple[int, ...] = (),
    ) -> None:
        """``accuracy_excludes``: target classes that count in the loss but not in accuracy
        (the out-of-vocabulary token of a next-token task)."""
        self.model = build_seeded(lambda: build_top(model, cut_dim=cut_dim, **top_kwargs), seed)
        self.optimizer = make_optimizer(self.model.parameters(), optimizer)
        self.task = task
        self.cut_dim = cut_dim
        self.accuracy_excludes = torch.tensor(accuracy_excludes, dtype=torch.int64)

    # ------------------------------------------------------------------ training

    def train_step(
        self, z_tilde: Tensor, targets: Tensor, side: Tensor | None, *, dropout_seed: int
    ) -> StepOutcome:
        """One optimizer step on the top model; returns the loss and d loss / d z~ (rows, d)."""
        self.model.train()
        seed_dropout(self.model, dropout_seed)
        z = z_tilde.detach().requires_grad_(True)
        logits = self.model(z, side)
        loss, n = self._loss(logits, targets)
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        assert z.grad is not None
        # Check before stepping: a rejected step must leave the model exactly as it was.
        if not (torch.isfinite(loss) and torch.isfinite(z.grad).all()):
            raise DivergedError(f"non-finite loss ({float(loss.detach())}) or gradient")
        self.optimizer.step()
        metrics = {"n": float(n), **self._batch_metrics(logits.detach(), targets)}
        return StepOutcome(loss=float(loss.detach()), metrics=metrics, grad=z.grad)

    # ------------------------------------------------------------------ serving

    @torch.no_grad()
    def evaluate(self, z_tilde: Tensor, targets: Tensor, side: Tensor | None) -> EvalOutcome:
        """Forward only: mean loss and metrics (accuracy; AUC for two classes; recall@5)."""
        self.model.eval()
        logits = self.model(z_tilde, side)
        loss, n = self._loss(logits, targets)
        metrics = self._batch_metrics(logits, targets)
        if self.task == "classification" and logits.shape[1] == 2:
            labels = targets.numpy()
            scores = torch.softmax(logits, dim=1)[:, 1].numpy()
            metrics["auc"] = (
                float(roc_auc_score(labels, scores))
                if len(np.unique(labels)) == 2
                else float("nan")
            )
        return EvalOutcome(n=n, loss=float(loss), metrics=metrics)

    @torch.no_grad()
    def predict(self, z_tilde: Tensor, side: Tensor | None) -> Tensor:
        """Forward only: (rows, C) probabilities (softmax; sigmoid per tag for multilabel)."""
        self.model.eval()
        logits = self.model(z_tilde, side)
        return torch.sigmoid(logits) if self.task == "multilabel" else torch.softmax(logits, 1)

    # ------------------------------------------------------------------ state

    def state(self) -> tuple[bytes, bytes]:
        return state_to_bytes(self.model.state_dict()), state_to_bytes(self.optimizer.state_dict())

    def load_state(self, model_state: bytes, optimizer_state: bytes) -> None:
        self.model.load_state_dict(state_from_bytes(model_state))
        self.optimizer.load_state_dict(state_from_bytes(optimizer_state))

    # ------------------------------------------------------------------ internals

    def _loss(self, logits: Tensor, targets: Tensor) -> tuple[Tensor, int]:
        """Mean loss over samples and the number of samples averaged."""
        if self.task == "multilabel":
            # Mean over tags as well as samples (torch's and Keras's default, which the paper's
            # SO Tag learning rate and lambda grid assume); each sample's loss is its mean BCE.
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, targets.to(logits.dtype)
            )
            return loss, int(logits.shape[0])
        if self.task == "sequence":
            n = int((targets != IGNORE).sum())
            loss = torch.nn.functional.cross_entropy(
                logits, targets, ignore_index=IGNORE, reduction="sum"
            )
            return loss / max(n, 1), n
        return torch.nn.functional.cross_entropy(logits, targets), int(logits.shape[0])

    def _batch_metrics(self, logits: Tensor, targets: Tensor) -> dict[str, float]:
        if self.task == "multilabel":
            # Keras's Recall(top_k=5), which the paper's SO Tag numbers use: true tags among
            # each row's 5 top-scored tags, over all true tags of all rows (micro average).
            top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
            hits = float(targets.gather(1, top5).sum())
            relevant = float(targets.sum())
            return {"recall_at_5": hits / relevant if relevant else float("nan")}
        mask = targets != IGNORE
        if len(self.accuracy_excludes):
            mask &= ~torch.isin(targets, self.accuracy_excludes)
        if not bool(mask.any()):
            return {"accuracy": float("nan")}
        correct = (logits.argmax(1) == targets) & mask
        return {"accuracy": float(correct.sum()) / float(mask.sum())}
