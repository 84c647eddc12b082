"""The messages between the parties, as frozen dataclasses checked on construction.

Types, ranks and shape consistency are checked when a message is built; value checks that
cost a pass over the data (finite floats, codewords < L) happen once, in the encoder or
decoder. ``eq=False``: numpy arrays have no single truth value, so == would raise.

``loss`` and metric values are reports and may be NaN or Inf (a diverged loss, the AUC of a
one-class batch); arrays used in computation (gradients, codebooks, scores) must be finite.
"""

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shared.types import DIGEST_BYTES, MAX_STEP
from shared.wire.activations import Activations, Chunked, as_chunks
from shared.wire.arrays import check_float32
from shared.wire.reader import CodecError, DecodeLimits, Fields, type_name

__all__ = [
    "DIGEST_BYTES",
    "MAX_STEP",
    "EvaluateRequest",
    "EvaluateResponse",
    "PredictRequest",
    "PredictResponse",
    "StepRequest",
    "StepResponse",
    "ids_from_wire",
    "metrics_from_wire",
]


@dataclass(frozen=True, eq=False)
class StepRequest(Chunked):
    """Party A -> B: the activations of training step ``step`` for the batch ``batch_digest``."""

    step: int  # training step, >= 0
    batch_digest: bytes  # 8 bytes naming the batch's sample ids, all chunks together
    chunks: tuple[Activations, ...]  # >= 1 chunks of (B_k, d); a list is taken as a tuple

    def __post_init__(self) -> None:
        object.__setattr__(self, "step", _as_int(self.step, "step", 0, MAX_STEP))
        _check_digest(self.batch_digest, "batch_digest")
        object.__setattr__(self, "chunks", as_chunks(self.chunks))


@dataclass(frozen=True, eq=False)
class StepResponse:
    """Party B -> A: loss of step ``step`` and the gradient w.r.t. the dequantized activations."""

    step: int  # echoes StepRequest.step
    loss: float  # mean loss over the batch
    metrics: dict[str, float]  # e.g. {"accuracy": 0.75}
    grad: NDArray[np.float32]  # (rows, d) d loss / d dequantized activations, chunks in order

    def __post_init__(self) -> None:
        object.__setattr__(self, "step", _as_int(self.step, "step", 0, MAX_STEP))
        object.__setattr__(self, "loss", _as_float(self.loss, "loss"))
        object.__setattr__(self, "metrics", _as_metrics(self.metrics))
        check_float32(self.grad, "grad", ndim=2)


@dataclass(frozen=True, eq=False)
class EvaluateRequest(Chunked):
    """Party A -> B: activations of evaluation samples whose ids hash to ``ids_digest``."""

    ids_digest: bytes  # 8 bytes naming the samples' ids, all chunks together
    chunks: tuple[Activations, ...]  # >= 1 chunks of (B_k, d); a list is taken as a tuple

    def __post_init__(self) -> None:
        _check_digest(self.ids_digest, "ids_digest")
        object.__setattr__(self, "chunks", as_chunks(self.chunks))


@dataclass(frozen=True, eq=False)
class EvaluateResponse:
    """Party B -> A: loss and metrics over the ``n`` evaluated samples (no gradient)."""

    n: int  # samples evaluated, >= 0
    loss: float  # mean loss over the n samples (may be NaN or Inf)
    metrics: dict[str, float]  # e.g. {"accuracy": 0.75, "auc": 0.9}

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _as_int(self.n, "n", 0, MAX_STEP))
        object.__setattr__(self, "loss", _as_float(self.loss, "loss"))
        object.__setattr__(self, "metrics", _as_metrics(self.metrics))


@dataclass(frozen=True, eq=False)
class PredictRequest(Chunked):
    """Party A -> B: activations of rows ``ids`` (one id per row, so len(ids) == rows)."""

    ids: list[str]  # sample ids, in row order over all chunks
    chunks: tuple[Activations, ...]  # >= 1 chunks of (B_k, d); a list is taken as a tuple

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", _as_ids(self.ids))
        object.__setattr__(self, "chunks", as_chunks(self.chunks))
        if len(self.ids) != self.rows:
            raise ValueError(f"{len(self.ids)} ids for {self.rows} activation rows")


@dataclass(frozen=True, eq=False)
class PredictResponse:
    """Party B -> A: one row of ``C`` scores (probabilities or logits) per requested id."""

    ids: list[str]  # echoes PredictRequest.ids, in row order
    scores: NDArray[np.float32]  # (n, C)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", _as_ids(self.ids))
        check_float32(self.scores, "scores", ndim=2)
        if len(self.ids) != self.scores.shape[0]:
            raise ValueError(f"{len(self.ids)} ids for {self.scores.shape[0]} rows of scores")


# ------------------------------------------------------------------------------------------
# Field checks on construction
# ------------------------------------------------------------------------------------------


def _check_digest(digest: object, name: str) -> None:
    if not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES:
        raise ValueError(f"{name} must be exactly {DIGEST_BYTES} bytes, got {digest!r}")


def _as_int(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be an int, got a bool")
    number = operator.index(value)  # type: ignore[arg-type]  # TypeError for non-integers
    if not lo <= number <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {number}")
    return number


def _as_float(value: object, name: str) -> float:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def _as_metrics(metrics: object) -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping, got {type(metrics).__name__}")
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric names must be str, got {key!r}")
        out[key] = _as_float(value, f"metrics[{key!r}]")
    return out


def _as_ids(ids: object) -> list[str]:
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise TypeError(f"ids must be a sequence of str, got {type(ids).__name__}")
    out = list(ids)
    for i in out:
        if not isinstance(i, str):
            raise TypeError(f"ids must be str, got {i!r}")
    return out


# ------------------------------------------------------------------------------------------
# Field reads from the wire
# ------------------------------------------------------------------------------------------


def metrics_from_wire(f: Fields, key: str, limits: DecodeLimits) -> dict[str, float]:
    """A metrics map: str names to floats (ints are read as floats)."""
    value = f.get_raw(key)
    if not isinstance(value, dict):
        raise CodecError(f"{f.where}.{key}: expected a map, got {type_name(value)}")
    if len(value) > limits.max_metrics:
        raise CodecError(
            f"{f.where}.{key}: {len(value)} metrics, over the limit {limits.max_metrics}"
        )
    out: dict[str, float] = {}
    for name, number in value.items():
        if type(name) is not str:
            raise CodecError(f"{f.where}.{key}: metric names must be str, got {type_name(name)}")
        if type(number) is not float and type(number) is not int:
            raise CodecError(f"{f.where}.{key}[{name!r}]: expected float, got {type_name(number)}")
        out[name] = float(number)
    return out


def ids_from_wire(f: Fields, key: str, limits: DecodeLimits) -> list[str]:
    """A non-empty array of str ids, at most ``limits.max_batch``."""
    value = f.get_raw(key)
    if not isinstance(value, list):
        raise CodecError(f"{f.where}.{key}: expected an array of str, got {type_name(value)}")
    if not 1 <= len(value) <= limits.max_batch:
        raise CodecError(f"{f.where}.{key}: must hold 1..{limits.max_batch} ids, got {len(value)}")
    for i in value:
        if type(i) is not str:
            raise CodecError(f"{f.where}.{key}: ids must be str, got {type_name(i)}")
    return value
