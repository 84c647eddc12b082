"""Party A's feature table: id-keyed rows, CSV/Parquet (pixel columns for images) or .npz."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shared.tables import TableError, read_id_table

__all__ = ["FeatureTable", "load_features"]


@dataclass(frozen=True)
class FeatureTable:
    """ids: n unique strings; x: (n, k) feature matrix in ``columns`` order (float32; integer
    token ids for token models); groups: the client of each row, for the 'clients' schedule."""

    ids: list[str]
    x: np.ndarray
    columns: list[str]
    groups: list[str] | None = None

    def index(self) -> dict[str, int]:
        return {i: row for row, i in enumerate(self.ids)}


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

    ``standardize`` z-scores each column over the whole table (statistics of features only;
    party A never sees labels).
    """
    table = read_id_table(path, id_column=id_column)
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
    x = table.matrix(names)
    if standardize:
        std = x.std(axis=0, keepdims=True)
        x = ((x - x.mean(axis=0, keepdims=True)) / np.where(std > 0, std, 1.0)).astype(np.float32)
    return FeatureTable(ids=table.ids, x=x, columns=names, groups=groups)
