"""modeldata's credit_data as it comes, through both CLIs over real HTTP (party B: uvicorn in a
thread on the raw label table, ``Status`` good/bad; party A: ``fedlite-a`` on its raw table
with ``examples/credit.toml``, a config that names no column):

* ``train`` says how it typed every column (categories, missing cells) before any row is
  sent, and trains;
* ``predict`` on a serving table with a category never seen and an empty cell scores every
  row, and says what it filled; a serving table without one of the run's columns, with a
  new one, or with a column of another type is one line naming the column, exit code 2;
* ``export`` and ``examples/serve_export.py`` prepare a serving table exactly as ``predict``
  does (the same activations: the same scores at party B).
"""

import csv
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.tables.data import CreditTables, write_credit_tables
from party_a.bottom import BottomTrainer
from party_a.config import PartyAConfig
from party_a.features import FeatureTransform, load_features
from party_a.preparation import bottom_kwargs
from party_a.store import LocalStore
from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.cli import REPO_ROOT, TOKEN, run_cli
from tests.utils.live import live_server

CONFIG = REPO_ROOT / "examples" / "credit.toml"


@pytest.fixture(scope="module")
def credit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Party B on credit_data's raw label table; party A's run trained 40 steps."""
    root = tmp_path_factory.mktemp("credit")
    tables = write_credit_tables(root / "data")
    settings = Settings(
        data_dir=root / "b",
        labels=tables.labels,
        label_column="Status",
        tokens=f"a:{TOKEN}",
        # label privacy off, and training rows scored: the tests score rows of the run
        privacy="off,predict_train_ids=true",
    )
    with live_server(create_app(settings)) as url:
        state = root / "a"
        trained = run_cli(
            "a", "train", "--server", url, "--token", TOKEN, "--features", str(tables.features),
            "--config", str(CONFIG), "--steps", "40", "--state-dir", str(state),
        )  # fmt: skip
        yield {"url": url, "tables": tables, "state": state, "train": trained, "root": root}


def _predict(credit: dict[str, object], serving: Path, ids: list[str], *extra: str):  # type: ignore[no-untyped-def]
    return run_cli(
        "a", "predict", "--server", str(credit["url"]), "--token", TOKEN,
        "--features", str(serving), "--name", "credit", "--state-dir", str(credit["state"]),
        "--ids", ",".join(ids), *extra,
    )  # fmt: skip


def _serving(credit: dict[str, object], name: str) -> tuple[pd.DataFrame, Path]:
    tables = credit["tables"]
    assert isinstance(tables, CreditTables)
    frame = pd.read_csv(tables.features, dtype={"id": str}).iloc[:6].copy()
    return frame, Path(str(credit["root"])) / name


def test_train_types_every_column_before_any_row_is_sent(credit: dict[str, object]) -> None:
    ran = credit["train"]
    assert ran.returncode == 0, ran.stderr  # type: ignore[attr-defined]
    err: str = ran.stderr  # type: ignore[attr-defined]
    assert "features: 4,454 rows, 9 columns: 6 numeric, 3 categorical, 6 with missing" in err
    for line in (
        "Income: numeric (numbers), 381 missing (filled with the training median",
        "Home: categorical (text values), 6 distinct values, 6 missing (a missing bucket)",
        "Job: categorical (text values), 4 distinct values, 2 missing",
    ):
        assert line in err
        assert err.index(line) < err.index("PSI:")  # before the first message to party B


def test_predict_scores_an_unseen_category_and_an_empty_cell(
    credit: dict[str, object],
) -> None:
    frame, serving = _serving(credit, "serving.csv")
    frame.loc[0, "Home"] = "houseboat"  # never seen in training
    frame.loc[1, "Income"] = np.nan
    frame.loc[2, "Job"] = np.nan
    frame.to_csv(serving, index=False)

    ran = _predict(credit, serving, frame["id"].tolist())

    assert ran.returncode == 0, ran.stderr
    rows = list(csv.reader(io.StringIO(ran.stdout)))
    assert rows[0] == ["id", "score_0", "score_1"]
    assert [r[0] for r in rows[1:]] == frame["id"].tolist()
    scores = np.array([[float(v) for v in r[1:]] for r in rows[1:]])
    assert np.isfinite(scores).all() and np.allclose(scores.sum(axis=1), 1, atol=1e-5)
    assert "Income 1 missing (median)" in ran.stderr
    assert "Home 1 not seen in training (other" in ran.stderr
    assert "Job 1 missing (missing bucket)" in ran.stderr


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("drop", "lacks column 'Income', which the run was trained on"),
        ("add", "has column 'Branch', which the run was not trained on"),
        ("retype", "column 'Age' must hold numbers, but row '1' holds 'forty'"),
    ],
)
def test_a_serving_table_without_the_runs_columns_and_types_is_one_line(
    credit: dict[str, object], change: str, message: str
) -> None:
    frame, serving = _serving(credit, f"serving-{change}.csv")
    if change == "drop":
        frame = frame.drop(columns=["Income"])
    elif change == "add":
        frame["Branch"] = "north"
    else:
        frame["Age"] = frame["Age"].astype(object)
        frame.loc[0, "Age"] = "forty"
    frame.to_csv(serving, index=False)

    ran = _predict(credit, serving, frame["id"].tolist())

    assert ran.returncode == 2, ran.stderr
    assert message in ran.stderr
    assert ran.stdout == ""


def test_the_export_prepares_a_serving_table_as_predict_does(
    credit: dict[str, object], tmp_path: Path
) -> None:
    frame, serving = _serving(credit, "serving-export.csv")
    frame.loc[0, "Home"] = "houseboat"
    frame.loc[1, "Income"] = np.nan
    frame.to_csv(serving, index=False)
    exported = run_cli(
        "a", "export", "--state-dir", str(credit["state"]), "--name", "credit",
        "--out", str(tmp_path / "a-export"),
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr

    script = str(REPO_ROOT / "examples" / "serve_export.py")
    activations = tmp_path / "activations.npz"
    done = subprocess.run(
        [sys.executable, script, "party-a", "--export", str(tmp_path / "a-export"),
         "--features", str(serving), "--out", str(activations), "--raw"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    store = LocalStore.in_directory(Path(str(credit["state"])))
    try:
        local = store.find_run(str(credit["url"]), "credit")
        assert local is not None
        stored, checkpoint = store.serving(local.id), store.load_checkpoint(local.id)
        assert stored is not None and checkpoint is not None
        config = PartyAConfig.model_validate(local.config)
    finally:
        store.close()
    # what the trainer forwards for these rows: its preparation of the serving table through
    # the bottom model of its newest checkpoint
    transform = FeatureTransform.from_json(stored.transform)
    table = load_features(
        serving, id_column="id", feature_columns=None, standardize=True, expect=transform
    )
    bottom = BottomTrainer(
        model="tabular_mlp",
        bottom_kwargs=bottom_kwargs("tabular_mlp", dict(config.model.bottom), transform),
        quantizer={"mode": "raw"},
        optimizer={"name": "adam", "lr": 0.003},
        seed=0,
    )
    bottom.load_state(checkpoint.model_state, checkpoint.optimizer_state)
    expected = bottom.forward(transform.apply(table)).numpy()

    z = np.load(activations)["z"]
    assert z.shape == (6, 32)
    np.testing.assert_allclose(z, expected, rtol=0, atol=1e-6)


def test_flags_type_and_drop_columns_and_a_dropped_column_may_stay_in_a_serving_table(
    credit: dict[str, object],
) -> None:
    tables = credit["tables"]
    assert isinstance(tables, CreditTables)
    trained = run_cli(
        "a", "train", "--server", str(credit["url"]), "--token", TOKEN,
        "--features", str(tables.features), "--config", str(CONFIG), "--name", "credit-typed",
        "--steps", "4", "--categorical", "Seniority", "--drop", "Debt,Assets",
        "--state-dir", str(credit["state"]),
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert "features: 4,454 rows, 7 columns: 3 numeric, 4 categorical" in trained.stderr
    assert "Seniority: categorical (declared categorical)" in trained.stderr

    frame, serving = _serving(credit, "serving-typed.csv")  # Debt and Assets still in it
    frame.to_csv(serving, index=False)
    scored = run_cli(
        "a", "predict", "--server", str(credit["url"]), "--token", TOKEN,
        "--features", str(serving), "--name", "credit-typed",
        "--state-dir", str(credit["state"]), "--ids", ",".join(frame["id"]),
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    assert len(scored.stdout.strip().splitlines()) == 1 + len(frame)
