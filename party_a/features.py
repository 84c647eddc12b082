"""Party A's feature table, as read: numbers and categories, empty cells kept empty.

The table is read a batch of rows at a time (``shared.typedtables``: CSV, Parquet, or .npz)
and its columns typed: numbers, or categories (text, booleans, and any column the run config
declares categorical); ``[data] categorical``, ``numeric`` and ``drop`` override what the
file suggests. What the bottom model sees is the run's fitted preparation of this table
(``party_a.preparation.FeatureTransform``, fitted on the run's training rows only when the
run is aligned, and stored with it), so that evaluation, prediction and an export -- on a
serving table of new customers, without a single training row -- get the very numbers
training would have given the same rows.

A table read for a run that exists (``expect``: its stored preparation) must hold the run's
columns with the types they had: a column missing, a number column holding words, or --
when the run reads every column -- a column the run never saw, is a TableError naming it.
"""

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from party_a.preparation import FeatureTransform
from shared.idtables import TableError, table_columns
from shared.preparation import ColumnSummary, PreparationSettings, summary_lines
from shared.typedtables import Held, TextColumn, TypedTable, read_typed_table

__all__ = ["ColumnRules", "FeatureTable", "FeatureTransform", "load_features"]


@dataclass(frozen=True)
class FeatureTable:
    """ids: n unique strings; x: (n, k) number columns in ``columns`` order, as read (float32,
    NaN for an empty cell; integer token ids for token models); categorical: the
    categorical columns (name -> codes into the table's own distinct values), in table
    order; groups: the client of each row, for the 'clients' schedule.

    How the run fits its preparation on this table: ``standardize`` (z-score the number
    columns with the training rows' statistics), ``settings`` (how categories are pooled),
    ``declared`` (columns the config named categorical); ``held`` says what the file held in
    each column (for the summary and the type checks)."""

    ids: list[str]
    x: np.ndarray
    columns: list[str]
    groups: list[str] | None = None
    standardize: bool = False
    categorical: dict[str, TextColumn] = field(default_factory=dict)
    settings: PreparationSettings = field(default_factory=PreparationSettings)
    declared: frozenset[str] = frozenset()
    held: dict[str, Held] = field(default_factory=dict)

    def index(self) -> dict[str, int]:
        return {i: row for row, i in enumerate(self.ids)}

    def in_order(self, columns: list[str]) -> np.ndarray:
        """x with its columns in ``columns`` order (a run's order; the table's may differ)."""
        if columns == self.columns:
            return self.x
        where = {c: i for i, c in enumerate(self.columns)}
        missing = [c for c in columns if c not in where]
        if missing:
            raise TableError(f"the feature table lacks the run's number columns {missing[:5]}")
        return self.x[:, [where[c] for c in columns]]

    def summary(self) -> tuple[str, list[str]]:
        """What was read and inferred: a headline and a line per categorical column or column
        with missing values (types, distinct values, missing cells)."""
        columns = [
            ColumnSummary(
                name=c,
                kind="numeric",
                held=self.held.get(c, "number"),
                declared=False,
                distinct=None,
                missing=int(np.isnan(self.x[:, j]).sum()) if self.x.dtype.kind == "f" else 0,
            )
            for j, c in enumerate(self.columns)
        ]
        columns += [
            ColumnSummary(
                name=c,
                kind="categorical",
                held=self.held.get(c, "text"),
                declared=c in self.declared,
                distinct=len(column.values),
                missing=column.missing(),
            )
            for c, column in self.categorical.items()
        ]
        return summary_lines(columns)


@dataclass(frozen=True)
class ColumnRules:
    """The run config's say over the table's columns ([data]): which to read (none named:
    every column but the id, the client column and ``drop``), which are categorical or
    numeric whatever the file holds."""

    feature_columns: Sequence[str] = ()
    categorical: Sequence[str] = ()
    numeric: Sequence[str] = ()
    drop: Sequence[str] = ()


def load_features(
    path: Path,
    *,
    id_column: str,
    feature_columns: list[str] | None,
    standardize: bool,
    group_column: str | None = None,
    rules: ColumnRules | None = None,
    settings: PreparationSettings | None = None,
    expect: FeatureTransform | None = None,
) -> FeatureTable:
    """Read party A's table; ``feature_columns`` empty/None (and ``rules`` naming none) means
    every column but the id, the client column ``group_column`` (needed only by the 'clients'
    batch schedule) and ``rules.drop``.

    ``expect``: the stored preparation of the run this table is read for; its columns are
    read with the types they had (and ``rules`` only say which columns the run may ignore).
    ``standardize`` and ``settings`` are recorded, not applied: the run fits its preparation
    on its training rows (statistics of features only; party A never sees labels).
    """
    rules = replace(rules or ColumnRules(), feature_columns=tuple(feature_columns or ()))
    header = table_columns(path)
    if expect is not None:
        names, as_text, as_number = _expected(path, header, id_column, group_column, rules, expect)
    else:
        names = _chosen(path, header, id_column, group_column, rules)
        as_text, as_number = list(rules.categorical), list(rules.numeric)
    groups_text = [group_column] if group_column else []
    every = header is None and not names  # an .npz read whole: its arrays' columns
    typed = read_typed_table(
        path,
        id_column=id_column,
        columns=None if every else [*names, *groups_text],
        as_text=[*as_text, *groups_text],
        as_number=as_number,
    )
    if every:
        names = [c for c in typed.held if c != group_column]
    text = _text_columns(path, typed, expect)
    numbers = [c for c in names if c not in text]
    where = {c: j for j, c in enumerate(typed.numeric_names)}
    x = typed.numeric
    if [where[c] for c in numbers] != list(range(x.shape[1])):
        x = x[:, [where[c] for c in numbers]]
    return FeatureTable(
        ids=typed.ids,
        x=x,
        columns=numbers,
        groups=_groups(path, typed, group_column),
        standardize=standardize,
        categorical={c: text[c] for c in names if c in text},
        settings=settings or PreparationSettings(),
        declared=frozenset(rules.categorical) if expect is None else _declared(expect),
        held={c: typed.held[c] for c in names},
    )


def _groups(path: Path, typed: TypedTable, group_column: str | None) -> list[str] | None:
    """The client of every row, as text (None without a client column)."""
    if group_column is None:
        return None
    if group_column not in typed.text:
        raise TableError(f"{path} has no client column {group_column!r}")
    column = typed.text[group_column]
    return [column.values[c] if c >= 0 else "" for c in column.codes.tolist()]


def _text_columns(
    path: Path, typed: TypedTable, expect: FeatureTransform | None
) -> dict[str, TextColumn]:
    """The table's categorical columns; for a run that exists, checked against the types
    they had (a column of empty cells only is all missing, whatever the file's type)."""
    text = dict(typed.text)
    if expect is not None:
        _check_types(path, typed.held, text, expect)
        for vocabulary in expect.categorical:
            if vocabulary.name not in text:
                text[vocabulary.name] = TextColumn(np.full(len(typed.ids), -1, np.int32), [])
    return text


def _chosen(
    path: Path,
    header: list[str] | None,
    id_column: str,
    group_column: str | None,
    rules: ColumnRules,
) -> list[str]:
    """The columns a new run reads, after checking that every name the rules give is one of
    the header's."""
    both = sorted(set(rules.categorical) & set(rules.numeric))
    if both:
        raise TableError(f"[data] names {both} both categorical and numeric: choose one")
    dropped_but_named = sorted(set(rules.drop) & set(rules.feature_columns))
    if dropped_but_named:
        raise TableError(f"[data] drops {dropped_but_named} but also names them feature columns")
    if header is None:  # an .npz: its arrays' columns are known only once read
        return list(rules.feature_columns)
    named = {
        "feature_columns": rules.feature_columns,
        "categorical": rules.categorical,
        "numeric": rules.numeric,
        "drop": rules.drop,
    }
    for key, columns in named.items():
        for column in columns:
            if column not in header:
                raise TableError(f"[data] {key}: {_no_such_column(path, column, header)}")
    if rules.feature_columns:
        names = list(rules.feature_columns)
        stray = sorted((set(rules.categorical) | set(rules.numeric)) - set(names))
        if stray:
            raise TableError(
                f"[data] types columns {stray} that feature_columns leaves out: add them to "
                "feature_columns or remove them"
            )
        return names
    skip = {id_column, group_column, *rules.drop}
    return [c for c in header if c not in skip]


def _expected(
    path: Path,
    header: list[str] | None,
    id_column: str,
    group_column: str | None,
    rules: ColumnRules,
    expect: FeatureTransform,
) -> tuple[list[str], list[str], list[str]]:
    """(columns, read as text, read as numbers) of a table for a run that exists: the run's
    columns, each of which the table must hold; with a run that reads every column, any
    other column (but the id, the client column and those dropped) is an error too."""
    names = expect.source_columns
    if header is not None:
        absent = [c for c in names if c not in header]
        if absent:
            raise TableError(
                f"{path} lacks column {absent[0]!r}, which the run was trained on"
                + (f" (and {absent[1:5]})" if len(absent) > 1 else "")
                + f": the run reads {names}"
            )
        if not rules.feature_columns:
            known = {id_column, group_column, *names, *rules.drop}
            new = [c for c in header if c not in known]
            if new:
                raise TableError(
                    f"{path} has column {new[0]!r}, which the run was not trained on"
                    + (f" (and {new[1:5]})" if len(new) > 1 else "")
                    + ": a run reads the columns it was trained on; remove it from the table, "
                    "or train a new run that reads it"
                )
    as_text = [v.name for v in expect.categorical if v.declared]
    return names, as_text, list(expect.columns)


def _check_types(
    path: Path, held: dict[str, Held], text: dict[str, TextColumn], expect: FeatureTransform
) -> None:
    """A categorical column the run inferred from text must not hold numbers only now."""
    for vocabulary in expect.categorical:
        if vocabulary.declared or vocabulary.name in text:
            continue
        if held.get(vocabulary.name) == "empty":
            continue  # every cell empty: missing values of any type
        raise TableError(
            f"{path}: column {vocabulary.name!r} held text when the run was trained and holds "
            "numbers only here: its type changed (a categorical column of numbers is declared "
            "in [data] categorical when the run is trained)"
        )


def _declared(expect: FeatureTransform) -> frozenset[str]:
    return frozenset(v.name for v in expect.categorical if v.declared)


def _no_such_column(path: Path, column: str, header: list[str]) -> str:
    close = [h for h in header if h.lower() == column.lower()]
    close = close or difflib.get_close_matches(column, header, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    shown = ", ".join(header[:20]) + (f", ... ({len(header)} in all)" if len(header) > 20 else "")
    return f"{path} has no column {column!r}{hint}; its columns: {shown}"
