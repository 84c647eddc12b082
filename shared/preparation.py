"""A table's columns made ready for a model, fitted on training rows only: one code for party
A's bottom-model inputs (``party_a.preparation``) and party B's side features
(``party_b.labels``).

* **Numbers** (``NumericFit``): an empty cell is filled with the column's median over the
  training rows, and a column with an empty cell among them gets a missing-indicator column
  (1.0 where the cell was empty); then, with ``standardize``, the z-score of the filled
  column over the training rows (a column of standard deviation 0 is only centred). The
  arithmetic is float32 and the statistics are those of releases that knew only numbers, so
  that a numeric table without empty cells gets the very same bits.
* **Categories** (``Vocabulary``): the values seen in at least ``min_frequency`` training
  rows, the ``max_categories`` most frequent of them, each get a bucket; the rest (rare
  values, and at serving a value never seen) share an *other* bucket, and empty cells a
  *missing* bucket, each only when the training rows had such a value. Buckets are codes
  1..size; code 0 means "no bucket" (a value for which training learned nothing): a zero
  one-hot row, a zero embedding (``shared.models.tabular``).

Nothing here leaves its party: party A's preparation stays in its state and its export,
party B's in its process and its export (``SideFeatures``).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Self

import numpy as np

from shared.idtables import TableError
from shared.typedtables import Held, TextColumn

__all__ = [
    "ColumnSummary",
    "NumericFit",
    "Preparation",
    "PreparationSettings",
    "SideFeatures",
    "Vocabulary",
    "one_hot",
    "summary_lines",
]

_STAT_COLUMNS = 16  # columns whose statistics are computed at once (memory: a block's copy)
_APPLY_ROWS = 65_536  # rows prepared at once (memory: a block's temporaries)


@dataclass(frozen=True)
class PreparationSettings:
    """How categories are fitted ([data] max_categories, min_frequency)."""

    max_categories: int = 1000  # buckets of known values per column, at most
    min_frequency: int = 5  # a value in fewer training rows is pooled into "other"


# ---------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NumericFit:
    """The fitted preparation of k number columns.

    fill: k medians of the training rows (float32 values, exact in JSON); None for a run
        stored before empty cells were filled (it refuses them, as it always did)
    indicators: the columns that get a missing-indicator column, in ``columns`` order
    mean, scale: k float32 values each, or None without standardization
    """

    columns: list[str]
    fill: list[float] | None = None
    indicators: list[str] = field(default_factory=list)
    mean: list[float] | None = None
    scale: list[float] | None = None

    @property
    def width(self) -> int:
        """Output columns: the k numbers, then one indicator per listed column."""
        return len(self.columns) + len(self.indicators)

    @classmethod
    def fit(
        cls, x: np.ndarray, rows: np.ndarray, columns: Sequence[str], *, standardize: bool
    ) -> "NumericFit":
        """Statistics of ``x[rows]`` ((n, k) float32, NaN for empty cells), in blocks of
        columns so that memory holds one block's copy of the training rows at a time."""
        k = x.shape[1]
        fill, has_missing = np.zeros(k, np.float32), np.zeros(k, bool)
        mean, std = np.zeros(k, np.float32), np.ones(k, np.float32)
        for start, stop in _column_blocks(k):
            block = np.ascontiguousarray(x[rows, start:stop], dtype=np.float32)  # (n_train, w)
            _check_finite(block, columns[start:stop])
            empty = np.isnan(block)
            has_missing[start:stop] = empty.any(axis=0)
            for j in range(stop - start):
                present = block[~empty[:, j], j]
                fill[start + j] = np.median(present) if len(present) else np.float32(0.0)
            if empty.any():
                block[empty] = np.broadcast_to(fill[start:stop], block.shape)[empty]
            if standardize:
                # over a block of >= 2 columns, numpy sums each column in the same order as
                # over the whole matrix (one column alone it sums pairwise: other bits)
                mean[start:stop] = block.mean(axis=0)
                std[start:stop] = block.std(axis=0)
        return cls(
            columns=list(columns),
            fill=fill.tolist(),
            indicators=[c for c, m in zip(columns, has_missing.tolist(), strict=True) if m],
            mean=mean.tolist() if standardize else None,
            scale=np.where(std > 0, std, np.float32(1.0)).tolist() if standardize else None,
        )

    def is_identity(self) -> bool:
        """Whether applying it to a table without empty cells changes nothing."""
        return self.mean is None and not self.indicators

    def apply_into(self, x: np.ndarray, out: np.ndarray) -> dict[str, int]:
        """Write the prepared ``x`` ((n, k), NaN = empty) to ``out[:, :width]`` (float32), a
        block of rows at a time; returns the empty cells filled, per column (only those with
        some)."""
        k = len(self.columns)
        if x.shape[1] != k:
            raise TableError(f"{x.shape[1]} number columns for a preparation of {k}")
        mean = None if self.mean is None else np.asarray(self.mean, dtype=np.float32)
        scale = None if self.scale is None else np.asarray(self.scale, dtype=np.float32)
        fill = None if self.fill is None else np.asarray(self.fill, dtype=np.float32)
        flagged = [self.columns.index(c) for c in self.indicators]
        missing = np.zeros(k, np.int64)
        for start in range(0, len(x), _APPLY_ROWS):
            block = x[start : start + _APPLY_ROWS].astype(np.float32)
            _check_finite(block, self.columns)
            empty = np.isnan(block)
            counts = empty.sum(axis=0)
            missing += counts
            if counts.any():
                if fill is None:
                    self._refuse_missing(counts)
                block[empty] = np.broadcast_to(fill, block.shape)[empty]
            if mean is not None and scale is not None:
                block = (block - mean) / scale
            out[start : start + len(block), :k] = block
            out[start : start + len(block), k : self.width] = empty[:, flagged]
        return {c: int(m) for c, m in zip(self.columns, missing.tolist(), strict=True) if m}

    def _refuse_missing(self, counts: np.ndarray) -> NoReturn:
        names = [c for c, m in zip(self.columns, counts.tolist(), strict=True) if m]
        raise TableError(
            f"columns with missing values: {names[:5]}; this run was trained by a release "
            "that filled none: give every cell a value"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "columns": self.columns,
            "mean": self.mean,
            "scale": self.scale,
            "fill": self.fill,
            "indicators": self.indicators,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "NumericFit":
        """Also reads the JSON of releases before empty cells were filled (no fill)."""
        return cls(
            columns=list(data["columns"]),
            fill=data.get("fill"),
            indicators=list(data.get("indicators") or []),
            mean=data.get("mean"),
            scale=data.get("scale"),
        )


def _column_blocks(k: int) -> list[tuple[int, int]]:
    """[start, stop) blocks of ``_STAT_COLUMNS`` columns; never a block of one column when
    there are several (a lone last column joins the block before it)."""
    bounds = list(range(0, k, _STAT_COLUMNS)) + [k]
    blocks = list(zip(bounds[:-1], bounds[1:], strict=True))
    if len(blocks) > 1 and blocks[-1][1] - blocks[-1][0] == 1:
        blocks[-2:] = [(blocks[-2][0], k)]
    return blocks


def _check_finite(x: np.ndarray, columns: Sequence[str]) -> None:
    if x.dtype.kind != "f":
        return
    infinite = np.isinf(x).any(axis=0)
    if infinite.any():
        names = [c for c, bad in zip(columns, infinite.tolist(), strict=True) if bad]
        raise TableError(
            f"columns with infinite values: {names[:5]}: replace them with numbers, or leave "
            "the cells empty (missing values are filled with the training median)"
        )


# ---------------------------------------------------------------------------------------------
# Categories
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Vocabulary:
    """The buckets of one categorical column: ``values`` are codes 1..len(values), then the
    *other* bucket (when ``other``), then the *missing* bucket (when ``missing``); code 0 is
    no bucket. ``declared``: the run config named the column categorical (it is read as text
    whatever it holds)."""

    name: str
    values: list[str]
    other: bool = False
    missing: bool = False
    declared: bool = False

    @property
    def size(self) -> int:
        """Buckets (codes 1..size); the bottom model's input takes size + 1 codes."""
        return len(self.values) + int(self.other) + int(self.missing)

    @property
    def other_code(self) -> int:
        return len(self.values) + 1 if self.other else 0

    @property
    def missing_code(self) -> int:
        return len(self.values) + int(self.other) + 1 if self.missing else 0

    @classmethod
    def fit(
        cls,
        name: str,
        column: TextColumn,
        rows: np.ndarray,
        settings: PreparationSettings,
        *,
        declared: bool = False,
    ) -> "Vocabulary":
        """The buckets of ``column`` from its training ``rows``: most frequent first (ties in
        the values' order as text), so that the same rows always give the same codes."""
        codes = column.codes[rows]
        present = codes[codes >= 0]
        counts = np.bincount(present, minlength=len(column.values))
        frequent: list[int] = np.flatnonzero(counts >= settings.min_frequency).tolist()
        frequent.sort(key=lambda i: (-int(counts[i]), column.values[i]))
        kept = frequent[: settings.max_categories]
        return cls(
            name=name,
            values=[column.values[i] for i in kept],
            other=int(counts.sum()) > int(counts[kept].sum()),
            missing=len(present) < len(codes),
            declared=declared,
        )

    def encode(self, column: TextColumn) -> tuple[np.ndarray, int, int]:
        """(n,) int64 bucket codes of ``column`` (any table's: its own dictionary), the
        number of cells outside the vocabulary (to the other bucket, or none) and of empty
        cells."""
        bucket = {v: i + 1 for i, v in enumerate(self.values)}
        lookup = np.array(
            [bucket.get(v, self.other_code) for v in column.values] + [self.missing_code],
            dtype=np.int64,
        )  # the last entry is where code -1 (empty) lands
        codes = lookup[column.codes]
        known = np.array([v in bucket for v in column.values] + [True], dtype=bool)
        empty = int((column.codes < 0).sum())
        outside = int((~known[column.codes]).sum())
        return codes, outside, empty

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "values": self.values,
            "other": self.other,
            "missing": self.missing,
            "declared": self.declared,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Vocabulary":
        return cls(
            name=str(data["name"]),
            values=[str(v) for v in data["values"]],
            other=bool(data["other"]),
            missing=bool(data["missing"]),
            declared=bool(data.get("declared", False)),
        )


def one_hot(codes: np.ndarray, size: int) -> np.ndarray:
    """(n, size) float32: column j is 1.0 where the code is j + 1; code 0 is a zero row."""
    out = np.zeros((len(codes), size), dtype=np.float32)
    rows = np.flatnonzero(codes > 0)
    out[rows, codes[rows] - 1] = 1.0
    return out


@dataclass(frozen=True)
class Preparation:
    """A table's fitted preparation as each party stores it: ``numeric`` (its number
    columns) and ``categorical`` (one vocabulary per categorical column), one JSON object
    (``to_json``). Party A's ``FeatureTransform`` feeds codes to its bottom model; party B's
    ``SideFeatures`` one-hot columns to its top model."""

    numeric: NumericFit
    categorical: tuple[Vocabulary, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return self.numeric.to_json() | {"categorical": [v.to_json() for v in self.categorical]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """Also reads what releases before categories stored: columns, mean and scale."""
        return cls(
            numeric=NumericFit.from_json(data),
            categorical=tuple(Vocabulary.from_json(v) for v in data.get("categorical") or []),
        )


@dataclass(frozen=True)
class SideFeatures(Preparation):
    """Party B's side columns as its top model reads them: the numbers (``numeric``, z-scored),
    then each categorical column one-hot over its buckets (a dense matrix: the top model has
    no embeddings). Party B's label table is prepared with it at start-up
    (``party_b.labels``) and ``fedlite-b export`` writes its JSON, so that scoring from the
    export prepares a table exactly as the service did."""

    @property
    def width(self) -> int:
        return self.numeric.width + sum(v.size for v in self.categorical)

    def apply(self, numbers: np.ndarray, text: Mapping[str, TextColumn]) -> np.ndarray:
        """(n, width) float32 from the table's number columns ``numbers`` ((n, k), NaN =
        empty, in ``numeric.columns`` order) and its text columns by name."""
        features = np.empty((len(numbers), self.width), dtype=np.float32)
        self.numeric.apply_into(numbers, features)
        at = self.numeric.width
        for vocabulary in self.categorical:
            column = text.get(vocabulary.name)
            if column is None:
                raise TableError(
                    f"column {vocabulary.name!r} was categorical when the run was trained, "
                    "but the table holds it as numbers"
                )
            codes, _outside, _empty = vocabulary.encode(column)
            features[:, at : at + vocabulary.size] = one_hot(codes, vocabulary.size)
            at += vocabulary.size
        return features


# ---------------------------------------------------------------------------------------------
# What was read, said before anything is fitted or sent
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnSummary:
    """One column as read: its kind, why (``inferred`` from what the file ``held``, or
    ``declared`` in the config), its distinct values (categories) and empty cells."""

    name: str
    kind: str  # "numeric" or "categorical"
    held: Held
    declared: bool
    distinct: int | None  # categories only
    missing: int


def summary_lines(columns: Sequence[ColumnSummary]) -> tuple[str, list[str]]:
    """The typing of a table as a person reads it: a headline ("6 numeric, 3 categorical,
    4 with missing values"), and a line per column that is more than numbers without an
    empty cell (categorical, or with missing values)."""
    numeric = [c for c in columns if c.kind == "numeric"]
    categorical = [c for c in columns if c.kind == "categorical"]
    missing = sum(1 for c in columns if c.missing)
    headline = f"{len(numeric)} numeric, {len(categorical)} categorical, " + (
        f"{missing} with missing values" if missing else "none missing"
    )
    lines = []
    for c in numeric:
        if c.missing:
            why = "declared numeric" if c.declared else "numbers"
            lines.append(
                f"{c.name}: numeric ({why}), {c.missing:,} missing "
                "(filled with the training median, plus a missing-indicator column)"
            )
    for c in categorical:
        why = "declared categorical" if c.declared else f"{c.held} values"
        empty = f", {c.missing:,} missing (a missing bucket)" if c.missing else ""
        lines.append(f"{c.name}: categorical ({why}), {c.distinct:,} distinct values{empty}")
    return headline, lines
