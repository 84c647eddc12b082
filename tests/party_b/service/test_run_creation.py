"""Run creation survives a party A that dies between party B's answer and its own record."""

from pathlib import Path

import numpy as np
import pytest

from experiments.tasks import ClassLabels
from party_a.config import load_config
from party_a.errors import problem_from_body
from party_a.features import FeatureTable
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_b.inprocess import InProcessTransport, in_process_party_b


def _data() -> tuple[FeatureTable, ClassLabels]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 60)
    x = (rng.normal(size=(60, 4)) + y[:, None]).astype(np.float32)
    ids = [f"id{i:02d}" for i in range(60)]
    features = FeatureTable(ids=ids, x=x, columns=[f"x{i}" for i in range(4)])
    return features, ClassLabels(row_ids=ids, labels=y.astype(np.int64), num_outputs=2)


CONFIG = {
    "run.name": "once",
    "run.model": "tabular_mlp",
    "run.steps": 4,
    "run.batch_size": 8,
    "run.use_side_features": False,
    "model.bottom": {"hidden": [8], "cut_dim": 8},
    "model.top": {"hidden": [8]},
    "quantizer.mode": "pq",
    "quantizer.q": 4,
    "quantizer.L": 2,
    "optimizer.bottom": {"name": "sgd", "lr": 0.1},
    "optimizer.top": {"name": "sgd", "lr": 0.1},
}


def test_party_a_killed_after_create_gets_the_same_run_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    features, labels = _data()
    service, caller = in_process_party_b(labels, tmp_path / "b.sqlite")

    def trainer(name: str = "once") -> PartyATrainer:
        return PartyATrainer(
            config=load_config(None, {**CONFIG, "run.name": name}),
            features=features,
            transport=InProcessTransport(service, caller, problem=problem_from_body),
            store=LocalStore.in_directory(tmp_path / "a"),
            server="in-process",
        )

    def die(*_args: object) -> None:
        raise SystemExit("party A killed before it wrote the run down")

    monkeypatch.setattr(LocalStore, "add_run", die)
    with pytest.raises(SystemExit):
        trainer().prepare()
    monkeypatch.undo()

    again = trainer()
    again.prepare()
    again.train()
    other = trainer("another")  # another run name is another run
    other.prepare()

    runs = service.runs.list_runs(caller)
    assert len(runs) == 2
    assert again.run_id in {r.id for r in runs} and other.run_id != again.run_id
