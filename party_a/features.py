"""Party A's feature table and the transform a run applies to it.

The table is read as it is (CSV/Parquet, pixel columns for images, or .npz). What the bottom
model sees is ``FeatureTransform.apply`` of it: the run's columns in the run's order,
z-scored with statistics of the run's *training rows only*, fitted once when the run is
aligned and stored with the run (``party_a.store.RunServing``). Evaluation, prediction and
an export apply the stored transform unchanged, so a serving table -- new customers, no
training rows at all -- gets the very numbers training would have given the same rows.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shared.idtables import TableError, read_id_table

__all__ = ["FeatureTable", "FeatureTransform", "load_features"]


@dataclass(frozen=True)
class FeatureTable:
    """ids: n unique strings; x: (n, k) feature matrix in ``columns`` order, as read (float32;
    integer token ids for token models); groups: the client of each row, for the 'clients'
    schedule; standardize: z-score the columns with the run's training-row statistics."""

    ids: list[str]
    x: np.ndarray
    columns: list[str]
    groups: list[str] | None = None
    standardize: bool = False

    def index(self) -> dict[str, int]:
        return {i: row for row, i in enumerate(self.ids)}

    def in_order(self, columns: list[str]) -> np.ndarray:
        """x with its columns in ``columns`` order (a run's order; the table's may differ)."""
        if columns == self.columns:
            return self.x
        where = {c: i for i, c in enumerate(self.columns)}
        missing = [c for c in columns if c not in where]
        if missing:
            raise TableError(f"the feature table lacks the run's columns {missing[:5]}")
        return self.x[:, [where[c] for c in columns]]


@dataclass(frozen=True)
class FeatureTransform:
    """Column order and per-column z-score of one run.

    columns: the k feature columns, in the order the bottom model reads them
    mean, scale: k float32 values each (exact in JSON), or None for no standardization;
        applied in float32, ``(x - mean) / scale``, the arithmetic of releases that z-scored
        the whole table (so a run they began resumes bit-identically, see ``fit``)
    """

    columns: list[str]
    mean: list[float] | None = None
    scale: list[float] | None = None

    @classmethod
    def fit(cls, table: FeatureTable, rows: np.ndarray) -> "FeatureTransform":
        """The transform of ``table`` with statistics over ``rows`` (the training rows)."""
        if not table.standardize:
            return cls(columns=list(table.columns))
        x = table.x[rows].astype(np.float32)
        std = x.std(axis=0)
        return cls(
            columns=list(table.columns),
            mean=x.mean(axis=0).tolist(),
            scale=np.where(std > 0, std, np.float32(1.0)).tolist(),
        )

    def apply(self, table: FeatureTable) -> np.ndarray:
        """(n, k) float32 (token ids untouched when there is no standardization)."""
        x = table.in_order(self.columns)
        if self.mean is None or self.scale is None:
            return x
        mean = np.asarray(self.mean, dtype=np.float32)
        scale = np.asarray(self.scale, dtype=np.float32)
        return ((x.astype(np.float32) - mean) / scale).astype(np.float32)

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "mean": self.mean, "scale": self.scale}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "FeatureTransform":
        return cls(columns=list(data["columns"]), mean=data.get("mean"), scale=data.get("scale"))


def load_features(
    path: Path,
    *,
    id_column: str,
    feature_columns: list[str] | None,
    standardize: bool,
    group_column: str | None = None,
) -> FeatureTable:
    """Read party A's table; ``feature_columns`` empty/None means every column but the id and
    the client column ``group_column`` (needed only by the 'clients' batch schedule).

    ``standardize`` is recorded, not applied: the run fits the z-score on its training rows
    (statistics of features only; party A never sees labels).
    """
    wanted = [*(feature_columns or []), *([group_column] if group_column else [])]
    # only the columns the run reads (all, when none are named), after a header check
    table = read_id_table(path, id_column=id_column, columns=wanted if feature_columns else None)
    groups = None
    if group_column is not None:
        if group_column not in table.columns:
            raise TableError(f"{path} has no client column {group_column!r}")
        groups = [str(v) for v in table.columns[group_column].tolist()]
    names = (
        list(feature_columns)
        if feature_columns
        else [c for c in table.columns if c != group_column]
    )
    return FeatureTable(
        ids=table.ids, x=table.matrix(names), columns=names, groups=groups, standardize=standardize
    )
