"""The demo data: scikit-learn's breast cancer set (569 samples, 30 features) split vertically.

Party A (features) gets the 20 "error" and "worst" columns; party B (labels) gets the label
``y`` (1 = benign) and the 10 "mean" columns, the same shape as FATE's breast_hetero example.
The data ship inside scikit-learn, so nothing is downloaded. With ``overlap`` below 1 each
party drops a different random share of the ids, so that alignment has something to find.
"""

from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.datasets import load_breast_cancer

__all__ = ["PARTY_A_FILE", "PARTY_B_FILE", "write_breast_cancer_split"]

PARTY_A_FILE = "party_a.csv"
PARTY_B_FILE = "party_b.csv"


def write_breast_cancer_split(
    out_dir: Path, *, overlap: float = 1.0, seed: int = 0, party_b_dir: Path | None = None
) -> tuple[Path, Path]:
    """Write ``party_a.csv`` (id + 20 features) and ``party_b.csv`` (id, y + 10 features).

    ``overlap`` is the fraction of the 569 ids both files hold; the others are dealt out
    evenly to one file each. ``party_b.csv`` goes to ``party_b_dir`` when given (each
    party's data on its own volume), else beside ``party_a.csv``. Returns the two paths.
    """
    if not 0 < overlap <= 1:
        raise ValueError(f"overlap must be in (0, 1], got {overlap}")
    data = load_breast_cancer()
    names = [str(n).replace(" ", "_") for n in data.feature_names]
    x = pd.DataFrame(data.data, columns=names)
    ids = pd.Series([f"{i:04d}" for i in range(len(x))], name="id")

    order = np.random.default_rng(seed).permutation(len(x))
    n_both = round(overlap * len(x))
    only = order[n_both:]
    a_rows = np.sort(np.concatenate([order[:n_both], only[: len(only) // 2]]))
    b_rows = np.sort(np.concatenate([order[:n_both], only[len(only) // 2 :]]))

    mean_cols = [n for n in names if n.startswith("mean_")]
    other_cols = [n for n in names if not n.startswith("mean_")]
    assert len(mean_cols) == 10 and len(other_cols) == 20, "sklearn's column names changed"
    party_a = pd.concat([ids, x[other_cols]], axis=1).iloc[a_rows]
    party_b = pd.concat([ids, pd.Series(data.target, name="y"), x[mean_cols]], axis=1).iloc[b_rows]

    a_path = Path(out_dir) / PARTY_A_FILE
    b_path = Path(party_b_dir if party_b_dir is not None else out_dir) / PARTY_B_FILE
    for path in (a_path, b_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    party_a.to_csv(a_path, index=False, float_format="%.6g")
    party_b.to_csv(b_path, index=False, float_format="%.6g")
    return a_path, b_path
