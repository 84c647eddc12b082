"""The bundled demo data: scikit-learn's breast-cancer set, split vertically.

Party A gets 20 feature columns; party B gets the label and the other 10 columns (the same
split as FATE's breast_hetero pair). Each party's CLI writes only its own half, so a demo or a
container never needs the other party's file. Ids are ``s0000`` ... ``s0568``.
"""

from pathlib import Path

import pandas as pd

__all__ = ["PARTY_A_COLUMNS", "write_party_a_demo", "write_party_b_demo"]

PARTY_A_COLUMNS = 20


def _frame() -> pd.DataFrame:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    frame = pd.DataFrame(data.data, columns=[f"f{i:02d}" for i in range(data.data.shape[1])])
    frame.insert(0, "id", [f"s{i:04d}" for i in range(len(frame))])
    frame["y"] = data.target
    return frame


def write_party_a_demo(path: Path) -> Path:
    """Party A's half: id + the first 20 feature columns."""
    frame = _frame()
    path.parent.mkdir(parents=True, exist_ok=True)
    frame[["id", *frame.columns[1 : 1 + PARTY_A_COLUMNS]]].to_csv(path, index=False)
    return path


def write_party_b_demo(path: Path) -> Path:
    """Party B's half: id, label y and the last 10 feature columns."""
    frame = _frame()
    features = [c for c in frame.columns[1 + PARTY_A_COLUMNS :] if c != "y"]
    path.parent.mkdir(parents=True, exist_ok=True)
    frame[["id", "y", *features]].to_csv(path, index=False)
    return path
