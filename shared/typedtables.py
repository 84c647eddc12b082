"""Id-keyed tables read in row batches, each column typed: numbers or text.

Real tables hold strings, booleans and empty cells beside numbers. ``read_typed_table`` reads
a CSV (plain or gzipped) or a Parquet file a batch of rows at a time and keeps each column in
a compact form, whatever the file's width or length:

* a **number** column as float32, ``NaN`` where the cell is empty (one (n, k) matrix for all
  of them, filled batch by batch: a Parquet table's is allocated once, from its row count);
* a **text** column dictionary-encoded: int32 codes into the distinct values in order of first
  appearance, ``-1`` where the cell is empty (a million rows of a column with a hundred
  thousand distinct ids is 4 MB of codes).

What a column holds is read from the file (Parquet's types; in a CSV, pandas' parse of every
batch, so that a column with one word in its last batch is text, as if read at once) unless
the caller says: ``as_text`` columns are read as text whatever they hold (integers declared
categorical: a CSV cell's own text, a Parquet number's shortest text, ``1`` for 1.0), and
``as_number`` columns must hold numbers (a word there is a :class:`TableError` naming the
column, the value and its row). Booleans are text (``True``/``False`` in Parquet, the cell's
text in a CSV). ``held`` says what the file held per column (``number``, ``text``, ``bool`` or
``empty``), so that a serving table whose column changed type can be told from one that did
not.

ids are read as strings, as ``shared.idtables`` reads them.
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pandas.api.types import is_bool_dtype, is_numeric_dtype

from shared.idtables import TableError, check_columns, check_ids, read_id_table

__all__ = ["BATCH_ROWS", "Held", "TextColumn", "TypedTable", "read_typed_table"]

BATCH_ROWS = 65_536  # rows a batch: memory holds one batch of the file's parse at a time

Held = Literal["number", "text", "bool", "empty"]


@dataclass(frozen=True)
class TextColumn:
    """codes: (n,) int32 index into ``values``, -1 for an empty cell; values: the column's
    distinct texts, in order of first appearance (this table's own; a run's vocabulary is
    fitted from them, ``shared.preparation``)."""

    codes: np.ndarray
    values: list[str]

    def missing(self) -> int:
        return int((self.codes < 0).sum())


@dataclass(frozen=True)
class TypedTable:
    """ids: n unique strings in file order; numeric: (n, len(numeric_names)) float32, NaN for
    empty cells; text: name -> TextColumn; held: name -> what the file held."""

    ids: list[str]
    numeric: np.ndarray
    numeric_names: list[str]
    text: dict[str, TextColumn]
    held: dict[str, Held]


def read_typed_table(
    path: Path,
    *,
    id_column: str,
    columns: Sequence[str] | None = None,
    as_text: Sequence[str] = (),
    as_number: Sequence[str] = (),
    batch_rows: int = BATCH_ROWS,
) -> TypedTable:
    """``columns`` of ``path`` (None: every column but the id) keyed by ``id_column``, typed
    as the module docstring says. A name missing from the header is a TableError before any
    row is read; so is a column in both ``as_text`` and ``as_number``."""
    path = Path(path)
    both = sorted(set(as_text) & set(as_number))
    if both:
        raise TableError(f"columns {both} cannot be read both as text and as numbers")
    name = path.name.lower()
    if name.endswith(".npz"):
        return _from_npz(path, id_column, columns, set(as_text))
    wanted = {id_column: "id column"} | dict.fromkeys(columns or (), "column")
    header = check_columns(path, wanted)
    assert header is not None
    names = list(columns) if columns is not None else [c for c in header if c != id_column]
    try:
        if name.endswith(".parquet"):
            return _ParquetRead(path, id_column, names, set(as_text), set(as_number)).read(
                batch_rows
            )
        if name.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")):
            return _CsvRead(path, id_column, names, set(as_text), set(as_number)).read(batch_rows)
    except (TableError, MemoryError):
        raise
    except Exception as exc:  # pandas and pyarrow raise many types for unreadable files
        raise TableError(f"cannot read {path}: {exc}") from None
    raise TableError(f"unsupported table format {path.suffix!r}: use CSV, Parquet or npz")


# ---------------------------------------------------------------------------------------------
# Building columns batch by batch
# ---------------------------------------------------------------------------------------------


class _TextBuilder:
    """Dictionary-encodes a column one batch at a time: the codes of every batch index one
    list of distinct values, in order of first appearance."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.parts: list[np.ndarray] = []

    def add(self, values: Any) -> None:
        """``values``: a batch of the column (a pandas Series or array; NaN/None = empty)."""
        codes, uniques = pd.factorize(values, use_na_sentinel=True)
        remap = np.fromiter(
            (self.index.setdefault(_text(u), len(self.index)) for u in uniques),
            dtype=np.int32,
            count=len(uniques),
        )
        codes = np.asarray(codes)
        out = np.full(len(codes), -1, dtype=np.int32)
        seen = codes >= 0
        out[seen] = remap[codes[seen]]
        self.parts.append(out)

    def build(self) -> TextColumn:
        codes = np.concatenate(self.parts) if self.parts else np.zeros(0, np.int32)
        return TextColumn(codes=codes, values=list(self.index))


def _text(value: object) -> str:
    """A cell as text: integral floats without their '.0' (a Parquet integer column with an
    empty cell reads as floats), everything else as ``str`` gives it."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _numbers(values: Any, column: str, ids: Sequence[str]) -> np.ndarray:
    """A batch of a column that must hold numbers, as float32 (NaN for empty cells); a word
    is a TableError naming the column, the word and its row."""
    series = pd.Series(values)
    if is_bool_dtype(series.dtype):
        return series.to_numpy(dtype=np.float32)
    parsed = pd.to_numeric(series, errors="coerce")
    bad = parsed.isna().to_numpy() & series.notna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise TableError(
            f"column {column!r} must hold numbers, but row {ids[row]!r} holds "
            f"{series.iloc[row]!r}: fix the value, leave the cell empty (a missing value), or "
            "read the column as categorical"
        )
    out: np.ndarray = parsed.to_numpy(dtype=np.float32, na_value=np.nan)
    return out


def _held_number(column: np.ndarray) -> Held:
    return "empty" if len(column) == 0 or bool(np.isnan(column).all()) else "number"


# ---------------------------------------------------------------------------------------------
# CSV: pandas' parser, a batch of rows at a time
# ---------------------------------------------------------------------------------------------


class _CsvRead:
    """One pass over the file with pandas' own typing of every batch; then, only when some
    column held text in a batch but not as text throughout (booleans, or a word after numbers),
    a second pass that reads just those columns as the cells' own text."""

    def __init__(
        self, path: Path, id_column: str, names: list[str], as_text: set[str], as_number: set[str]
    ) -> None:
        self.path, self.id_column, self.names = path, id_column, names
        self.as_text, self.as_number = as_text, as_number
        self.sep = "\t" if ".tsv" in path.name.lower() else ","

    @contextmanager
    def _batches(self, usecols: list[str], text: set[str], batch_rows: int) -> Iterator[Any]:
        """The file's batches (closed however the reading ends)."""
        dtype = dict.fromkeys(text, str) | {self.id_column: str}
        with pd.read_csv(
            self.path,
            sep=self.sep,
            usecols=usecols,
            dtype=dtype,
            keep_default_na=True,
            chunksize=batch_rows,
        ) as reader:
            yield reader

    def _add(
        self,
        column: str,
        values: Any,
        batch_ids: list[str],
        texts: dict[str, "_TextBuilder"],
        numbers: dict[str, list[np.ndarray]],
        held: dict[str, Held],
    ) -> None:
        """One batch of one column, as pandas parsed it."""
        if column in texts:
            texts[column].add(values)
        elif column in self.as_number:
            numbers[column].append(_numbers(values, column, batch_ids))
        elif held.get(column) in ("text", "bool"):
            return  # read again once the pass is over, as the cells' text
        elif is_bool_dtype(values.dtype) or not is_numeric_dtype(values.dtype):
            held[column] = "bool" if is_bool_dtype(values.dtype) else "text"
            numbers[column] = []
        else:
            numbers[column].append(values.to_numpy(dtype=np.float32, na_value=np.nan))

    def read(self, batch_rows: int) -> TypedTable:
        ids: list[str] = []
        numbers: dict[str, list[np.ndarray]] = {c: [] for c in self.names}
        texts = {c: _TextBuilder() for c in self.names if c in self.as_text}
        held: dict[str, Held] = dict.fromkeys(texts, "text")
        with self._batches([self.id_column, *self.names], set(texts), batch_rows) as batches:
            for batch in batches:
                batch_ids = batch[self.id_column].astype(str).tolist()
                for column in self.names:
                    self._add(column, batch[column], batch_ids, texts, numbers, held)
                ids.extend(batch_ids)
        check_ids(ids, self.path)
        again = [c for c in self.names if c not in texts and held.get(c) in ("text", "bool")]
        if again:
            redone = {c: _TextBuilder() for c in again}
            with self._batches(again, set(again), batch_rows) as batches:
                for batch in batches:
                    for column in again:
                        redone[column].add(batch[column])
            texts |= redone
        numeric_names = [c for c in self.names if c not in texts]
        matrix = np.empty((len(ids), len(numeric_names)), dtype=np.float32)
        for j, column in enumerate(numeric_names):
            parts = numbers.pop(column)  # freed column by column
            matrix[:, j] = np.concatenate(parts) if parts else np.zeros(0, np.float32)
            held[column] = _held_number(matrix[:, j])
        return TypedTable(
            ids=ids,
            numeric=matrix,
            numeric_names=numeric_names,
            text={c: texts[c].build() for c in self.names if c in texts},
            held={c: held[c] for c in self.names},
        )


# ---------------------------------------------------------------------------------------------
# Parquet: typed by its schema, read a batch of rows at a time
# ---------------------------------------------------------------------------------------------


class _ParquetRead:
    def __init__(
        self, path: Path, id_column: str, names: list[str], as_text: set[str], as_number: set[str]
    ) -> None:
        import pyarrow.parquet as pq

        # no pre-buffering: it holds a row group's every column chunk at once (measured on
        # the 1,000,000 x 100 benchmark table: pyarrow's pool peaked at 1 GB with it, 0.3
        # GB without, and reading was faster)
        self.file = pq.ParquetFile(path, pre_buffer=False)
        self.path, self.id_column, self.names = path, id_column, names
        schema = self.file.schema_arrow
        self.held: dict[str, Held] = {c: _parquet_held(c, schema.field(c).type) for c in names}
        self.text = [
            c
            for c in names
            if c in as_text or (c not in as_number and self.held[c] in ("text", "bool"))
        ]
        self.as_number = as_number

    def read(self, batch_rows: int) -> TypedTable:
        import pyarrow as pa

        n = self.file.metadata.num_rows
        numeric_names = [c for c in self.names if c not in self.text]
        where = {c: j for j, c in enumerate(numeric_names)}
        matrix = np.empty((n, len(numeric_names)), dtype=np.float32)  # once: the row count
        texts = {c: _TextBuilder() for c in self.text}
        ids: list[str] = []
        batches = self.file.iter_batches(
            batch_size=batch_rows, columns=[self.id_column, *self.names]
        )
        for batch in batches:
            start, rows = len(ids), batch.num_rows
            batch_ids = batch.column(self.id_column).to_pandas().astype(str).tolist()
            for column in self.names:
                values = batch.column(column)
                if column in texts:
                    texts[column].add(values.to_pandas())
                elif column in self.as_number and self.held[column] in ("text", "bool"):
                    matrix[start : start + rows, where[column]] = _numbers(
                        values.to_pandas(), column, batch_ids
                    )
                else:  # numbers: nulls become NaN
                    matrix[start : start + rows, where[column]] = values.to_numpy(
                        zero_copy_only=False
                    )
            ids.extend(batch_ids)
            del batch
            # pyarrow's allocator keeps what a batch freed; given back, memory holds about one
            # batch of the file instead of several row groups (benchmarks/tables/big.py)
            pa.default_memory_pool().release_unused()
        del batches  # and the reader's read-ahead
        pa.default_memory_pool().release_unused()
        check_ids(ids, self.path)
        held = dict(self.held)
        for column in numeric_names:
            held[column] = _held_number(matrix[:, where[column]])
        return TypedTable(
            ids=ids,
            numeric=matrix,
            numeric_names=numeric_names,
            text={c: texts[c].build() for c in self.text},
            held=held,
        )


def _parquet_held(column: str, kind: Any) -> Held:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if pa.types.is_null(kind):
        return "empty"
    raise TableError(
        f"column {column!r} has Parquet type {kind}, which a feature cannot be: leave it out "
        "([data] drop) or convert it to numbers or text"
    )


# ---------------------------------------------------------------------------------------------
# npz: arrays as stored (numbers; string arrays are text)
# ---------------------------------------------------------------------------------------------


def _from_npz(
    path: Path, id_column: str, columns: Sequence[str] | None, as_text: set[str]
) -> TypedTable:
    table = read_id_table(path, id_column=id_column)
    names = list(columns) if columns is not None else list(table.columns)
    absent = [c for c in names if c not in table.columns]
    if absent:
        raise TableError(f"{path} has no column {absent[0]!r}; have {sorted(table.columns)}")
    text_names = [c for c in names if c in as_text or table.columns[c].dtype.kind in "USOb"]
    numeric_names = [c for c in names if c not in text_names]
    matrix = np.empty((len(table.ids), len(numeric_names)), dtype=np.float32)
    for j, column in enumerate(numeric_names):
        matrix[:, j] = table.columns[column]
    texts = {}
    for column in text_names:
        builder = _TextBuilder()
        builder.add(table.columns[column])
        texts[column] = builder.build()
    held: dict[str, Held] = dict.fromkeys(text_names, "text")
    held |= {c: _held_number(matrix[:, j]) for j, c in enumerate(numeric_names)}
    return TypedTable(table.ids, matrix, numeric_names, texts, {c: held[c] for c in names})
