"""Tables read a batch of rows at a time, each column typed numbers or text.

* text, booleans and empty cells are read as a file holds them, batch size or not;
* a column with a word after a batch of numbers is text, as if read at once;
* a CSV and a Parquet file of the same table give the same columns;
* declared text reads numbers as text; declared numbers refuse a word, naming it and its row;
* a Parquet column of a type no feature can be is an error that says what to do.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shared.idtables import TableError
from shared.typedtables import read_typed_table


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [f"r{i}" for i in range(7)],
            "income": [1.5, None, 3.0, 4.0, None, 6.0, 7.0],
            "region": ["east", "west", None, "east", "north", "west", "east"],
            "active": [True, False, True, True, False, True, False],
            "branch": [3, 1, 2, 3, 3, 1, 2],
        }
    )


def _texts(table, name: str) -> list[str | None]:  # type: ignore[no-untyped-def]
    column = table.text[name]
    return [column.values[c] if c >= 0 else None for c in column.codes.tolist()]


@pytest.mark.parametrize("batch_rows", [2, 3, 65_536])
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_numbers_text_booleans_and_empty_cells_are_read_as_held(
    tmp_path: Path, suffix: str, batch_rows: int
) -> None:
    path = tmp_path / f"t{suffix}"
    frame = _frame()
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path, index=False)

    table = read_typed_table(path, id_column="id", batch_rows=batch_rows)

    assert table.ids == [f"r{i}" for i in range(7)]
    assert table.numeric_names == ["income", "branch"]
    assert table.numeric.dtype == np.float32
    np.testing.assert_array_equal(
        table.numeric[:, 0], np.array([1.5, np.nan, 3, 4, np.nan, 6, 7], np.float32)
    )
    assert _texts(table, "region") == ["east", "west", None, "east", "north", "west", "east"]
    assert _texts(table, "active") == ["True", "False", "True", "True", "False", "True", "False"]
    assert table.held == {
        "income": "number",
        "region": "text",
        "active": "bool",
        "branch": "number",
    }


def test_a_word_after_a_batch_of_numbers_makes_the_column_text(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("id,code\n" + "".join(f"r{i},{i}\n" for i in range(6)) + "r6,A7\n")

    table = read_typed_table(path, id_column="id", batch_rows=2)

    assert table.numeric_names == [] and table.held["code"] == "text"
    assert _texts(table, "code") == ["0", "1", "2", "3", "4", "5", "A7"]  # the cells' own text


def test_declared_text_reads_numbers_as_their_text(tmp_path: Path) -> None:
    frame = _frame()
    frame.loc[2, "branch"] = None  # Parquet: an int column with a null reads as floats
    csv, parquet = tmp_path / "t.csv", tmp_path / "t.parquet"
    cells = ["3", "1", "", "3", "3", "1", "2"]
    csv.write_text("id,branch\n" + "".join(f"r{i},{c}\n" for i, c in enumerate(cells)))
    frame.to_parquet(parquet, index=False)
    for path in (csv, parquet):
        table = read_typed_table(path, id_column="id", as_text=["branch"], batch_rows=3)
        texts = _texts(table, "branch")
        assert texts[2] is None
        assert [t for t in texts if t is not None] == ["3", "1", "3", "3", "1", "2"], path


def test_declared_numbers_refuse_a_word_naming_it_and_its_row(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("id,score\na,1\nb,2\nc,n.a.\n")
    with pytest.raises(
        TableError, match=r"column 'score' must hold numbers, but row 'c' holds 'n.a.'"
    ):
        read_typed_table(path, id_column="id", as_number=["score"], batch_rows=2)
    booleans = tmp_path / "b.parquet"
    pd.DataFrame({"id": ["a", "b"], "flag": [True, False]}).to_parquet(booleans)
    read = read_typed_table(booleans, id_column="id", as_number=["flag"])
    np.testing.assert_array_equal(read.numeric[:, 0], [1.0, 0.0])


def test_a_parquet_column_of_another_type_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a"], "when": pa.array([0], pa.timestamp("s"))}), path)
    with pytest.raises(TableError, match=r"'when' has Parquet type timestamp.*\[data\] drop"):
        read_typed_table(path, id_column="id")


def test_a_column_of_empty_cells_only_is_held_empty(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("id,blank,x\na,,1\nb,,2\n")
    table = read_typed_table(path, id_column="id")
    assert table.held == {"blank": "empty", "x": "number"}


def test_a_name_missing_from_the_header_is_told_before_any_row(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    _frame().to_csv(path, index=False)
    with pytest.raises(TableError, match=r"no column 'Region' \(did you mean 'region'\?\)"):
        read_typed_table(path, id_column="id", columns=["Region"])
