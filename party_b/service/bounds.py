"""How many training runs party B keeps in memory: a count and a byte budget, least recently
used first out (``FEDLITE_B_MAX_LIVE_RUNS``, ``FEDLITE_B_MAX_LIVE_BYTES``; unset, the byte
budget is half the memory of the machine or of its container: ``default_live_bytes``).

A run out of memory costs nothing but a reload: it is checkpointed at its applied step when
it leaves (``ownership.Ownership.park``) and its next request loads that checkpoint, so
party A sees the very state it left, only later. The byte figure of a run is what it holds
in tensors and arrays (``footprint``), measured when it is loaded and again whenever the
cache looks at it while no request is using it; the interpreter's own overhead and the
allocator's slack are not in it, so a byte budget is a budget for runs, not for the process.
"""

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from party_b.service.runstate import RunState

__all__ = ["LiveBounds", "default_live_bytes", "footprint", "memory_available", "over_bounds"]

KEY_BYTES = 32 + 33  # an aligned key: 32 bytes in a bytes object of 33 bytes' overhead

# The share of the memory party B may use that its runs' tensors get by default: the rest is
# the process itself (torch, the label table, the interpreter: ~0.7 GB idle on the demo) and
# the allocator's slack, which a footprint does not count. Without it, the default of 32 runs
# could ask for about 25 GB with 50 M-parameter top models (issue 34).
DEFAULT_LIVE_SHARE = 0.5
# cgroup v2, then v1: a container's memory limit, which the machine's memory does not show
CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def memory_available(cgroup_limits: Iterable[Path] = CGROUP_LIMITS) -> int:
    """Bytes this process may use: the machine's memory, or its container's limit if lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in cgroup_limits:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) means none; v1 says "none" with a huge number
            return min(physical, int(text))
    return physical


def default_live_bytes(cgroup_limits: Iterable[Path] = CGROUP_LIMITS) -> int:
    """``FEDLITE_B_MAX_LIVE_BYTES`` when it is not set: half the memory party B may use."""
    return int(memory_available(cgroup_limits) * DEFAULT_LIVE_SHARE)


@dataclass(frozen=True)
class LiveBounds:
    """At most ``max_runs`` training runs and ``max_bytes`` of their state in memory (None:
    no bound). The run a request is being served for always stays, even alone over budget."""

    max_runs: int | None = None
    max_bytes: int | None = None


def footprint(state: RunState) -> int:
    """Bytes of the run's tensors and arrays: top-model parameters, their gradients,
    optimizer state, aligned keys, label rows, split and the last answer. Call it while
    holding ``state.lock`` (the optimizer's state changes under a step)."""
    model = state.trainer.model
    tensors: list[torch.Tensor] = list(model.parameters())
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for slots in state.trainer.optimizer.state.values():
        tensors += [t for t in slots.values() if isinstance(t, torch.Tensor)]
    arrays = state.label_rows.nbytes + state.train_pos.nbytes + state.eval_pos.nbytes
    answer = len(state.last_response or b"")
    return (
        sum(t.numel() * t.element_size() for t in tensors)
        + arrays
        + answer
        + (KEY_BYTES * len(state.aligned))
    )


class Footprints:
    """The last measured footprint of each run in memory (re-measured when it is idle)."""

    def __init__(self) -> None:
        self._bytes: dict[str, int] = {}

    def measure(self, state: RunState, *, wait: bool) -> int:
        """The run's footprint now if its lock is free (or ``wait``), else the last one."""
        lock: threading.Lock = state.lock
        if lock.acquire(blocking=wait):
            try:
                self._bytes[state.run_id] = footprint(state)
            finally:
                lock.release()
        return self._bytes.get(state.run_id, 0)

    def forget(self, run_id: str) -> None:
        self._bytes.pop(run_id, None)


def over_bounds(
    bounds: LiveBounds, live: Iterable[RunState], footprints: Footprints, *, keep: str
) -> list[RunState]:
    """The runs to evict, least recently used first, so that what stays is within bounds;
    ``live`` is in order of use (oldest first) and ``keep`` is never chosen."""
    runs = list(live)
    if bounds.max_runs is None and bounds.max_bytes is None:
        return []
    sizes = {s.run_id: footprints.measure(s, wait=False) for s in runs}
    count, total = len(runs), sum(sizes.values())
    victims = []
    for state in runs:
        fits_count = bounds.max_runs is None or count <= bounds.max_runs
        fits_bytes = bounds.max_bytes is None or total <= bounds.max_bytes
        if fits_count and fits_bytes:
            break
        if state.run_id == keep:
            continue
        victims.append(state)
        count, total = count - 1, total - sizes[state.run_id]
    return victims
