"""``fedlite-b export`` of a run whose top model reads party B's own columns when they hold
categories and empty cells: the export carries the fitted preparation, and scoring from it
(examples/serve_export.py) prepares the table exactly as the service did.

Exports used to carry a z-score alone, so such a run could not be exported at all (the
command said the side features came "from a label source, not a table")."""

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd

from party_b.labels import load_label_table
from party_b.ops.export import export_run
from party_b.settings import Settings
from shared.pq.frozen import read_manifest
from tests.utils.small_runs import aligned_in_process, small_party_b

ROOT = Path(__file__).resolve().parents[2]


def _serve_export() -> ModuleType:
    """examples/serve_export.py as a module (it is a script, not a package's module)."""
    spec = importlib.util.spec_from_file_location(
        "serve_export", ROOT / "examples" / "serve_export.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _labels_with_categories(path: Path, n: int = 64) -> Path:
    """ids u000..u063 (as the small runs align), a binary label, a colour (a rare value and
    empty cells) and an income with empty cells."""
    rng = np.random.default_rng(1)
    colours = np.array(["red", "green", "blue"])[rng.integers(0, 3, n)].astype(object)
    colours[5] = "ultraviolet"  # seen once: pooled into "other"
    colours[[7, 9]] = ""  # empty: the "missing" bucket
    income = rng.normal(50.0, 10.0, n)
    income[[3, 11]] = np.nan
    frame = pd.DataFrame(
        {
            "id": [f"u{i:03d}" for i in range(n)],
            "y": rng.integers(0, 2, n),
            "colour": colours,
            "income": income,
            "age": rng.integers(20, 70, n),
        }
    )
    frame.to_csv(path, index=False)
    return path


def test_a_run_reading_categories_and_empty_cells_exports_and_serves_as_trained(
    tmp_path: Path,
) -> None:
    table_path = _labels_with_categories(tmp_path / "labels.csv")
    labels = load_label_table(table_path, id_column="id", label_column="y", feature_columns=None)
    assert labels.feature_mean is None  # what the old export needed, and lacked here
    party_b = small_party_b(tmp_path / "b", labels)
    run = aligned_in_process(party_b.service(), party_b.caller)
    settings = Settings(data_dir=tmp_path / "b", labels=table_path)  # fedlite-b export's

    manifest = export_run(settings, labels, run.id, tmp_path / "b-export")

    side = read_manifest(tmp_path / "b-export", "B")["side"]
    assert side == manifest["side"]
    assert [v["name"] for v in side["preparation"]["categorical"]] == ["colour"]
    assert side["preparation"]["indicators"] == ["income"]
    ids, x = _serve_export().side_features(table_path, side)
    assert ids == labels.ids
    np.testing.assert_array_equal(x, labels.features)  # the very bits the service trained on
    # the export reads the columns by name: another column order in the file changes nothing
    shuffled = pd.read_csv(table_path, keep_default_na=False)[
        ["age", "income", "id", "colour", "y"]
    ]
    shuffled.to_csv(tmp_path / "shuffled.csv", index=False)
    again_ids, again = _serve_export().side_features(tmp_path / "shuffled.csv", side)
    assert again_ids == ids
    np.testing.assert_array_equal(again, x)
