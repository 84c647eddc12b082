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
"""

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = [
    "DIGEST_BYTES",
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

DIGEST_BYTES = 8


def step_seed(run_seed: int, step: int, purpose: str) -> int:
    """A 63-bit seed for one use ("kmeans", "dropout-top", ...) at one step of one run.

    Stable across processes and Python versions (unlike ``hash``), so a replayed or resumed
    step draws exactly the random numbers it drew the first time.
    """
    text = f"{run_seed}:{step}:{purpose}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


def split_train_eval(n: int, *, seed: int, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Positions 0..n-1 of the aligned list split into (train, eval), both sorted.

    The eval part is round(n * eval_fraction) positions drawn by a seeded permutation; at least
    one position stays in train.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    if n < 1:
        raise ValueError("cannot split an empty aligned id list")
    n_eval = min(n - 1, int(round(n * eval_fraction)))
    order = np.random.default_rng([seed, 0x5E7]).permutation(n)
    return np.sort(order[n_eval:]), np.sort(order[:n_eval])


def batch_positions(step: int, *, batch_size: int, n: int, seed: int) -> np.ndarray:
    """Positions (into the train list of length n) of the batch of ``step`` (1-based).

    The train list is visited as an endless stream of seeded permutations, one per epoch;
    batch t is the t-th slice of ``batch_size`` of that stream, so every batch is full and a
    batch may straddle two epochs. Shape (batch_size,), int64.
    """
    if step < 1:
        raise ValueError(f"steps are numbered from 1, got {step}")
    if batch_size < 1 or n < 1:
        raise ValueError(f"batch_size and n must be >= 1, got {batch_size}, {n}")
    start = (step - 1) * batch_size
    stop = start + batch_size
    parts = []
    for epoch in range(start // n, (stop - 1) // n + 1):
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        lo = max(start - epoch * n, 0)
        hi = min(stop - epoch * n, n)
        parts.append(perm[lo:hi])
    return np.concatenate(parts).astype(np.int64)


def batch_digest(ids: Sequence[bytes]) -> bytes:
    """8-byte digest of an ordered list of (aligned, hashed) ids."""
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


@dataclass(frozen=True)
class ShuffledBatches:
    """Seeded epochs over the train list, ``batch_size`` rows per step, one chunk."""

    n: int  # length of the train list
    batch_size: int
    seed: int

    def batch(self, step: int) -> StepBatch:
        positions = batch_positions(step, batch_size=self.batch_size, n=self.n, seed=self.seed)
        return StepBatch(positions, (self.batch_size,))


class ClientBatches:
    """The paper's horizontal setting: a few clients per step, each its own chunk.

    ``groups[i]`` names the client of train position i. Step t draws ``clients_per_step``
    distinct clients uniformly (all of them if there are fewer), in ascending order of client
    name, and from each client ``min(batch_size, its rows)`` distinct rows uniformly; each
    client's rows are one chunk. Everything is drawn from (seed, step) alone, so both parties
    get the same batch from the same groups without exchanging anything.
    """

    def __init__(
        self, groups: Sequence[str], *, clients_per_step: int, batch_size: int, seed: int
    ) -> None:
        if clients_per_step < 1 or batch_size < 1:
            raise ValueError(
                f"clients_per_step and batch_size must be >= 1, got {clients_per_step}, "
                f"{batch_size}"
            )
        if len(groups) == 0:
            raise ValueError("the client schedule needs at least one train row")
        names, codes = np.unique(np.asarray(groups, dtype=str), return_inverse=True)
        order = np.argsort(codes, kind="stable")  # positions grouped by client, ascending
        bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
        self.clients: list[str] = names.tolist()
        self._members = [
            order[lo:hi].astype(np.int64) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        self.clients_per_step = clients_per_step
        self.batch_size = batch_size
        self.seed = seed

    def batch(self, step: int) -> StepBatch:
        if step < 1:
            raise ValueError(f"steps are numbered from 1, got {step}")
        rng = np.random.default_rng([self.seed, 0xC11E7, step])
        k = min(self.clients_per_step, len(self._members))
        chosen = np.sort(rng.choice(len(self._members), size=k, replace=False))
        parts = []
        for client in chosen.tolist():
            members = self._members[client]
            take = rng.permutation(len(members))[: self.batch_size]
            parts.append(members[take])
        return StepBatch(np.concatenate(parts), tuple(len(p) for p in parts))


def make_schedule(
    *,
    n: int,
    batch_size: int,
    seed: int,
    clients: Sequence[str] | None = None,
    clients_per_step: int = 1,
) -> BatchSchedule:
    """The run's schedule over its ``n`` train positions, built the same way on both sides:
    :class:`ShuffledBatches`, or with ``clients`` (the client of each train position)
    :class:`ClientBatches` of ``clients_per_step`` clients per step."""
    if clients is None:
        return ShuffledBatches(n=n, batch_size=batch_size, seed=seed)
    if len(clients) != n:
        raise ValueError(f"{len(clients)} clients for {n} train positions")
    return ClientBatches(
        clients, clients_per_step=clients_per_step, batch_size=batch_size, seed=seed
    )
