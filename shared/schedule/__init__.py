"""What both parties derive on their own from the run seed, instead of shipping it each step.

Party A and party B never send each other sample ids during training. After alignment both
hold the same ordered list of aligned ids; from it and the run seed each side computes the same
train/eval split, the same batch for every step and the same per-step random seeds. A step
request carries only an 8-byte digest of its batch's ids so that a disagreement is caught
instead of silently training on mismatched rows.

Two batch schedules exist. ``ShuffledBatches`` (the default) visits the train list as seeded
epochs and sends each step as one chunk. ``ClientBatches`` is the paper's horizontal setting
simulated in one party pair: every sample belongs to a client (a writer, a speaking role, ...),
step t samples ``clients_per_step`` clients and ``batch_size`` rows of each, and every client's
rows form their own chunk, quantized with their own codebook.

The draws are versioned (``RunCreate.schedule_version``): version 2 (``shared.schedule.v2``,
what new runs use) sorts by SHA-256 and is specified in docs/PROTOCOL.md, "Derived values",
with test vectors in docs/conformance/; version 1 (``shared.schedule.v1``) is numpy's
generator, kept for runs stored before version 2. The digests and step seeds are the same in
both versions.
"""

import functools
import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from shared.schedule import v1, v2
from shared.types import DIGEST_BYTES

__all__ = [
    "DIGEST_BYTES",
    "SCHEDULE_VERSION",
    "SCHEDULE_VERSIONS",
    "BatchSchedule",
    "ClientBatches",
    "ShuffledBatches",
    "StepBatch",
    "batch_digest",
    "batch_positions",
    "make_schedule",
    "split_train_eval",
    "step_seed",
]

SCHEDULE_VERSION = 2  # what new runs use
SCHEDULE_VERSIONS = (1, 2)


class _Draws(Protocol):
    """The algorithms one schedule version defines (the modules v1, v2)."""

    def eval_count(self, n: int, eval_fraction: float) -> int: ...
    def split_order(self, n: int, seed: int) -> np.ndarray: ...
    def epoch_order(self, n: int, seed: int, epoch: int) -> np.ndarray: ...
    def client_draw(
        self, sizes: Sequence[int], *, clients: int, rows: int, seed: int, step: int
    ) -> list[tuple[int, np.ndarray]]: ...


_DRAWS: dict[int, _Draws] = {1: v1, 2: v2}


def _draws(version: int) -> _Draws:
    try:
        return _DRAWS[version]
    except KeyError:
        raise ValueError(
            f"unknown schedule version {version!r}; known: {list(SCHEDULE_VERSIONS)}"
        ) from None


def step_seed(run_seed: int, step: int, purpose: str) -> int:
    """A 63-bit seed for one use ("kmeans", "dropout-top", ...) at one step of one run.

    The first 8 bytes of SHA-256 of the ASCII text "{run_seed}:{step}:{purpose}", big-endian,
    shifted right by one bit. Stable across processes and Python versions (unlike ``hash``),
    so a replayed or resumed step draws exactly the random numbers it drew the first time.
    """
    text = f"{run_seed}:{step}:{purpose}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


def split_train_eval(
    n: int, *, seed: int, eval_fraction: float, version: int = SCHEDULE_VERSION
) -> tuple[np.ndarray, np.ndarray]:
    """Positions 0..n-1 of the aligned list split into (train, eval), both sorted, int64.

    The eval part is about n * eval_fraction positions (each version states its rounding)
    drawn by a seeded permutation; at least one position stays in train.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    if n < 1:
        raise ValueError("cannot split an empty aligned id list")
    draws = _draws(version)
    n_eval = draws.eval_count(n, eval_fraction)
    order = draws.split_order(n, seed).astype(np.int64)
    return np.sort(order[n_eval:]), np.sort(order[:n_eval])


def batch_positions(
    step: int, *, batch_size: int, n: int, seed: int, version: int = SCHEDULE_VERSION
) -> np.ndarray:
    """Positions (into the train list of length n) of the batch of ``step`` (1-based).

    The train list is visited as an endless stream of seeded permutations, one per epoch;
    batch t is the t-th slice of ``batch_size`` of that stream, so every batch is full and a
    batch may straddle two epochs. Shape (batch_size,), int64. The schedules of the last few
    (n, batch_size, seed, version) asked for are kept, so that stepping through a run
    rebuilds an epoch's order once per epoch, not once per step.
    """
    return _kept_schedule(n, batch_size, seed, version).batch(step).positions


@functools.lru_cache(maxsize=8)
def _kept_schedule(n: int, batch_size: int, seed: int, version: int) -> "ShuffledBatches":
    return ShuffledBatches(n=n, batch_size=batch_size, seed=seed, version=version)


def batch_digest(ids: Sequence[bytes]) -> bytes:
    """8-byte digest of an ordered list of (aligned, hashed) ids: the first 8 bytes of
    SHA-256 over, for every id in order, its length as 2 bytes big-endian then its bytes."""
    h = hashlib.sha256()
    for item in ids:
        h.update(len(item).to_bytes(2, "big"))
        h.update(item)
    return h.digest()[:DIGEST_BYTES]


# ---------------------------------------------------------------------------------------------
# Batch schedules: which train positions step t uses, and how they are cut into chunks
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepBatch:
    """The rows of one training step.

    positions:   (rows,) int64 positions into the train list, in request row order
    chunk_sizes: rows of each independently quantized chunk, in order; they add up to rows
    """

    positions: np.ndarray
    chunk_sizes: tuple[int, ...]


class BatchSchedule(Protocol):
    """What both parties build from the run config: the batch of every step."""

    def batch(self, step: int) -> StepBatch: ...


class ShuffledBatches:
    """Seeded epochs over the train list, ``batch_size`` rows per step, one chunk.

    Keeps the orders of the last two epochs it used (a version 2 epoch of 30,000 positions
    takes tens of milliseconds to build), so consecutive steps cost a slice each.
    """

    _KEPT = 2

    def __init__(self, *, n: int, batch_size: int, seed: int, version: int = SCHEDULE_VERSION):
        if batch_size < 1 or n < 1:
            raise ValueError(f"batch_size and n must be >= 1, got {batch_size}, {n}")
        self.n, self.batch_size, self.seed, self.version = n, batch_size, seed, version
        self._draws = _draws(version)
        self._epochs: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()  # batch_positions shares one schedule between callers

    def _epoch(self, epoch: int) -> np.ndarray:
        with self._lock:
            order = self._epochs.get(epoch)
            if order is None:
                order = self._draws.epoch_order(self.n, self.seed, epoch).astype(np.int64)
                order.flags.writeable = False
                while len(self._epochs) >= self._KEPT:
                    self._epochs.pop(min(self._epochs))
                self._epochs[epoch] = order
            return order

    def batch(self, step: int) -> StepBatch:
        if step < 1:
            raise ValueError(f"steps are numbered from 1, got {step}")
        n = self.n
        start = (step - 1) * self.batch_size
        stop = start + self.batch_size
        parts = []
        for epoch in range(start // n, (stop - 1) // n + 1):
            lo = max(start - epoch * n, 0)
            hi = min(stop - epoch * n, n)
            parts.append(self._epoch(epoch)[lo:hi])
        return StepBatch(np.concatenate(parts), (self.batch_size,))


class ClientBatches:
    """The paper's horizontal setting: a few clients per step, each its own chunk.

    ``groups[i]`` names the client of train position i. Clients are numbered in ascending
    order of their names' UTF-8 bytes, and each client's train positions are kept ascending.
    Step t draws ``clients_per_step`` distinct clients (all of them if there are fewer), in
    ascending order of client name, and from each client ``min(batch_size, its rows)``
    distinct rows; each client's rows are one chunk. Everything is drawn from (seed, step)
    alone, so both parties get the same batch from the same groups without exchanging
    anything.
    """

    def __init__(
        self,
        groups: Sequence[str],
        *,
        clients_per_step: int,
        batch_size: int,
        seed: int,
        version: int = SCHEDULE_VERSION,
    ) -> None:
        if clients_per_step < 1 or batch_size < 1:
            raise ValueError(
                f"clients_per_step and batch_size must be >= 1, got {clients_per_step}, "
                f"{batch_size}"
            )
        if len(groups) == 0:
            raise ValueError("the client schedule needs at least one train row")
        self._draws = _draws(version)
        self.clients: list[str] = sorted(set(groups), key=lambda name: name.encode("utf-8"))
        index = {name: j for j, name in enumerate(self.clients)}
        members: list[list[int]] = [[] for _ in self.clients]
        for position, name in enumerate(groups):
            members[index[name]].append(position)
        self._members = [np.array(m, dtype=np.int64) for m in members]
        self._sizes = [len(m) for m in members]
        self.clients_per_step = clients_per_step
        self.batch_size = batch_size
        self.seed = seed
        self.version = version

    def batch(self, step: int) -> StepBatch:
        if step < 1:
            raise ValueError(f"steps are numbered from 1, got {step}")
        drawn = self._draws.client_draw(
            self._sizes,
            clients=self.clients_per_step,
            rows=self.batch_size,
            seed=self.seed,
            step=step,
        )
        parts = [self._members[client][rows] for client, rows in drawn]
        return StepBatch(np.concatenate(parts), tuple(len(p) for p in parts))


def make_schedule(
    *,
    n: int,
    batch_size: int,
    seed: int,
    clients: Sequence[str] | None = None,
    clients_per_step: int = 1,
    version: int = SCHEDULE_VERSION,
) -> BatchSchedule:
    """The run's schedule over its ``n`` train positions, built the same way on both sides:
    :class:`ShuffledBatches`, or with ``clients`` (the client of each train position)
    :class:`ClientBatches` of ``clients_per_step`` clients per step; ``version`` is the run's
    ``schedule_version``."""
    if clients is None:
        return ShuffledBatches(n=n, batch_size=batch_size, seed=seed, version=version)
    if len(clients) != n:
        raise ValueError(f"{len(clients)} clients for {n} train positions")
    return ClientBatches(
        clients,
        clients_per_step=clients_per_step,
        batch_size=batch_size,
        seed=seed,
        version=version,
    )
