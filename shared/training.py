"""Small torch helpers both parties use: optimizers from JSON specs, state dicts as bytes."""

import io
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["make_optimizer", "state_from_bytes", "state_to_bytes"]


def make_optimizer(
    params: Iterable[torch.nn.Parameter], spec: dict[str, Any]
) -> torch.optim.Optimizer:
    """SGD (with momentum), Adam or AdaGrad from a JSON spec {"name", "lr", ...}."""
    name, lr = spec["name"], float(spec["lr"])
    weight_decay = float(spec.get("weight_decay", 0.0))
    if name == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=float(spec.get("momentum", 0.0)), weight_decay=weight_decay
        )
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}: use sgd, adam or adagrad")


def state_to_bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def state_from_bytes(data: bytes) -> dict[str, Any]:
    # weights_only: state read back from disk must never be able to run code (no pickle of
    # arbitrary objects), even if someone tampered with the database file.
    loaded: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True)
    return loaded
