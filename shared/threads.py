"""Intra-op threads of a training step: chosen from the step's work and the machine's cores,
never from the load; the operator's ``--torch-threads`` wins.

torch's default is one intra-op thread per core. On a 2-core machine that runs anything
else (the other party, the server's event loop, other tenants) that default is the slowest
choice there is: each parallel region waits for its thread that the kernel has descheduled,
and OpenMP's waiting threads spin on the core the other work needs. Measured on this
project's 2-core machine (docs/PERFORMANCE.md, "Thread defaults"): at load average ~10 the
FEMNIST bottom step took 91 ms on one thread against 480 ms on two, its top step 12.5 against
168 ms, the demo's top step 1.0 against 11.6 ms; on small steps one thread is never slower,
quiet or loaded (a region of a few thousand multiply-adds does not pay for a hand-off).

The choice may not follow the load, though it would be faster to: the thread count changes
the bits. FEMNIST's bottom gives weight gradients that differ in the last bits on one and two
threads (convolution's reductions are split by thread), so a run whose thread count followed
the load could not replay a step bit-identically after a restart (docs/ARCHITECTURE.md,
"Recovery"). So the count is a function of what does not change during a run:

    threads = 1                                          when the step does < MIN_PARALLEL_MACS,
                                                         or the machine has < 4 cores
    threads = min(MAX_THREADS, macs // MACS_PER_THREAD)  otherwise, at least 1

Why at most two, even on many cores: the minimax over a quiet and a loaded machine. On a
16-core machine (torch 2.11, bare FEMNIST steps; docs/PERFORMANCE.md, "Thread defaults")
the bottom took 19.2 / 12.8 / 7.3 / 6.0 ms on 1 / 2 / 8 / 16 threads when quiet, and 20.4 /
24.0 / 288 / 288 ms with 16 processes spinning beside it: more threads win 3x when quiet
and lose 14x under load, two threads lose at most 1.3x under load and are 2.1x from the
quiet best. On 2 cores two threads are all of them, and lost 5x under load here. The count
applies to the calling thread only (torch keeps it per thread, as OpenMP does), so party B's
worker threads each run their run's choice, and a ``--torch-threads N`` (``pin``) is every
step's count.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = [
    "MACS_PER_THREAD",
    "MAX_THREADS",
    "MIN_CORES",
    "MIN_PARALLEL_MACS",
    "choose",
    "intra_op",
    "macs_per_sample",
    "pin",
    "pinned",
]

# Multiply-adds of one training step (forward and backward: 3x the forward's) below which
# a step runs on one thread whatever the cores: the demo's top step (~0.3 M) and
# default_credit's (~2.3 M) gained nothing from a second thread on a quiet machine either.
MIN_PARALLEL_MACS = 64 * 10**6
# A thread per this many multiply-adds of the step, up to MAX_THREADS.
MACS_PER_THREAD = 32 * 10**6
MAX_THREADS = 2
MIN_CORES = 4  # below, one thread: two would be every core

_pinned: int | None = None


def pin(threads: int) -> None:
    """The operator's thread count (``--torch-threads``): set for this process now, and
    returned by every later ``choose``."""
    global _pinned
    if threads < 1:
        raise ValueError(f"torch threads must be >= 1, got {threads}")
    _pinned = threads
    torch.set_num_threads(threads)


def pinned() -> int | None:
    """The operator's thread count, if one was given."""
    return _pinned


def choose(macs: int, cores: int | None = None) -> int:
    """Intra-op threads of a training step of ``macs`` multiply-adds (forward + backward)
    on a machine of ``cores`` (default: this one's); the operator's pin if there is one."""
    if _pinned is not None:
        return _pinned
    if macs < MIN_PARALLEL_MACS:
        return 1  # before counting the cores: os.cpu_count() reads sysfs, 20 us a step
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if macs < MIN_PARALLEL_MACS or cores < MIN_CORES:
        return 1
    return max(1, min(MAX_THREADS, macs // MACS_PER_THREAD))


def macs_per_sample(model: torch.nn.Module, *inputs: Any) -> int:
    """Multiply-adds of one training step per sample of ``model``: 3x its forward's (backward
    costs about twice the forward). ``inputs``: the forward's arguments for one sample.

    Counted by hooks on a forward in eval mode without gradients (nothing changes: no
    dropout draw, no optimizer state): a layer with parameters costs its parameter count per
    output position (exact for linear and convolution layers, close for recurrent ones, one
    position per token); embeddings cost nothing. (torch's ``FlopCounterMode`` counts more
    exactly but takes seconds on its first use in a process.)"""
    total = 0

    def count(module: torch.nn.Module, _args: Any, output: Any) -> None:
        nonlocal total
        out = output[0] if isinstance(output, tuple) else output
        params = sum(p.numel() for p in module.parameters(recurse=False))
        if not params or isinstance(module, torch.nn.Embedding) or not out.dim():
            return
        channels = (
            out.shape[1] if isinstance(module, torch.nn.modules.conv._ConvNd) else out.shape[-1]
        )
        total += params * (out.numel() // max(int(channels), 1))

    handles = [m.register_forward_hook(count) for m in model.modules()]
    training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(*inputs)
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()
    return 3 * total


@contextmanager
def intra_op(threads: int) -> Iterator[None]:
    """torch's intra-op threads at ``threads`` in this thread for the block, then back."""
    before = torch.get_num_threads()
    if before == threads:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
