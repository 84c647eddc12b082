"""Reading the id-keyed tables each party holds (CSV, gzipped CSV, Parquet, or .npz).

Both parties key their rows by a sample-id column; ids are always read as strings so that
``00123`` on one side and ``123`` on the other are *not* silently equal.
"""

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "IdTable",
    "TableError",
    "check_columns",
    "check_ids",
    "read_id_table",
    "table_columns",
]


class TableError(ValueError):
    """A table that cannot be used as given (missing file or column, bad values...)."""


@dataclass(frozen=True)
class IdTable:
    """Rows keyed by sample id.

    ids:     n unique strings, in file order
    columns: name -> (n,) array, for every non-id column that was read
    """

    ids: list[str]
    columns: dict[str, np.ndarray]

    def matrix(self, names: list[str]) -> np.ndarray:
        """The named columns as a float32 (n, len(names)) matrix; refuses non-finite values."""
        if not names:
            return np.zeros((len(self.ids), 0), dtype=np.float32)
        try:
            out = np.stack([self.columns[n].astype(np.float32) for n in names], axis=1)
        except KeyError as exc:
            raise TableError(f"no column {exc.args[0]!r}; have {sorted(self.columns)}") from None
        except ValueError as exc:
            raise TableError(f"feature columns must be numeric: {exc}") from None
        finite: list[bool] = np.isfinite(out).all(axis=0).astype(bool).tolist()
        if not all(finite):
            names_bad = [n for n, ok in zip(names, finite, strict=True) if not ok]
            raise TableError(f"columns with missing or infinite values: {names_bad}")
        return out


def table_columns(path: Path) -> list[str] | None:
    """The column names of a CSV or Parquet table, from its header alone (no row is read);
    None for an .npz (its arrays are read lazily anyway)."""
    path = Path(path)
    if not path.is_file():
        raise TableError(f"no such file: {path}")
    name = path.name.lower()
    try:
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            return [str(c) for c in pq.read_schema(path).names]
        if name.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")):
            sep = "\t" if ".tsv" in name else ","
            return [str(c) for c in pd.read_csv(path, sep=sep, nrows=0).columns]
    except Exception as exc:  # pandas and pyarrow raise many types for unreadable files
        raise TableError(f"cannot read {path}: {exc}") from None
    if name.endswith(".npz"):
        return None
    raise TableError(f"unsupported table format {path.suffix!r}: use CSV, Parquet or npz")


def check_columns(path: Path, required: dict[str, str]) -> list[str] | None:
    """TableError naming every missing column (``required``: column -> what it is for, e.g.
    ``{"id": "id column"}``) with the columns the header has and the closest name, before
    any row is read. Returns the header (None for an .npz, which is not checked here)."""
    header = table_columns(path)
    if header is None:
        return None
    missing = [(column, what) for column, what in required.items() if column not in header]
    if missing:
        parts = []
        for column, what in missing:
            close = [h for h in header if h.lower() == column.lower()]
            close = close or difflib.get_close_matches(column, header, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            parts.append(f"no {what} {column!r}{hint}")
        shown = ", ".join(header[:20]) + (
            f", ... ({len(header)} in all)" if len(header) > 20 else ""
        )
        raise TableError(f"{path}: {'; '.join(parts)}; its columns: {shown}")
    return header


def read_id_table(path: Path, *, id_column: str, columns: Sequence[str] | None = None) -> IdTable:
    """Load ``path`` (.csv, .csv.gz, .parquet or .npz) keyed by ``id_column``; with
    ``columns``, only those (and the id), after checking the header has them.

    An .npz must hold an ``ids`` array (or one named ``id_column``) and 1-D or 2-D arrays with
    one row per id; a 2-D array ``x`` of shape (n, k) becomes columns ``x0 .. x{k-1}`` (pixels
    of flattened images, for instance).
    """
    path = Path(path)
    if not path.is_file():
        raise TableError(f"no such file: {path}")
    name = path.name.lower()
    if name.endswith(".npz"):
        return _read_npz(path, id_column)
    wanted = {id_column: "id column"} | dict.fromkeys(columns or (), "column")
    check_columns(path, wanted)  # a wrong name is told before the rows are read
    usecols = list(wanted) if columns is not None else None
    try:
        if name.endswith(".parquet"):
            frame = pd.read_parquet(path, columns=usecols)
        elif name.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")):
            sep = "\t" if ".tsv" in name else ","
            frame = pd.read_csv(
                path, sep=sep, dtype={id_column: str}, keep_default_na=True, usecols=usecols
            )
        else:
            raise TableError(f"unsupported table format {path.suffix!r}: use CSV, Parquet or npz")
    except TableError:
        raise
    except Exception as exc:  # pandas raises many types for unreadable files
        raise TableError(f"cannot read {path}: {exc}") from None
    if id_column not in frame.columns:
        raise TableError(f"{path} has no id column {id_column!r}; columns: {list(frame.columns)}")
    ids = frame[id_column].astype(str).tolist()
    check_ids(ids, path)
    columns_read = {str(c): frame[c].to_numpy() for c in frame.columns if c != id_column}
    return IdTable(ids=ids, columns=columns_read)


def _read_npz(path: Path, id_column: str) -> IdTable:
    # WARNING: never allow_pickle=True here: an .npz from elsewhere could run code.
    with np.load(path, allow_pickle=False) as data:
        key = id_column if id_column in data.files else "ids"
        if key not in data.files:
            raise TableError(f"{path} has no {id_column!r} or 'ids' array; has {data.files}")
        ids = [str(i) for i in data[key].tolist()]
        columns: dict[str, np.ndarray] = {}
        for name in data.files:
            if name == key:
                continue
            array = data[name]
            if array.shape[:1] != (len(ids),):
                raise TableError(
                    f"{path}: array {name!r} has {array.shape[0]} rows for {len(ids)} ids"
                )
            if array.ndim == 1:
                columns[name] = array
            else:
                flat = array.reshape(len(ids), -1)
                columns.update({f"{name}{j}": flat[:, j] for j in range(flat.shape[1])})
    check_ids(ids, path)
    return IdTable(ids=ids, columns=columns)


def check_ids(ids: list[str], path: Path) -> None:
    """TableError for a table without rows, with a duplicate id or an empty one."""
    if not ids:
        raise TableError(f"{path} has no rows")
    if len(set(ids)) != len(ids):
        raise TableError(f"{path} has duplicate ids")
    if any(i == "" or i == "nan" for i in ids):
        raise TableError(f"{path} has empty ids")
