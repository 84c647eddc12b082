"""Party A's feature table: id-keyed rows, CSV/Parquet (pixel columns for images) or .npz."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shared.tables import read_id_table

__all__ = ["FeatureTable", "load_features"]


@dataclass(frozen=True)
class FeatureTable:
    """ids: n unique strings; x: (n, k) float32 feature matrix in ``columns`` order."""

    ids: list[str]
    x: np.ndarray
    columns: list[str]

    def index(self) -> dict[str, int]:
        return {i: row for row, i in enumerate(self.ids)}


def load_features(
    path: Path, *, id_column: str, feature_columns: list[str] | None, standardize: bool
) -> FeatureTable:
    """Read party A's table; ``feature_columns`` empty/None means every column but the id.

    ``standardize`` z-scores each column over the whole table (statistics of features only;
    party A never sees labels).
    """
    table = read_id_table(path, id_column=id_column)
    names = list(feature_columns) if feature_columns else list(table.columns)
    x = table.matrix(names)
    if standardize:
        std = x.std(axis=0, keepdims=True)
        x = ((x - x.mean(axis=0, keepdims=True)) / np.where(std > 0, std, 1.0)).astype(np.float32)
    return FeatureTable(ids=table.ids, x=x, columns=names)
