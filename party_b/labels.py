"""Party B's data: the label column and, optionally, its own feature columns, keyed by id.

The service reads everything through the small :class:`LabelSource` interface so that the
experiment harness can plug in other label sets (images, tags, next tokens) and still run the
very same step code.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from shared.idtables import TableError, check_columns
from shared.preparation import (
    ColumnSummary,
    NumericFit,
    PreparationSettings,
    SideFeatures,
    Vocabulary,
    summary_lines,
)
from shared.typedtables import TextColumn, TypedTable, read_typed_table
from shared.types import Task

__all__ = ["LabelSource", "LabelTable", "load_label_table"]

log = logging.getLogger("fedlite.party_b")


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
    """A classification label column plus prepared feature columns, keyed by id.

    labels:   (n,) int64 class index into ``classes``; -1 for a row without a label (a
              sample party B only serves: it can be scored, never trained or evaluated on)
    classes:  the label values as text, numbers in numeric order, words alphabetically
              ("bad" < "good"); score_i of a prediction is the probability of classes[i],
              and with two classes the second is the positive class AUC ranks
    features: (n, width) float32, party B's side columns prepared as party A's are
              (``shared.preparation``, fitted on the labeled rows, so adding rows to serve
              changes nothing): numbers z-scored, missing ones filled with the median plus
              an indicator column, categories one-hot (the top model reads a dense matrix)
    feature_mean, feature_scale: the z-score of a side table of numbers without missing
              values (what ``fedlite-b export`` writes); None otherwise
    side_preparation: the fitted preparation of the side columns (JSON)
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
    side_preparation: dict[str, Any] | None = None

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
    def unlabeled(self) -> int:
        """Rows without a label: left out of training and evaluation, still scored."""
        return int((self.labels < 0).sum())

    @property
    def positive_class(self) -> str | None:
        """The class of score_1 with two classes (AUC ranks by it); None with more."""
        return self.classes[1] if len(self.classes) == 2 else None

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


def class_names(labels: LabelSource, num_classes: int) -> list[str] | None:
    """The classes of a run on ``labels`` as text, in score order; None for a label source
    that names none (images, tags, next tokens) or has another number of them."""
    classes = labels.classes if isinstance(labels, LabelTable) else None
    return list(classes) if classes is not None and len(classes) == num_classes else None


def load_label_table(
    path: Path,
    *,
    id_column: str,
    label_column: str,
    feature_columns: list[str] | None,
    group_column: str | None = None,
    settings: PreparationSettings | None = None,
    categorical: Sequence[str] = (),
    numeric: Sequence[str] = (),
) -> LabelTable:
    """Read party B's table. ``feature_columns=None`` takes every column but id, label and
    the client column ``group_column`` (needed only by the 'clients' batch schedule). Labels
    are read as text (``"good"``/``"bad"``, several classes, or numbers); a row with an empty
    label is kept to be served, never trained on, and counted. A feature column is typed by
    what it holds (any word: categories), unless declared: ``categorical`` ones are categories
    whatever they hold (integer codes), ``numeric`` ones numbers (a word in one is an error
    naming its row)."""
    header = _check_header(path, id_column, label_column, feature_columns, group_column)
    names = (
        [c for c in header if c not in (id_column, label_column, group_column)]
        if feature_columns is None
        else list(feature_columns)
    )
    if label_column in names or (group_column is not None and group_column in names):
        raise TableError("the label and client columns cannot also be feature columns")
    _check_declared(names, categorical, numeric)
    texts = [label_column, *([group_column] if group_column else [])]
    table = read_typed_table(
        path,
        id_column=id_column,
        columns=[*texts, *names],
        as_text=[*texts, *categorical],
        as_number=numeric,
    )
    labels, classes = _classes(path, label_column, table.text[label_column])
    groups = None
    if group_column is not None:
        column = table.text[group_column]
        groups = [column.values[c] if c >= 0 else "" for c in column.codes.tolist()]
    declared = frozenset(categorical) | frozenset(numeric)
    side = _prepare_side(table, names, np.flatnonzero(labels >= 0), settings, declared)
    result = LabelTable(
        row_ids=table.ids,
        labels=labels,
        classes=classes,
        features=side.features,
        feature_names=names,
        row_groups=groups,
        feature_mean=side.mean,
        feature_scale=side.scale,
        side_preparation=side.preparation,
    )
    _say_what_was_read(path, label_column, result, side.summary)
    return result


def _check_header(
    path: Path,
    id_column: str,
    label_column: str,
    feature_columns: list[str] | None,
    group_column: str | None,
) -> list[str]:
    """The table's header, checked before any row is read: a wrong column name is told at
    once, with the closest one the header has."""
    required = {id_column: "id column", label_column: "label column"}
    required |= {group_column: "client column"} if group_column else {}
    required |= dict.fromkeys(feature_columns or (), "feature column")
    header = check_columns(path, required)
    if header is None:  # an .npz: its arrays' columns
        header = [id_column, *read_typed_table(path, id_column=id_column).held]
    return header


def _classes(path: Path, label_column: str, column: TextColumn) -> tuple[np.ndarray, list[str]]:
    """(n,) int64 class of every row (-1: no label) and the classes, in their order."""
    present = np.unique(column.codes[column.codes >= 0])
    classes = sorted({column.values[c] for c in present.tolist()}, key=_numeric_first)
    if len(classes) < 2:
        raise TableError(f"{path}: label column {label_column!r} has fewer than 2 classes")
    index = {c: i for i, c in enumerate(classes)}
    lookup = np.array([index.get(v, -1) for v in column.values] + [-1], dtype=np.int64)
    return lookup[column.codes], classes  # code -1 (empty) reads the last entry: -1


@dataclass(frozen=True)
class _Side:
    features: np.ndarray  # (n, width) float32
    mean: list[float] | None
    scale: list[float] | None
    preparation: dict[str, Any]
    summary: tuple[str, list[str]]


def _check_declared(names: list[str], categorical: Sequence[str], numeric: Sequence[str]) -> None:
    """TableError for a declared column that is not a feature column, or declared twice."""
    both = sorted(set(categorical) & set(numeric))
    if both:
        raise TableError(f"columns {both} are declared both categorical and numeric")
    for flag, columns in (("categorical", categorical), ("numeric", numeric)):
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise TableError(
                f"--{flag} (FEDLITE_B_{flag.upper()}) names {unknown}, which are not party B's "
                f"feature columns ({', '.join(names) or 'none'})"
            )


def _prepare_side(
    table: TypedTable,
    names: list[str],
    labeled: np.ndarray,
    settings: PreparationSettings | None,
    declared: frozenset[str] = frozenset(),
) -> _Side:
    """Party B's side columns prepared with statistics of the labeled rows (the arithmetic
    of releases that knew numbers only, for a table of numbers without missing values);
    ``declared``: the columns the operator typed (the rest were typed by what they hold)."""
    numbers = [c for c in names if c not in table.text]
    where = {c: j for j, c in enumerate(table.numeric_names)}
    x = table.numeric[:, [where[c] for c in numbers]] if numbers else table.numeric[:, :0]
    numeric = NumericFit.fit(x, labeled, numbers, standardize=True)
    vocabularies = tuple(
        Vocabulary.fit(
            c, table.text[c], labeled, settings or PreparationSettings(), declared=c in declared
        )
        for c in names
        if c in table.text
    )
    prepared = SideFeatures(numeric, vocabularies)
    features = prepared.apply(x, table.text)
    plain = not vocabularies and not numeric.indicators
    summary = summary_lines(
        [
            ColumnSummary(
                name=c,
                kind="categorical" if c in table.text else "numeric",
                held=table.held[c],
                declared=c in declared,
                distinct=len(table.text[c].values) if c in table.text else None,
                missing=table.text[c].missing()
                if c in table.text
                else int(np.isnan(x[:, numbers.index(c)]).sum()),
            )
            for c in names
        ]
    )
    return _Side(
        features=features,
        mean=numeric.mean if plain else None,
        scale=numeric.scale if plain else None,
        preparation=prepared.to_json(),
        summary=summary,
    )


def _say_what_was_read(
    path: Path, label_column: str, table: LabelTable, side: tuple[str, list[str]]
) -> None:
    """Party B's log at start-up: the classes and which is positive, the rows without a
    label, and the side columns as typed."""
    classes = ", ".join(f"{c!r} = {i}" for i, c in enumerate(table.classes))
    positive = table.positive_class
    log.info(
        "labels %s, column %r: classes %s%s; %s rows without a label (served, never trained "
        "or evaluated on)",
        path,
        label_column,
        classes,
        f" (positive class {positive!r}: score_1 and AUC)" if positive is not None else "",
        f"{table.unlabeled:,}",
    )
    headline, lines = side
    log.info("side features: %s", headline)
    for line in lines:
        log.info("  %s", line)


def _numeric_first(value: str) -> tuple[int, float, str]:
    """Sort class labels numerically when they are numbers ('2' < '10'), else as text."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)
