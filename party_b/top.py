"""Party B's half of a training step: the top model, its loss, optimizer and metrics.

Pure torch: no HTTP, no database. The service (and the experiment harness, through the
service) feeds it dequantized activations z~ and gets back the loss, batch metrics and
d loss / d z~ for party A.

Losses are means over samples, so the gradient party A receives already carries 1/n per
sample (``metrics["n"]`` reports n); party A weights its gradient correction by the same
share (see shared.correction).

A training step is two calls: ``compute_step`` (forward, backward, checks: changes no state)
and ``apply_step`` (the optimizer step: the only change). The service encodes the answer in
between, so nothing that can fail runs after the model has moved.
"""

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import Tensor

from party_b.device import compute_device
from shared import threads
from shared.devices import to_host
from shared.models import SeededDropout, build_seeded, build_top, seed_dropout
from shared.training import clear_gradients, make_optimizer, state_from_bytes, state_to_bytes
from shared.types import Task

__all__ = [
    "DivergedError",
    "EvalOutcome",
    "OutputNotFinite",
    "StepOutcome",
    "TopTrainer",
    "forward_corrected",
]

IGNORE = -100  # sequence targets with this value (padding) take no part in loss or accuracy


class DivergedError(ValueError):
    """The loss or a gradient is NaN/Inf; the optimizer step was not taken."""


class OutputNotFinite(ValueError):
    """Finite activations for which the top model's outputs are not finite (they overflow)."""


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
        prediction_excludes: tuple[int, ...] = (),
        device: torch.device | None = None,
    ) -> None:
        """``accuracy_excludes``: target classes that count in the loss but not in accuracy
        (end of sentence, in FedJAX's next-word accuracy); ``prediction_excludes``: classes
        accuracy's argmax never picks (pad, oov, bos, eos there). ``device``: where the model
        computes (default: party B's, ``party_b.device``); tensors come in and go out on the
        CPU whatever it is."""
        self.device = device or compute_device()
        self.model = build_seeded(lambda: build_top(model, cut_dim=cut_dim, **top_kwargs), seed)
        self.model.to(self.device)
        if any(True for _ in self.model.buffers()):
            # e.g. BatchNorm's running statistics: compute_step would change them
            raise ValueError(f"top model {model!r} has buffers, which a forward pass changes")
        self.optimizer = make_optimizer(self.model.parameters(), optimizer)
        self.task = task
        self.cut_dim = cut_dim
        self.accuracy_excludes = torch.tensor(accuracy_excludes, dtype=torch.int64).to(self.device)
        self.prediction_excludes = torch.tensor(prediction_excludes, dtype=torch.int64).to(
            self.device
        )
        self._computed = False  # compute_step ran and apply_step has not yet
        # intra-op threads of a step: from its multiply-adds (shared.threads), counted once
        self._macs_per_row: int | None = None
        # seed_dropout walks every module each step: only where a dropout draws from a seed
        self._has_dropout = any(isinstance(m, SeededDropout) for m in self.model.modules())
        self._step_threads = 1

    # ------------------------------------------------------------------ training

    def train_step(
        self, z_tilde: Tensor, targets: Tensor, side: Tensor | None, *, dropout_seed: int
    ) -> StepOutcome:
        """One optimizer step on the top model: ``compute_step`` then ``apply_step``."""
        outcome = self.compute_step(z_tilde, targets, side, dropout_seed=dropout_seed)
        self.apply_step()
        return outcome

    def compute_step(
        self,
        z_tilde: Tensor,
        targets: Tensor,
        side: Tensor | None,
        *,
        dropout_seed: int,
        keep: float | None = None,
    ) -> StepOutcome:
        """Forward and backward of one step: the loss, metrics and d loss / d z~ (rows, d).

        ``keep``: class targets that are randomized responses (label DP), each the true
        class with this probability and otherwise another uniformly; the loss is then
        forward-corrected for it (``forward_corrected``). Leaves the parameters' gradients
        for ``apply_step`` and changes nothing else: not the parameters, not the optimizer's
        state (the model has no buffers). Raises ``DivergedError`` for a non-finite loss or
        gradient. Runs on the step's intra-op threads (``shared.threads``: from its size and
        the cores, or the operator's).
        """
        self._computed = False
        self._step_threads = self._threads(z_tilde, side)
        with threads.intra_op(self._step_threads):
            return self._compute(z_tilde, targets, side, dropout_seed, keep)

    def _compute(
        self,
        z_tilde: Tensor,
        targets: Tensor,
        side: Tensor | None,
        dropout_seed: int,
        keep: float | None,
    ) -> StepOutcome:
        if not self.model.training:  # (evaluate and predict leave it in eval mode)
            self.model.train()
        if self._has_dropout:
            seed_dropout(self.model, dropout_seed)
        z = z_tilde.detach().to(self.device).requires_grad_(True)
        targets, side = self._on_device(targets, side)
        logits = self.model(z, side)
        if keep is not None and self.task == "classification":
            loss, n = forward_corrected(logits, targets, keep), int(logits.shape[0])
        else:
            loss, n = self._loss(logits, targets)
        clear_gradients(self.optimizer)
        torch.autograd.backward(loss)
        assert z.grad is not None
        # Check before stepping: a rejected step must leave the model exactly as it was.
        loss_value = float(loss.detach())
        if not (math.isfinite(loss_value) and torch.isfinite(z.grad).all()):
            raise DivergedError(f"non-finite loss ({loss_value}) or gradient")
        metrics = {"n": float(n), **self._batch_metrics(logits.detach(), targets)}
        self._computed = True
        (grad,) = to_host([z.grad])  # through pinned memory from a GPU
        return StepOutcome(loss=loss_value, metrics=metrics, grad=torch.from_numpy(grad))

    def apply_step(self) -> None:
        """The optimizer step on the gradients the last ``compute_step`` left."""
        if not self._computed:
            raise RuntimeError("apply_step without a compute_step before it")
        self._computed = False
        with threads.intra_op(self._step_threads):
            self.optimizer.step()

    # ------------------------------------------------------------------ serving

    @torch.no_grad()
    def evaluate(self, z_tilde: Tensor, targets: Tensor, side: Tensor | None) -> EvalOutcome:
        """Forward only: mean loss and metrics (accuracy; AUC for two classes; recall@5)."""
        logits = self._logits(z_tilde, side)
        labels = targets.numpy()
        targets, _ = self._on_device(targets, None)
        loss, n = self._loss(logits, targets)
        if not bool(torch.isfinite(loss)):
            # finite outputs so large that the loss overflows (+3e38 activations): refused
            # like outputs that overflow, never answered (and stored) as an infinite loss
            raise OutputNotFinite(
                f"the loss is not finite for these activations (largest |z~| = "
                f"{float(z_tilde.abs().max()):.3g}): their outputs are too large to score"
            )
        metrics = self._batch_metrics(logits, targets)
        if self.task == "classification" and logits.shape[1] == 2:
            scores = torch.softmax(logits, dim=1)[:, 1].cpu().numpy()
            metrics["auc"] = (
                float(roc_auc_score(labels, scores))
                if len(np.unique(labels)) == 2
                else float("nan")
            )
        return EvalOutcome(n=n, loss=float(loss), metrics=metrics)

    @torch.no_grad()
    def predict(self, z_tilde: Tensor, side: Tensor | None) -> Tensor:
        """Forward only: (rows, C) probabilities (softmax; sigmoid per tag for multilabel)."""
        logits = self._logits(z_tilde, side)
        probabilities = (
            torch.sigmoid(logits) if self.task == "multilabel" else torch.softmax(logits, 1)
        )
        return probabilities.cpu()

    # ------------------------------------------------------------------ state

    def state(self) -> tuple[bytes, bytes]:
        return state_to_bytes(self.model.state_dict()), state_to_bytes(self.optimizer.state_dict())

    def load_state(self, model_state: bytes, optimizer_state: bytes) -> None:
        self.model.load_state_dict(state_from_bytes(model_state))
        self.optimizer.load_state_dict(state_from_bytes(optimizer_state))

    # ------------------------------------------------------------------ internals

    def _threads(self, z_tilde: Tensor, side: Tensor | None) -> int:
        """Intra-op threads of a training step on these activations (rows, d)."""
        if self._macs_per_row is None:
            one, one_side = self._on_device(z_tilde[:1], None if side is None else side[:1])
            self._macs_per_row = threads.macs_per_sample(self.model, one, one_side)
        return threads.choose(self._macs_per_row * int(z_tilde.shape[0]))

    def _logits(self, z_tilde: Tensor, side: Tensor | None) -> Tensor:
        """Forward in eval mode; raises ``OutputNotFinite`` when the outputs overflow."""
        self.model.eval()
        z_tilde, side = self._on_device(z_tilde, side)
        logits: Tensor = self.model(z_tilde, side)
        if not bool(torch.isfinite(logits).all()):
            largest = float(z_tilde.abs().max()) if z_tilde.numel() else 0.0
            raise OutputNotFinite(
                f"the top model's outputs are not finite for these activations (largest "
                f"|z~| = {largest:.3g}): they overflow float32 inside the model"
            )
        return logits

    def _on_device(self, x: Tensor, side: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``x`` and ``side`` on the model's device (the very tensors on a CPU)."""
        return x.to(self.device), None if side is None else side.to(self.device)

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
        if len(self.prediction_excludes):
            logits = logits.index_fill(1, self.prediction_excludes, float("-inf"))
        correct = (logits.argmax(1) == targets) & mask
        return {"accuracy": float(correct.sum()) / float(mask.sum())}


def forward_corrected(logits: Tensor, targets: Tensor, keep: float) -> Tensor:
    """Mean over rows of -log P(target) where the target is a randomized response of the
    true class: P(target) = keep * p_target + (1 - keep) / (C - 1) * (1 - p_target), ``p``
    the model's softmax over the (rows, C) ``logits`` (Patrini et al., "Making deep neural
    networks robust to label noise: a loss correction approach", CVPR 2017).

    Minimised where ``p`` is the true labels' posterior, so the model learns the true
    classes from randomized ones; and a row whose randomized label the model confidently
    contradicts pulls on it less and less (the loss is bounded by -log((1 - keep) / (C - 1))),
    instead of the model memorising the flip."""
    classes = int(logits.shape[1])
    other = (1.0 - keep) / (classes - 1)
    p = torch.softmax(logits, dim=1).gather(1, targets[:, None])[:, 0]
    return -torch.log(other + (keep - other) * p).mean()
