"""Factories for party A sessions in tests (real HttpTransport, real local SQLite)."""

from pathlib import Path
from typing import Any

from party_a.config import PartyAConfig, load_config
from party_a.features import load_features
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_a.transport.http import HttpTransport


def breast_config(name: str, **overrides: Any) -> PartyAConfig:
    """The FATE breast_hetero setting: 20 host columns -> MLP -> d=32, PQ q=8 L=4."""
    base: dict[str, Any] = {
        "run.name": name,
        "run.model": "tabular_mlp",
        "run.steps": 100,  # ~7 epochs: longer overfits the 455 training rows
        "run.batch_size": 32,
        "run.seed": 0,
        "run.checkpoint_interval": 25,
        "run.eval_fraction": 0.2,
        "model.bottom": {"hidden": [64], "cut_dim": 32},
        "model.top": {"hidden": [32]},
        "quantizer.mode": "pq",
        "quantizer.q": 8,
        "quantizer.L": 4,
        "quantizer.lambda": 0.001,
        "optimizer.bottom": {"name": "adam", "lr": 0.003},
        "optimizer.top": {"name": "adam", "lr": 0.003},
    }
    base.update(overrides)
    return load_config(None, base)


def make_trainer(
    state_dir: Path,
    server: str,
    token: str,
    features: Path,
    config: PartyAConfig,
    *,
    retry_for: float = 120.0,
    ca_bundle: Path | None = None,
    timeout: float = 120.0,
) -> PartyATrainer:
    return PartyATrainer(
        config=config,
        features=load_features(
            features, id_column="id", feature_columns=None, standardize=config.data.standardize
        ),
        transport=HttpTransport(
            server, token, retry_for=retry_for, ca_bundle=ca_bundle, timeout=timeout
        ),
        store=LocalStore.in_directory(state_dir),
        server=server,
    )
