"""Party A's fitted preparation: what turns its feature table into the bottom model's input.

``FeatureTransform.fit`` runs once, on the run's training rows, when the run is aligned; the
result is stored with the run (``party_a.store.RunServing``, never sent to party B) and every
later use applies it unchanged: training and its resume, evaluation, prediction on a serving
table, and the export. The bottom model's input, (n, width) float32, is laid out as

    [ k numbers (filled, z-scored) | one missing indicator per flagged number | c codes ]

where each of the c categorical columns is one column of bucket codes (``shared.preparation
.Vocabulary``: 0 = no bucket, 1..size), which the bottom model one-hot encodes or embeds
(``shared.models.tabular``). The bottom's ``in_features`` is ``width`` and its
``categories`` are the columns' ``size + 1`` codes (``bottom_kwargs``).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from party_a.errors import ConfigError
from party_a.phases import phase
from shared.idtables import TableError
from shared.preparation import NumericFit, Preparation, PreparationSettings, Vocabulary
from shared.typedtables import TextColumn

__all__ = ["FeatureTransform", "Table", "bottom_kwargs"]


class Table(Protocol):
    """What a preparation reads of a feature table (``party_a.features.FeatureTable``)."""

    @property
    def ids(self) -> list[str]: ...

    @property
    def x(self) -> np.ndarray:
        """(n, k) number columns, NaN for an empty cell."""
        ...

    @property
    def columns(self) -> list[str]: ...

    @property
    def categorical(self) -> Mapping[str, TextColumn]: ...

    @property
    def standardize(self) -> bool: ...

    @property
    def settings(self) -> PreparationSettings: ...

    @property
    def declared(self) -> frozenset[str]: ...

    def in_order(self, columns: list[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class FeatureTransform(Preparation):
    """One run's preparation: ``numeric`` (the number columns, in the order the bottom reads
    them) and ``categorical`` (one vocabulary per categorical column, in table order); stored
    as ``Preparation.to_json``."""

    # ------------------------------------------------------------------ what it reads and makes

    @property
    def columns(self) -> list[str]:
        """The number columns, in the bottom model's order."""
        return self.numeric.columns

    @property
    def mean(self) -> list[float] | None:
        return self.numeric.mean

    @property
    def scale(self) -> list[float] | None:
        return self.numeric.scale

    @property
    def source_columns(self) -> list[str]:
        """Every column of the feature table the run reads."""
        return [*self.numeric.columns, *(v.name for v in self.categorical)]

    @property
    def width(self) -> int:
        """Columns of the prepared matrix: numbers, indicators, one code per category."""
        return self.numeric.width + len(self.categorical)

    @property
    def categories(self) -> list[int]:
        """Codes of each categorical column (its buckets and the 0 of no bucket)."""
        return [v.size + 1 for v in self.categorical]

    def output_names(self) -> list[str]:
        """A name for each column of the prepared matrix (for the export's manifest)."""
        return [
            *self.numeric.columns,
            *(f"{c} (missing)" for c in self.numeric.indicators),
            *(v.name for v in self.categorical),
        ]

    # ------------------------------------------------------------------ fit and apply

    @classmethod
    def fit(cls, table: Table, rows: np.ndarray) -> "FeatureTransform":
        """The preparation of ``table`` with statistics over ``rows`` (the training rows)."""
        if len(table.columns) != table.x.shape[1]:
            # unnamed columns (token sequences built in code): fed to the model as they are
            return cls(numeric=NumericFit(columns=list(table.columns)))
        numeric = NumericFit.fit(table.x, rows, table.columns, standardize=table.standardize)
        vocabularies = tuple(
            Vocabulary.fit(name, column, rows, table.settings, declared=name in table.declared)
            for name, column in table.categorical.items()
        )
        return cls(numeric=numeric, categorical=vocabularies)

    @classmethod
    def of_numbers(cls, table: Table) -> "FeatureTransform | None":
        """The layout (not the statistics) that fitting a table of numbers without a
        missing value gives, whatever its rows: its columns as they are; None for any other
        table, whose layout the training rows decide (indicators, vocabularies)."""
        if table.categorical or _any_missing(table.x):
            return None
        return cls(numeric=NumericFit(columns=list(table.columns)))

    def apply(self, table: Table) -> np.ndarray:
        """(n, width) float32; a table of numbers only, none missing, with nothing to fit
        (token ids, unstandardized pixels) comes back as it is."""
        x = table.in_order(self.numeric.columns)
        if not self.categorical and self.numeric.is_identity() and not _any_missing(x):
            return x
        out = np.empty((len(table.ids), self.width), dtype=np.float32)
        filled = self.numeric.apply_into(x, out)
        outside: dict[str, int] = {}
        empty: dict[str, int] = {}
        for j, vocabulary in enumerate(self.categorical):
            column = table.categorical.get(vocabulary.name)
            if column is None:
                raise TableError(
                    f"column {vocabulary.name!r} is categorical in this run, but the table "
                    "holds it as numbers"
                )
            codes, outside[vocabulary.name], empty[vocabulary.name] = vocabulary.encode(column)
            out[:, self.numeric.width + j] = codes
        _say_what_was_filled(len(table.ids), filled, outside, empty, self.categorical)
        return out


def _any_missing(x: np.ndarray) -> bool:
    return x.dtype.kind == "f" and bool(np.isnan(x).any())


def _say_what_was_filled(
    rows: int,
    filled: dict[str, int],
    outside: dict[str, int],
    empty: dict[str, int],
    vocabularies: tuple[Vocabulary, ...],
) -> None:
    """One line of what the preparation had to fill or pool in this table, if anything. A
    value outside the vocabulary (rare in training, or never seen) goes to "other": the
    column's other bucket, or the zero input where the training rows had no rare value."""
    parts = [f"{c} {n:,} missing (median)" for c, n in filled.items()]
    for v in vocabularies:
        if empty[v.name]:
            went = "missing bucket" if v.missing else "the zero input"
            parts.append(f"{v.name} {empty[v.name]:,} missing ({went})")
        if outside[v.name]:
            went = "other" if v.other else "other: the zero input"
            parts.append(f"{v.name} {outside[v.name]:,} not seen in training ({went})")
    if parts:
        phase("prepared %s rows: %s", f"{rows:,}", "; ".join(parts))


def bottom_kwargs(model: str, given: dict[str, Any], transform: FeatureTransform) -> dict[str, Any]:
    """The bottom model's kwargs: the config's ``[model.bottom]`` with the input's width and
    the categorical columns' codes filled in from the fitted preparation."""
    from shared.models import categories_kwarg, input_width_kwarg

    kwargs = dict(given)
    width, categories = input_width_kwarg(model), categories_kwarg(model)
    if transform.categorical and categories is None:
        names = [v.name for v in transform.categorical]
        raise ConfigError(
            f"model {model!r} reads numbers only, but columns {names[:5]} are categorical: "
            "use tabular_mlp, or leave them out ([data] drop)"
        )
    if width is not None:
        if width in kwargs and kwargs[width] != transform.width:
            raise ConfigError(
                f"[model.bottom] {width} = {kwargs[width]}, but the prepared table has "
                f"{transform.width} columns ({len(transform.columns)} numbers, "
                f"{len(transform.numeric.indicators)} missing indicators, "
                f"{len(transform.categorical)} categories): leave {width} out"
            )
        kwargs[width] = transform.width
    if categories is not None and transform.categorical:
        kwargs[categories] = transform.categories
    return kwargs
