"""Party B's table as it comes (party_b.labels): string labels, empty labels, and side columns
prepared as party A's are, typed as the operator declares.

* labels are text: "good"/"bad" become classes in a stated order, the positive class (score_1,
  what AUC ranks) is logged at load with the rows that have no label (served, never trained);
* side columns of numbers without empty cells get the very bits they always had;
* an empty side cell gets the labeled rows' median and an indicator column, a text column a
  one-hot of its vocabulary; rows without a label take no part in any statistic;
* the operator types columns as party A's config does (``--categorical``, ``--numeric``,
  ``--max-categories``, ``--min-frequency``; FEDLITE_B_*): integer codes become categories, a
  word in a numeric column is an error naming its row.
"""

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from party_a.cli.scores import columns_line
from party_b.api.main import load_labels
from party_b.labels import load_label_table
from party_b.ops.cli import build_parser
from party_b.service import Caller, Service
from party_b.settings import settings_from_flags
from shared.idtables import TableError
from shared.preparation import PreparationSettings
from tests.utils.small_runs import aligned_in_process, small_party_b


def _write(tmp_path: Path, frame: pd.DataFrame, name: str = "labels.csv") -> Path:
    path = tmp_path / name
    frame.to_csv(path, index=False) if name.endswith(".csv") else frame.to_parquet(path)
    return path


@pytest.mark.parametrize("name", ["labels.csv", "labels.parquet"])
def test_string_labels_are_classes_with_the_positive_class_stated(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    frame = pd.DataFrame(
        {"id": ["a", "b", "c", "d", "e"], "Status": ["good", "bad", None, "good", "bad"]}
    )
    with caplog.at_level(logging.INFO, logger="fedlite.party_b"):
        table = load_label_table(
            _write(tmp_path, frame, name), id_column="id", label_column="Status",
            feature_columns=None,
        )  # fmt: skip

    assert table.classes == ["bad", "good"] and table.positive_class == "good"
    assert table.labels.tolist() == [1, 0, -1, 1, 0]
    assert table.unlabeled == 1 and table.labeled is not None and not table.labeled[2]
    said = caplog.text
    assert "classes 'bad' = 0, 'good' = 1 (positive class 'good': score_1 and AUC)" in said
    assert "1 rows without a label (served, never trained or evaluated on)" in said


def test_several_classes_have_no_positive_class_and_numbers_sort_as_numbers(
    tmp_path: Path,
) -> None:
    frame = pd.DataFrame({"id": list("abcd"), "y": [10, 2, 2, 1]})
    table = load_label_table(
        _write(tmp_path, frame), id_column="id", label_column="y", feature_columns=None
    )
    assert table.classes == ["1", "2", "10"] and table.positive_class is None


def test_one_class_only_is_refused(tmp_path: Path) -> None:
    frame = pd.DataFrame({"id": list("abc"), "y": ["good", "good", None]})
    with pytest.raises(TableError, match="fewer than 2 classes"):
        load_label_table(
            _write(tmp_path, frame), id_column="id", label_column="y", feature_columns=None
        )


def test_numeric_side_columns_get_the_bits_they_always_had(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 300
    frame = pd.DataFrame({"id": [f"r{i}" for i in range(n)], "y": rng.integers(0, 2, n)})
    for j in range(11):
        frame[f"b{j}"] = rng.standard_normal(n) * (j + 1) * 100
    frame.loc[::7, "y"] = None  # rows to serve only: not in the statistics
    table = load_label_table(
        _write(tmp_path, frame), id_column="id", label_column="y", feature_columns=None
    )

    raw = frame[[f"b{j}" for j in range(11)]].to_numpy(np.float32)
    labeled = frame["y"].notna().to_numpy()
    fitted = raw[labeled]  # the arithmetic of releases that read numbers only, verbatim
    mean, std = fitted.mean(axis=0), fitted.std(axis=0)
    scale = np.where(std > 0, std, np.float32(1.0))
    np.testing.assert_array_equal(table.features, ((raw - mean) / scale).astype(np.float32))
    assert table.feature_mean == mean.tolist() and table.feature_scale == scale.tolist()


def test_side_columns_with_categories_and_empty_cells_are_prepared(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {
            "id": [f"r{i}" for i in range(8)],
            "y": [0, 1, 0, 1, 0, 1, None, None],
            "amount": [1.0, None, 3.0, 5.0, 7.0, 9.0, 1000.0, None],
            "records": ["no", "yes", "no", "no", "yes", "no", "maybe", None],
        }
    )
    table = load_label_table(
        _write(tmp_path, frame), id_column="id", label_column="y", feature_columns=None,
        settings=PreparationSettings(min_frequency=1),
    )  # fmt: skip

    # [amount z-scored | amount missing | records: no, yes] ("maybe" is unseen: zeros)
    assert table.side_width == 4
    assert table.feature_mean is None  # not a table of numbers alone: no plain z-score
    preparation = table.side_preparation
    assert preparation is not None and preparation["fill"] == [5.0]  # labeled rows' median
    assert preparation["categorical"][0]["values"] == ["no", "yes"]
    np.testing.assert_array_equal(table.features[:, 1], [0, 1, 0, 0, 0, 0, 0, 1])
    records = [[1, 0], [0, 1], [1, 0], [1, 0], [0, 1], [1, 0], [0, 0], [0, 0]]
    np.testing.assert_array_equal(table.features[:, 2:], records)
    filled = np.array([1, 5, 3, 5, 7, 9], np.float32)  # the labeled rows after filling
    z = (np.float32(1000.0) - filled.mean()) / filled.std()
    assert table.features[6, 0] == pytest.approx(z)


# ------------------------------------------------------------------ the operator's typing


def _branches(tmp_path: Path) -> Path:
    """A table whose "branch" holds integer codes (categories a bank numbers) and whose
    "income" holds numbers."""
    frame = pd.DataFrame(
        {
            "id": [f"u{i}" for i in range(12)],
            "y": [0, 1] * 6,
            "branch": [101, 102, 103, 101, 102, 103, 101, 102, 103, 101, 102, 104],
            "income": np.linspace(10.0, 40.0, 12),
        }
    )
    return _write(tmp_path, frame)


def test_integer_codes_declared_categorical_are_one_hot_buckets(tmp_path: Path) -> None:
    path = _branches(tmp_path)
    inferred = load_label_table(path, id_column="id", label_column="y", feature_columns=None)
    declared = load_label_table(
        path, id_column="id", label_column="y", feature_columns=None, categorical=["branch"],
        settings=PreparationSettings(min_frequency=2),
    )  # fmt: skip

    assert inferred.side_width == 2  # branch as a number, z-scored like income
    # 101, 102, 103 seen at least twice each; 104 once: the "other" bucket
    preparation = declared.side_preparation
    assert preparation is not None
    (branch,) = preparation["categorical"]
    assert branch == {
        "name": "branch", "values": ["101", "102", "103"], "other": True, "missing": False,
        "declared": True,
    }  # fmt: skip
    assert declared.side_width == 1 + 4  # income, then branch one-hot over 4 buckets
    assert declared.features[:, 1:].sum(axis=1).tolist() == [1.0] * 12
    assert declared.features[11, 1:].tolist() == [0.0, 0.0, 0.0, 1.0]  # 104: "other"
    np.testing.assert_array_equal(declared.features[:, 0], inferred.features[:, 1])


def test_a_word_in_a_column_declared_numeric_is_an_error_naming_its_row(tmp_path: Path) -> None:
    frame = pd.DataFrame({"id": ["a", "b", "c"], "y": [0, 1, 0], "income": ["1.5", "unknown", "3"]})
    path = _write(tmp_path, frame)
    typed = load_label_table(path, id_column="id", label_column="y", feature_columns=None)
    assert typed.side_preparation is not None and typed.side_preparation["categorical"]

    with pytest.raises(TableError, match="income") as refused:
        load_label_table(
            path, id_column="id", label_column="y", feature_columns=None, numeric=["income"]
        )
    assert "unknown" in str(refused.value)


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (
            {"categorical": ["branchh"]},
            "--categorical (FEDLITE_B_CATEGORICAL) names ['branchh'], which are not",
        ),
        ({"numeric": ["y"]}, "(FEDLITE_B_NUMERIC) names ['y'], which are not party B's feature"),
        (
            {"categorical": ["branch"], "numeric": ["branch"]},
            "columns ['branch'] are declared both categorical and numeric",
        ),
    ],
)
def test_a_declaration_of_no_feature_column_or_of_both_types_is_refused(
    tmp_path: Path, declared: dict[str, list[str]], message: str
) -> None:
    with pytest.raises(TableError, match=re.escape(message)):
        load_label_table(
            _branches(tmp_path), id_column="id", label_column="y", feature_columns=None,
            **declared,
        )  # fmt: skip


def test_serve_flags_and_variables_type_the_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fedlite-b serve --categorical branch`` (or FEDLITE_B_CATEGORICAL) reaches the table
    party B loads, and so does ``fedlite-b export``'s (which must prepare it the same way)."""
    path = _branches(tmp_path)
    for command in ("serve", "export"):
        words = [command, "--labels", str(path), "--categorical", "branch", "--min-frequency", "2"]
        words += ["--run", "r", "--out", str(tmp_path / "x")] if command == "export" else []
        settings = settings_from_flags(build_parser().parse_args(words))
        table = load_labels(settings)
        assert table.side_width == 5, command  # type: ignore[attr-defined]
    monkeypatch.setenv("FEDLITE_B_CATEGORICAL", '["branch"]')
    monkeypatch.setenv("FEDLITE_B_MIN_FREQUENCY", "2")
    settings = settings_from_flags(build_parser().parse_args(["serve", "--labels", str(path)]))
    assert settings.categorical == ["branch"]
    assert load_labels(settings).side_width == 5  # type: ignore[attr-defined]


def test_runs_show_the_tables_classes_in_score_order(tmp_path: Path) -> None:
    """RunOut.classes: score_i of a prediction is the probability of classes[i]; party A's
    ``predict`` says so before it scores (``party_a.cli.scores.columns_line``)."""
    frame = pd.DataFrame(
        {"id": [f"u{i:03d}" for i in range(64)], "Status": ["good", "bad", "good", "good"] * 16}
    )
    labels = load_label_table(
        _write(tmp_path, frame), id_column="id", label_column="Status", feature_columns=None
    )
    party_b = small_party_b(tmp_path / "b", labels)
    service, caller = party_b.service(), party_b.caller

    run = aligned_in_process(service, caller, use_side_features=False)

    assert run_classes(service, caller, run.id) == ["bad", "good"]
    assert columns_line(["bad", "good"]) == (
        "score_0 = 'bad', score_1 = 'good' (positive class: 'good')"
    )
    assert columns_line(["a", "b", "c"]) == "score_0 = 'a', score_1 = 'b', score_2 = 'c'"
    assert columns_line(None) is None


def run_classes(service: Service, caller: Caller, run_id: str) -> list[str] | None:
    """The classes GET /v1/runs/{id} shows, and the run list too."""
    shown = service.runs.get(caller, run_id).classes
    assert [r.classes for r in service.runs.list_runs(caller)] == [shown]
    return shown
