"""Party B's data: the label column and, optionally, its own feature columns, keyed by id.

The service reads everything through the small :class:`LabelSource` interface so that the
experiment harness can plug in other label sets (images, tags, next tokens) and still run the
very same step code.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from shared.idtables import IdTable, TableError, check_columns, read_id_table
from shared.types import Task

__all__ = ["LabelSource", "LabelTable", "load_label_table"]


class LabelSource(Protocol):
    """What the top model needs from party B's data, by row position in ``ids``."""

    @property
    def task(self) -> Task: ...

    @property
    def num_outputs(self) -> int:
        """Classes, tags or vocabulary size: the width of the top model's output."""
        ...

    @property
    def side_width(self) -> int:
        """Party B's feature columns available to the top model (0 = none)."""
        ...

    @property
    def ids(self) -> list[str]: ...

    @property
    def groups(self) -> Sequence[str] | None:
        """The client of each row (the 'clients' batch schedule needs it), or None."""
        ...

    @property
    def accuracy_excludes(self) -> tuple[int, ...]:
        """Target classes left out of accuracy but kept in the loss (e.g. end of sentence)."""
        ...

    @property
    def prediction_excludes(self) -> tuple[int, ...]:
        """Classes accuracy never predicts: their logits are masked before the argmax (FedJAX's
        ``logits_mask``: pad, bos, eos and oov on Stack Overflow next-word). Targets in this set
        that are not in ``accuracy_excludes`` count as mistakes (an OOV target)."""
        ...

    @property
    def labeled(self) -> np.ndarray | None:
        """(n,) bool: the rows that have a label (only they train or evaluate; the others can
        only be scored), or None when every row has one."""
        ...

    def targets(self, rows: np.ndarray) -> Tensor:
        """Targets of ``rows``: (n,) int64 classes, or (n, num_outputs) multi-hot, or (n*T,)."""
        ...

    def side(self, rows: np.ndarray) -> Tensor:
        """Party B's features of ``rows``: (n, side_width) float32."""
        ...


@dataclass(frozen=True)
class LabelTable:
    """A classification label column plus standardized feature columns, keyed by id.

    labels:   (n,) int64 class index into ``classes``; -1 for a row without a label (a
              sample party B only serves: it can be scored, never trained or evaluated on)
    features: (n, k) float32, z-scored per column with ``feature_mean`` / ``feature_scale``,
              the statistics of the labeled rows (adding rows to serve changes nothing)
    row_groups: the client of each row, when the table has a client column
    """

    row_ids: list[str]
    labels: np.ndarray
    classes: list[str]
    features: np.ndarray
    feature_names: list[str]
    task: Task = "classification"
    row_groups: list[str] | None = None
    feature_mean: list[float] | None = None
    feature_scale: list[float] | None = None

    @property
    def ids(self) -> list[str]:
        return self.row_ids

    @property
    def groups(self) -> list[str] | None:
        return self.row_groups

    @property
    def accuracy_excludes(self) -> tuple[int, ...]:
        return ()

    @property
    def prediction_excludes(self) -> tuple[int, ...]:
        return ()

    @property
    def labeled(self) -> np.ndarray | None:
        mask = self.labels >= 0
        return None if bool(mask.all()) else mask

    @property
    def num_outputs(self) -> int:
        return len(self.classes)

    @property
    def side_width(self) -> int:
        return int(self.features.shape[1])

    def targets(self, rows: np.ndarray) -> Tensor:
        return torch.from_numpy(self.labels[rows])

    def side(self, rows: np.ndarray) -> Tensor:
        return torch.from_numpy(self.features[rows])


def load_label_table(
    path: Path,
    *,
    id_column: str,
    label_column: str,
    feature_columns: list[str] | None,
    group_column: str | None = None,
) -> LabelTable:
    """Read party B's table. ``feature_columns=None`` takes every column but id, label and
    the client column ``group_column`` (needed only by the 'clients' batch schedule)."""
    table = _read(path, id_column, label_column, feature_columns, group_column)
    if label_column not in table.columns:
        raise TableError(
            f"{path} has no label column {label_column!r}; columns: {sorted(table.columns)}"
        )
    raw_labels = table.columns[label_column]
    # an empty label is a row party B serves but cannot train on (a new customer)
    has_label = ~np.asarray(pd.isna(raw_labels), dtype=bool)
    values = [str(v) for v in raw_labels.tolist()]
    classes = sorted({v for v, ok in zip(values, has_label, strict=True) if ok}, key=_numeric_first)
    if len(classes) < 2:
        raise TableError(f"{path}: label column {label_column!r} has fewer than 2 classes")
    index = {c: i for i, c in enumerate(classes)}
    labels = np.array(
        [index[v] if ok else -1 for v, ok in zip(values, has_label, strict=True)], dtype=np.int64
    )

    groups = None
    if group_column is not None:
        if group_column not in table.columns:
            raise TableError(f"{path} has no client column {group_column!r}")
        groups = [str(v) for v in table.columns[group_column].tolist()]
    names = (
        [c for c in table.columns if c not in (label_column, group_column)]
        if feature_columns is None
        else list(feature_columns)
    )
    if label_column in names or (group_column is not None and group_column in names):
        raise TableError("the label and client columns cannot also be feature columns")
    raw = table.matrix(names)  # float32, as the statistics and their arithmetic
    fitted = raw[has_label] if len(names) else np.zeros((1, 0), np.float32)
    mean = fitted.mean(axis=0)
    std = fitted.std(axis=0)
    scale = np.where(std > 0, std, np.float32(1.0))
    return LabelTable(
        row_ids=table.ids,
        labels=labels,
        classes=classes,
        features=((raw - mean) / scale).astype(np.float32),
        feature_names=names,
        row_groups=groups,
        feature_mean=mean.tolist(),
        feature_scale=scale.tolist(),
    )


def _read(
    path: Path,
    id_column: str,
    label_column: str,
    feature_columns: list[str] | None,
    group_column: str | None,
) -> IdTable:
    """The table's header first (a wrong column name is told before the rows are read),
    then the columns party B uses (all of them when no feature columns are named)."""
    required = {id_column: "id column", label_column: "label column"}
    required |= {group_column: "client column"} if group_column else {}
    required |= dict.fromkeys(feature_columns or (), "feature column")
    check_columns(path, required)
    return read_id_table(
        path,
        id_column=id_column,
        columns=None if feature_columns is None else [c for c in required if c != id_column],
    )


def _numeric_first(value: str) -> tuple[int, float, str]:
    """Sort class labels numerically when they are numbers ('2' < '10'), else as text."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)
