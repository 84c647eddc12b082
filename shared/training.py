"""Small torch helpers both parties use: optimizers from JSON specs, state dicts as bytes."""

import copy
import hashlib
import io
from collections.abc import Iterable
from typing import Any

import torch

__all__ = [
    "clear_gradients",
    "make_optimizer",
    "state_from_bytes",
    "state_sha256",
    "state_to_bytes",
]


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
        return _adagrad(params, lr, weight_decay, spec)
    raise ValueError(f"unknown optimizer {name!r}: use sgd, adam or adagrad")


def _adagrad(
    params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float, spec: dict[str, Any]
) -> torch.optim.Optimizer:
    """torch's AdaGrad, or optax's (FedJAX's) when the spec says so.

    torch: x -= lr * g / (sqrt(acc) + 1e-10), acc starting at ``initial_accumulator`` (0 by
    default: the first step moves every weight by lr * sign(g), whatever the gradient's size).
    optax / FedJAX (``fedjax.optimizers.adagrad``: accumulator 0.1, eps 1e-6):
    x -= lr * g / sqrt(acc + eps). With ``eps`` given, the eps goes inside the root as optax
    puts it; torch's own eps (after the root) is then 0.
    """
    initial = float(spec.get("initial_accumulator", 0.0))
    eps = spec.get("eps")
    if eps is None:
        return torch.optim.Adagrad(
            params, lr=lr, weight_decay=weight_decay, initial_accumulator_value=initial
        )
    # sqrt(acc + eps) == sqrt(acc') with acc' = acc + eps from the start: torch accumulates
    # g^2 onto its state, so starting it at initial + eps (and adding nothing after the root)
    # is optax's update exactly.
    return torch.optim.Adagrad(
        params,
        lr=lr,
        weight_decay=weight_decay,
        initial_accumulator_value=initial + float(eps),
        eps=0.0,
    )


def clear_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Every parameter's gradient set to None: ``optimizer.zero_grad(set_to_none=True)``
    without its wrappers (a profiler record and torch.compile's guard), which took about as
    long as a small model's whole backward, every step (docs/PERFORMANCE.md)."""
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            parameter.grad = None


def state_to_bytes(state: dict[str, Any]) -> bytes:
    """A (model or optimizer) state dict as bytes, its tensors always as CPU tensors: a
    checkpoint written on a GPU loads on a machine without one (shared.devices). On a CPU
    run nothing is copied and the bytes are what they always were."""
    buffer = io.BytesIO()
    torch.save(_on_cpu(state), buffer)
    return buffer.getvalue()


def _on_cpu(value: Any) -> Any:
    """``value`` (nested mappings, lists and tuples of tensors and numbers) with every tensor
    on the CPU. Anything already there is returned as the very same object, and a copied
    mapping keeps its type and attributes (a state dict's ``_metadata``)."""
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "cpu" else value.cpu()
    if isinstance(value, dict):
        moved = {k: _on_cpu(v) for k, v in value.items()}
        if all(moved[k] is v for k, v in value.items()):
            return value
        out = copy.copy(value)
        out.update(moved)
        return out
    if isinstance(value, list | tuple):
        items = [_on_cpu(v) for v in value]
        if all(m is v for m, v in zip(items, value, strict=True)):
            return value
        return type(value)(items)
    return value


def state_from_bytes(data: bytes) -> dict[str, Any]:
    """The state dict, on the CPU (``load_state_dict`` moves it to the model's device; an
    optimizer's state follows its parameters)."""
    # weights_only: state read back from disk must never be able to run code (no pickle of
    # arbitrary objects), even if someone tampered with the database file. map_location: a
    # checkpoint from before state_to_bytes moved tensors to the CPU may hold CUDA tensors.
    loaded: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    return loaded


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    """Hex SHA-256 of a model's state dict: names, dtypes, shapes and values, in order.

    Two models have the same checksum exactly when they hold bit-identical parameters; it does
    not depend on how torch happens to serialize them (unlike hashing ``state_to_bytes``).
    """
    digest = hashlib.sha256()
    for name, tensor in state.items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
