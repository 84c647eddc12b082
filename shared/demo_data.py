"""The bundled demo data: scikit-learn's breast-cancer set, split vertically.

Party A gets 20 feature columns; party B gets the label and the other 10 columns (the same
split as FATE's breast_hetero pair). Each party's CLI writes only its own half, so a demo or a
container never needs the other party's file. Ids are ``s0000`` ... ``s0568``.

By default both halves hold every id. With ``overlap`` below 1 (the same ``overlap`` and
``seed`` on both sides), only that fraction of the ids is shared and the rest are dealt out
evenly to one party each, so that sample alignment has something to find.
"""

from pathlib import Path

import numpy as np
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


def _rows(n: int, party: str, overlap: float, seed: int) -> np.ndarray:
    """Sorted row numbers one party keeps: the shared ones and its own share of the rest."""
    if not 0 < overlap <= 1:
        raise ValueError(f"overlap must be in (0, 1], got {overlap}")
    order = np.random.default_rng(seed).permutation(n)
    shared = round(overlap * n)
    rest = order[shared:]
    own = rest[: len(rest) // 2] if party == "a" else rest[len(rest) // 2 :]
    return np.sort(np.concatenate([order[:shared], own]))


def write_party_a_demo(
    path: Path,
    *,
    overlap: float = 1.0,
    seed: int = 0,
    columns: tuple[int, int] = (0, PARTY_A_COLUMNS),
) -> Path:
    """Party A's half: id + the first 20 feature columns, or the range ``columns`` of them
    (start, stop): e.g. (0, 10) and (10, 20) for two feature parties of one run."""
    start, stop = columns
    if not 0 <= start < stop <= PARTY_A_COLUMNS:
        raise ValueError(f"columns must be a range within 0..{PARTY_A_COLUMNS}, got {columns}")
    frame = _frame()
    frame = frame.iloc[_rows(len(frame), "a", overlap, seed)]
    path.parent.mkdir(parents=True, exist_ok=True)
    frame[["id", *frame.columns[1 + start : 1 + stop]]].to_csv(path, index=False)
    return path


def write_party_b_demo(path: Path, *, overlap: float = 1.0, seed: int = 0) -> Path:
    """Party B's half: id, label y and the last 10 feature columns."""
    frame = _frame()
    frame = frame.iloc[_rows(len(frame), "b", overlap, seed)]
    features = [c for c in frame.columns[1 + PARTY_A_COLUMNS :] if c != "y"]
    path.parent.mkdir(parents=True, exist_ok=True)
    frame[["id", "y", *features]].to_csv(path, index=False)
    return path
