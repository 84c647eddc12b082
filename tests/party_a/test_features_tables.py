"""Party A's table as it comes: typed, overridden by the config, prepared for its bottom model.

* text and booleans are categories, numbers are numbers, unless ``[data]`` says otherwise;
  a name the config gives that the table lacks is told with the closest one;
* the typing is summarized (types, distinct values, missing cells) before anything is fitted;
* the preparation fitted on training rows round-trips through its JSON and gives the same
  matrix; a table read for a run that exists must have the run's columns and types;
* ``tabular_mlp`` one-hot encodes small vocabularies and embeds large ones, code 0 is the
  zero input, a numbers-only bottom is the one it always was, and the export program
  computes what the bottom model computes.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from party_a.config import load_config
from party_a.errors import ConfigError
from party_a.features import ColumnRules, FeatureTable, FeatureTransform, load_features
from party_a.preparation import bottom_kwargs
from shared.idtables import TableError
from shared.models import build_bottom, build_seeded
from shared.pq.frozen import save_program
from shared.preparation import PreparationSettings


def _table(tmp_path: Path, rows: int = 40) -> Path:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "id": [f"c{i:03d}" for i in range(rows)],
            "income": np.where(rng.random(rows) < 0.2, np.nan, rng.normal(50, 10, rows)),
            "region": rng.choice(["east", "west", "north"], rows),
            "branch": rng.integers(1, 4, rows),
            "member": rng.random(rows) < 0.5,
            "note": [f"free text {i}" for i in range(rows)],
        }
    )
    frame.loc[3, "region"] = None
    path = tmp_path / "customers.csv"
    frame.to_csv(path, index=False)
    return path


def _load(path: Path, **rules: list[str]) -> FeatureTable:
    return load_features(
        path,
        id_column="id",
        feature_columns=None,
        standardize=True,
        rules=ColumnRules(**rules),  # type: ignore[arg-type]
        settings=PreparationSettings(min_frequency=1),
    )


def test_text_and_booleans_are_categories_unless_the_config_says_otherwise(
    tmp_path: Path,
) -> None:
    path = _table(tmp_path)
    inferred = _load(path)
    assert inferred.columns == ["income", "branch"]
    assert list(inferred.categorical) == ["region", "member", "note"]

    declared = _load(path, categorical=["branch"], drop=["note"])
    assert declared.columns == ["income"]
    assert list(declared.categorical) == ["region", "branch", "member"]
    assert declared.declared == frozenset({"branch"})
    assert sorted(declared.categorical["branch"].values) == ["1", "2", "3"]

    headline, lines = declared.summary()
    assert headline == "1 numeric, 3 categorical, 2 with missing values"
    assert lines[0].startswith("income: numeric (numbers), 8 missing (filled with the training")
    assert "branch: categorical (declared categorical), 3 distinct values" in lines
    assert "member: categorical (bool values), 2 distinct values" in lines
    assert "region: categorical (text values), 3 distinct values, 1 missing" in lines[1]


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (
            {"categorical": ["Region"]},
            r"\[data\] categorical: .* no column 'Region' \(did you mean",
        ),
        ({"drop": ["notes"]}, r"\[data\] drop: .* no column 'notes' \(did you mean 'note'\?\)"),
        ({"categorical": ["branch"], "numeric": ["branch"]}, r"both categorical and numeric"),
        ({"numeric": ["region"]}, r"'region' must hold numbers, but row 'c000' holds"),
    ],
)
def test_what_the_config_names_wrongly_is_one_clear_error(
    tmp_path: Path, rules: dict[str, list[str]], message: str
) -> None:
    with pytest.raises(TableError, match=message):
        _load(_table(tmp_path), **rules)


def test_the_preparation_is_fitted_on_training_rows_and_round_trips(tmp_path: Path) -> None:
    table = _load(_table(tmp_path), drop=["note"])
    train = np.arange(30)
    transform = FeatureTransform.fit(table, train)
    x = transform.apply(table)

    # [income | branch | income's indicator | region, member codes]
    assert transform.output_names() == ["income", "branch", "income (missing)", "region", "member"]
    assert x.shape == (40, 5) and x.dtype == np.float32
    income = table.x[:30, 0]
    assert transform.numeric.fill is not None
    assert transform.numeric.fill[0] == pytest.approx(float(np.nanmedian(income)))
    np.testing.assert_array_equal(x[:, 2], np.isnan(table.x[:, 0]).astype(np.float32))
    assert transform.categories == [5, 3]  # region: 3 values + missing + code 0; member: 2 + 0
    assert x[3, 3] == transform.categorical[0].missing_code

    again = FeatureTransform.from_json(transform.to_json())
    assert again == transform
    np.testing.assert_array_equal(again.apply(table), x)


def test_a_stored_preparation_from_before_categories_reads_as_numbers_only() -> None:
    old = FeatureTransform.from_json({"columns": ["a", "b"], "mean": [1.0, 2.0], "scale": [1, 2]})
    assert old.width == 2 and old.categorical == () and old.source_columns == ["a", "b"]
    table = FeatureTable(ids=["x"], x=np.array([[3.0, 6.0]], np.float32), columns=["a", "b"])
    np.testing.assert_array_equal(old.apply(table), [[2.0, 2.0]])


def test_a_table_read_for_a_run_needs_its_columns_with_their_types(tmp_path: Path) -> None:
    path = _table(tmp_path)
    transform = FeatureTransform.fit(_load(path, drop=["note"]), np.arange(30))

    def read(frame: pd.DataFrame, **rules: list[str]) -> FeatureTable:
        serving = tmp_path / "serving.csv"
        frame.to_csv(serving, index=False)
        return load_features(
            serving,
            id_column="id",
            feature_columns=None,
            standardize=True,
            rules=ColumnRules(**rules),  # type: ignore[arg-type]
            expect=transform,
        )

    frame = pd.read_csv(path, dtype={"id": str})
    assert read(frame, drop=["note"]).columns == ["income", "branch"]
    with pytest.raises(TableError, match=r"lacks column 'income', which the run was trained on"):
        read(frame.drop(columns=["income"]), drop=["note"])
    with pytest.raises(TableError, match=r"has column 'note', which the run was not trained on"):
        read(frame)
    with pytest.raises(TableError, match=r"'branch' must hold numbers, but row 'c002' holds 'x'"):
        read(frame.assign(branch=["1", "1", "x", *["2"] * 37]), drop=["note"])
    numbers = frame.assign(region=np.arange(40))
    with pytest.raises(TableError, match=r"'region' held text when the run was trained"):
        read(numbers, drop=["note"])
    empty = read(frame.assign(region=np.nan), drop=["note"])  # all missing: any type
    assert (empty.categorical["region"].codes == -1).all()


def test_a_model_of_numbers_only_refuses_categories_and_a_wrong_width_is_told(
    tmp_path: Path,
) -> None:
    transform = FeatureTransform.fit(_load(_table(tmp_path), drop=["note"]), np.arange(30))
    with pytest.raises(ConfigError, match=r"'so_tag' reads numbers only.*\[data\] drop"):
        bottom_kwargs("so_tag", {}, transform)
    with pytest.raises(ConfigError, match=r"in_features = 4, but the prepared table has 5"):
        bottom_kwargs("tabular_mlp", {"in_features": 4}, transform)
    assert bottom_kwargs("tabular_mlp", {"hidden": [8]}, transform) == {
        "hidden": [8],
        "in_features": 5,
        "categories": [5, 3],
    }


def test_small_vocabularies_are_one_hot_large_ones_embedded_code_zero_is_zero() -> None:
    bottom = build_seeded(
        lambda: build_bottom(
            "tabular_mlp",
            in_features=4,
            hidden=[8],
            cut_dim=4,
            categories=[4, 40],
            one_hot_max=16,
            embedding_dim=6,
        ),  # fmt: skip
        0,
    )
    assert bottom.one_hot == (True, False)  # type: ignore[union-attr]
    assert bottom.net[0].in_features == 2 + 3 + 6  # type: ignore[index]
    embedding = bottom.embeddings[0]  # type: ignore[index]
    assert embedding.weight.shape == (40, 6) and not embedding.weight[0].any()
    x = torch.tensor([[0.5, -1.0, 2.0, 17.0], [0.5, -1.0, 0.0, 0.0]])
    assert bottom(x).shape == (2, 4)
    # codes 0: the one-hot columns and the embedding of the second row are zeros
    zeros = torch.cat([x[1:, :2], torch.zeros(1, 3 + 6)], dim=1)
    assert torch.equal(bottom(x[1:]), bottom.net(zeros))  # type: ignore[operator]


def test_a_numbers_only_bottom_is_the_one_it_always_was() -> None:
    plain = build_seeded(lambda: build_bottom("tabular_mlp", in_features=20), 0)
    assert list(plain.state_dict()) == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    torch.manual_seed(0)  # the reference: nn.Linear layers drawn in order from the seed
    first = torch.nn.Linear(20, 64)
    assert torch.equal(plain.state_dict()["net.0.weight"], first.weight.detach())


def test_the_export_program_computes_what_the_bottom_computes(tmp_path: Path) -> None:
    transform = FeatureTransform.fit(_load(_table(tmp_path), drop=["note"]), np.arange(30))
    config = load_config(None, {"run.name": "t", "run.model": "tabular_mlp", "run.steps": 1,
                                "run.batch_size": 4})  # fmt: skip
    kwargs = bottom_kwargs("tabular_mlp", dict(config.model.bottom), transform)
    bottom = build_seeded(lambda: build_bottom("tabular_mlp", **kwargs), 3).eval()
    example = torch.zeros((2, transform.width))
    program = tmp_path / "bottom.pt2"
    program.write_bytes(save_program(bottom, (example,)))
    loaded = torch.export.load(program).module()
    x = torch.from_numpy(transform.apply(_load(_table(tmp_path), drop=["note"])))
    assert torch.equal(loaded(x), bottom(x))
