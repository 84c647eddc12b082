"""Where a party computes: the device setting ("cpu", "cuda", "cuda:N", "auto") and what a
CUDA device needs to train reproducibly.

The device is a local execution choice of each party, never part of a run's identity: it is
not sent to the other party, not stored in a run's fingerprint, and a checkpoint is always
written with CPU tensors (shared.training), so a run trained on a GPU resumes on a CPU and
the reverse. What changes with the device is float rounding (other kernels, other reduction
orders): a run resumed on the device type it was written on replays bit-identically; one
resumed on another continues correctly but not bit-identically (docs/RELIABILITY.md).

``resolve_device`` turns the setting into a ``torch.device``; for CUDA it also makes this
process's GPU arithmetic reproducible (``_reproducible_cuda``), once. ``to_host`` copies
tensors off the device through pinned (page-locked) host memory.
"""

import os
import threading
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["DEVICE_CHOICES", "DeviceUnavailable", "describe", "resolve_device", "to_host"]

DEVICE_CHOICES = "cpu, cuda, cuda:N or auto"

_setup_lock = threading.Lock()
_cuda_ready = False


class DeviceUnavailable(ValueError):
    """The device setting names a device this machine does not have (or is not a device)."""


def resolve_device(setting: str) -> torch.device:
    """The torch device of a setting: "cpu"; "cuda" / "cuda:N" (refused with the fix when this
    machine has no such GPU or this torch has no CUDA); "auto": the first GPU if there is one,
    else the CPU."""
    text = setting.strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
        if text == "cpu":
            return torch.device("cpu")
    if text != "cuda" and not (text.startswith("cuda:") and text[5:].isdigit()):
        raise DeviceUnavailable(f"device must be {DEVICE_CHOICES}, got {setting!r}")
    if not torch.cuda.is_available():
        why = (
            f"this torch ({torch.__version__}) is built without CUDA"
            if torch.version.cuda is None
            else "no CUDA GPU is visible to this process"
        )
        raise DeviceUnavailable(
            f"device {setting!r} asked for, but {why}: use device 'cpu' or 'auto', or run "
            "on a machine with an NVIDIA GPU and a CUDA build of torch"
        )
    device = torch.device(text)
    index = device.index or 0
    if index >= torch.cuda.device_count():
        raise DeviceUnavailable(
            f"device {setting!r} asked for, but this machine has "
            f"{torch.cuda.device_count()} CUDA device(s): use cuda:0 .. "
            f"cuda:{torch.cuda.device_count() - 1}, or 'auto'"
        )
    _reproducible_cuda()
    return torch.device("cuda", index)


def _reproducible_cuda() -> None:
    """Process-wide settings under which a CUDA run replays bit-identically (once).

    * ``CUBLAS_WORKSPACE_CONFIG``: cuBLAS (matrix products, LSTMs) is bit-reproducible only
      with a fixed workspace; read when cuBLAS starts, so set before the first product.
    * ``torch.use_deterministic_algorithms(True, warn_only=True)``: cuDNN convolutions and
      torch's own kernels pick deterministic algorithms; an op that has none warns (the
      device check records any such warning) instead of failing a run.
    * no TF32: float32 products and convolutions stay float32, as on a CPU (TF32 rounds
      their inputs to 10 bits of mantissa).
    * uninitialized memory is not filled (deterministic mode would fill every new tensor
      with NaN; nothing here reads memory it has not written).
    """
    global _cuda_ready
    with _setup_lock:
        if _cuda_ready:
            return
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        _cuda_ready = True


def to_host(tensors: Sequence[Tensor]) -> list[np.ndarray]:
    """numpy arrays of ``tensors``: CPU tensors as they are (no copy); GPU tensors copied into
    pinned host memory, all copies queued before one wait.

    Pinned memory is what a GPU copies to at full speed (from pageable memory the driver
    stages through a pinned buffer of its own); torch's caching host allocator keeps the
    blocks, so a training loop pays for pinning once. Each array owns its block: arrays
    from one call never alias each other or an earlier call's.
    """
    out: list[np.ndarray | None] = [None] * len(tensors)
    pending: list[tuple[int, Tensor]] = []
    for i, t in enumerate(tensors):
        t = t.detach()
        if t.device.type == "cpu":
            out[i] = t.numpy()
            continue
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        pending.append((i, host))
    if pending:
        torch.cuda.synchronize()
        for i, host in pending:
            out[i] = host.numpy()
    return [a for a in out if a is not None]


def describe(device: torch.device) -> dict[str, str | int | None]:
    """What a record says of the device: its name, and torch's and CUDA's versions."""
    info: dict[str, str | int | None] = {
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
        info["cudnn"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    else:
        info["name"] = "cpu"
    return info
