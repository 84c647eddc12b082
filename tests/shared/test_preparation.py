"""The preparation of a table's columns, fitted on training rows (shared.preparation).

* numbers without empty cells get the very bits of the z-score releases before categories
  computed (the demo's numbers, every stored run's resume);
* an empty cell gets the median of the training rows and an indicator column; held-out rows
  take no part in any statistic;
* a vocabulary keeps the frequent values of the training rows, most frequent first, capped;
  rare ones, and values never seen, share the other bucket; empty cells the missing bucket;
  without such a bucket they are code 0, a zero one-hot row.
"""

import numpy as np
import pytest

from shared.idtables import TableError
from shared.preparation import NumericFit, PreparationSettings, Vocabulary, one_hot
from shared.typedtables import TextColumn


def _old_zscore(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """What FeatureTransform.fit and apply computed before categories (verbatim)."""
    fitted = x[rows].astype(np.float32)
    std = fitted.std(axis=0)
    mean = np.asarray(fitted.mean(axis=0).tolist(), dtype=np.float32)
    scale = np.asarray(np.where(std > 0, std, np.float32(1.0)).tolist(), dtype=np.float32)
    return ((x.astype(np.float32) - mean) / scale).astype(np.float32)


@pytest.mark.parametrize("k", [1, 2, 16, 17, 20, 33])
def test_numbers_without_empty_cells_get_the_bits_of_the_z_score_before(k: int) -> None:
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((3000, k)) * rng.uniform(1, 1e4, k) + 7).astype(np.float32)
    x[:, 0] = 5.0  # a constant column: only centred
    rows = rng.permutation(3000)[:2400]  # a split's order, not sorted
    names = [f"c{j}" for j in range(k)]

    fit = NumericFit.fit(x, rows, names, standardize=True)
    out = np.empty((3000, fit.width), np.float32)
    assert fit.apply_into(x, out) == {}

    assert fit.indicators == []
    np.testing.assert_array_equal(out, _old_zscore(x, rows))


def test_empty_cells_get_the_training_median_and_an_indicator() -> None:
    x = np.array(
        [[1.0, 10.0], [np.nan, 20.0], [3.0, 30.0], [100.0, np.nan], [np.nan, 50.0]], np.float32
    )
    train = np.array([0, 1, 2])  # rows 3 and 4 are held out: 100 and row 4's cell take no part

    fit = NumericFit.fit(x, train, ["a", "b"], standardize=False)
    out = np.empty((5, fit.width), np.float32)
    filled = fit.apply_into(x, out)

    assert fit.fill == [2.0, 20.0]  # medians of the training rows' cells
    assert fit.indicators == ["a"]  # b had no empty cell among the training rows
    assert filled == {"a": 2, "b": 1}
    np.testing.assert_array_equal(out[:, 0], [1, 2, 3, 100, 2])
    np.testing.assert_array_equal(out[:, 1], [10, 20, 30, 20, 50])  # filled, no indicator
    np.testing.assert_array_equal(out[:, 2], [0, 1, 0, 0, 1])


def test_a_column_without_any_value_among_the_training_rows_is_zero() -> None:
    x = np.array([[np.nan], [np.nan], [4.0]], np.float32)
    fit = NumericFit.fit(x, np.array([0, 1]), ["a"], standardize=True)
    out = np.empty((3, fit.width), np.float32)
    fit.apply_into(x, out)
    assert fit.fill == [0.0] and fit.indicators == ["a"]
    np.testing.assert_array_equal(out, [[0, 1], [0, 1], [4, 0]])


def test_infinite_values_are_refused_naming_the_column() -> None:
    x = np.array([[1.0, np.inf], [2.0, 3.0]], np.float32)
    with pytest.raises(TableError, match=r"infinite values: \['b'\].*leave the cells empty"):
        NumericFit.fit(x, np.array([0, 1]), ["a", "b"], standardize=True)


def test_a_run_stored_before_filling_refuses_empty_cells_naming_the_column() -> None:
    old = NumericFit.from_json({"columns": ["a", "b"], "mean": None, "scale": None})
    x = np.array([[1.0, np.nan]], np.float32)
    with pytest.raises(TableError, match=r"missing values: \['b'\]"):
        old.apply_into(x, np.empty((1, 2), np.float32))


def _column(values: list[str | None]) -> TextColumn:
    distinct = list(dict.fromkeys(v for v in values if v is not None))
    codes = [distinct.index(v) if v is not None else -1 for v in values]
    return TextColumn(np.array(codes, np.int32), distinct)


def test_a_vocabulary_keeps_frequent_values_pools_rare_ones_and_buckets_empty_cells() -> None:
    train = ["b"] * 3 + ["a"] * 3 + ["c"] * 5 + ["rare"] + [None]
    column = _column(train)
    settings = PreparationSettings(max_categories=10, min_frequency=2)

    vocabulary = Vocabulary.fit("k", column, np.arange(len(train)), settings)

    assert vocabulary.values == ["c", "a", "b"]  # most frequent first, ties as text
    assert vocabulary.other and vocabulary.missing and vocabulary.size == 5
    serving = _column(["a", "never seen", None, "rare", "c"])
    codes, outside, empty = vocabulary.encode(serving)
    assert codes.tolist() == [2, 4, 5, 4, 1]  # a; other; missing; other; c
    assert (outside, empty) == (2, 1)


def test_the_cap_keeps_the_most_frequent_and_held_out_rows_count_for_nothing() -> None:
    values = ["x"] * 4 + ["y"] * 3 + ["z"] * 2 + ["w"] * 9
    vocabulary = Vocabulary.fit(
        "k",
        _column(values),
        np.arange(9),  # the w rows are held out
        PreparationSettings(max_categories=2, min_frequency=1),
    )
    assert vocabulary.values == ["x", "y"] and vocabulary.other and not vocabulary.missing


def test_without_an_other_or_missing_bucket_a_value_is_code_zero_a_zero_row() -> None:
    vocabulary = Vocabulary.fit(
        "k", _column(["a", "b", "a", "b"]), np.arange(4), PreparationSettings(min_frequency=1)
    )
    codes, outside, empty = vocabulary.encode(_column(["b", "new", None]))
    assert codes.tolist() == [2, 0, 0] and (outside, empty) == (1, 1)
    np.testing.assert_array_equal(one_hot(codes, vocabulary.size), [[0, 1], [0, 0], [0, 0]])


def test_preparations_round_trip_through_json_exactly() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 3)).astype(np.float32)
    x[3, 1] = np.nan
    fit = NumericFit.fit(x, np.arange(40), ["a", "b", "c"], standardize=True)
    assert NumericFit.from_json(fit.to_json()) == fit
    vocabulary = Vocabulary("k", ["p", "q"], other=True, missing=False, declared=True)
    assert Vocabulary.from_json(vocabulary.to_json()) == vocabulary
