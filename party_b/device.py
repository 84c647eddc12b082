"""The device party B's top models compute on: one for the whole process.

Set once at start-up (``fedlite-b serve --device`` / ``FEDLITE_B_DEVICE``; the in-process party
B of the experiments passes it), read by every ``TopTrainer`` built after. It is a property of
the process, like ``--torch-threads`` (torch's intra-op threads are process-wide too), not of
a run: party A never learns it, runs keep no record of it, and checkpoints are device-neutral
(shared.training), so an operator may move party B between a CPU and a GPU machine and every
run resumes (bit-identically only on the device type its checkpoint was written on,
docs/RELIABILITY.md).
"""

import threading

import torch

from party_b.errors import StartupError
from shared.devices import DEVICE_CHOICES, DeviceUnavailable, resolve_device

__all__ = ["compute_device", "use_device"]

_lock = threading.Lock()
_device = torch.device("cpu")


def use_device(setting: str) -> torch.device:
    """Resolve ``setting`` ("cpu", "cuda", "cuda:N", "auto") and make it party B's device.

    Raises StartupError, one line naming the fix, for a device this machine does not have.
    """
    global _device
    try:
        device = resolve_device(setting)
    except DeviceUnavailable as exc:
        raise StartupError(f"{exc} (--device / FEDLITE_B_DEVICE takes {DEVICE_CHOICES})") from None
    with _lock:
        _device = device
    return device


def compute_device() -> torch.device:
    """The device new top models are built on (the CPU unless ``use_device`` said otherwise)."""
    with _lock:
        return _device
