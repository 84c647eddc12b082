"""What a run's uplink would weigh without FedLite: the baseline of its compression ratio.

The ratio the operator sees is the one party A's progress bar shows: bytes of a SplitFed step
request (the same step's activations as raw float32, msgpack headers included:
``shared.accounting.raw_step_request_bytes``) over the bytes party B actually received for
the step. Under the default ``shuffle`` schedule every step has ``batch_size`` samples, so
the baseline follows from the run's config alone. Under the ``clients`` schedule the rows of
a step depend on which clients were drawn; there the ratio is not shown (None) rather than
guessed.
"""

import functools

import numpy as np

from api_schemas import RunCreate
from party_b.labels import LabelSource
from shared.accounting import raw_step_request_bytes

__all__ = ["RawBaseline", "raw_step_bytes", "rows_per_sample"]


class RawBaseline:
    """The raw step bytes of runs on one label set (its rows per sample read once)."""

    def __init__(self, labels: LabelSource) -> None:
        self._labels = labels
        self._rows_per_sample: int | None = None

    def per_step(self, config: RunCreate) -> int | None:
        if self._rows_per_sample is None:
            self._rows_per_sample = rows_per_sample(self._labels)
        return raw_step_bytes(config, self._rows_per_sample)


def rows_per_sample(labels: LabelSource) -> int:
    """Activation rows per sample: 1, or T (one per token) for sequence models; the same for
    every row (the targets of one sample are (1,), (1, tags) or (T,))."""
    if not labels.ids:
        return 1
    return int(labels.targets(np.zeros(1, dtype=np.int64)).shape[0])


def raw_step_bytes(config: RunCreate, rows_of_a_sample: int) -> int | None:
    """Bytes of one raw float32 step request of the run (None under the clients schedule)."""
    if config.schedule.kind != "shuffle":
        return None
    # a run with parties: each party's raw request of its own width d_p
    rows = config.batch_size * rows_of_a_sample
    return sum(_raw_bytes(p.cut_dim, rows) for p in config.feature_parties())


_ENCODED_UP_TO = 2**24  # floats; past that, payload + the headers of a 16 M float message


@functools.lru_cache(maxsize=64)
def _raw_bytes(d: int, rows: int) -> int:
    """Measured by encoding a message of zeros (so headers count); cached per shape. A message
    over 64 MiB is not built for a dashboard: its float bytes plus the headers measured at
    16 M floats (the msgpack headers of larger ones differ by a few bytes at most)."""
    if d * rows <= _ENCODED_UP_TO:
        return raw_step_request_bytes(d=d, batch=rows)
    return 4 * d * rows + _raw_bytes(1, _ENCODED_UP_TO) - 4 * _ENCODED_UP_TO
