"""Party A's device setting on a machine without a GPU: the CPU default, "auto", the refusal
of "cuda" (one line, exit 2), and the device as a local choice that is no part of the run."""

from pathlib import Path

import pytest
import torch

from party_a.api import connect
from party_a.config import load_config
from party_a.errors import ConfigError, problem_from_body
from party_a.features import load_features
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.labels import load_label_table
from shared.devices import DeviceUnavailable
from shared.training import state_sha256
from tests.utils.cli import DEMO_CONFIG, TOKEN, demo_tables, run_cli
from tests.utils.party_a import breast_config

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


def _trainer(tmp_path: Path, device: str) -> PartyATrainer:
    """A demo run (breast, FedLite) against party B in this process, both on ``tmp_path``."""
    features, labels = demo_tables(tmp_path)
    service, caller = in_process_party_b(
        load_label_table(labels, id_column="id", label_column="y", feature_columns=None),
        tmp_path / "party_b.sqlite",
    )
    return PartyATrainer(
        config=breast_config("devices", **{"run.steps": 10, "run.checkpoint_interval": 5,
                                           "run.device": device}),
        features=load_features(features, id_column="id", feature_columns=None, standardize=True),
        transport=InProcessTransport(service, caller, problem=problem_from_body),
        store=LocalStore.in_directory(tmp_path / "party_a"),
        server="in-process",
    )  # fmt: skip


def test_the_device_is_the_cpu_unless_asked() -> None:
    config = load_config(DEMO_CONFIG, {})
    assert config.run.device == "cpu"


def test_a_device_that_is_no_device_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"run\.device"):
        load_config(DEMO_CONFIG, {"run.device": "gpu"})


def test_a_run_trained_on_one_device_setting_is_the_same_run_on_another(tmp_path: Path) -> None:
    """Trained with "cpu", reopened with "auto" (the CPU here): the same local run, at its
    last step, with the same model; the device is left out of the run's fingerprint."""
    first = _trainer(tmp_path, "cpu")
    try:
        first.prepare()
        summary = first.train()
        model = state_sha256(first.bottom.model.state_dict())
        fingerprint = first._fingerprint()
    finally:
        first.close()
    again = _trainer(tmp_path, "auto")
    try:
        again.prepare()  # ConfigError if the device made it another configuration
        assert again.bottom.device == torch.device("cpu")
        assert again.step == summary.last_step == 10
        assert state_sha256(again.bottom.model.state_dict()) == model
        assert again._fingerprint() == fingerprint
        assert "device" not in fingerprint["run"]
    finally:
        again.close()


@no_cuda
def test_train_refuses_cuda_without_a_gpu_in_one_line(tmp_path: Path) -> None:
    features, _ = demo_tables(tmp_path)
    ran = run_cli(
        "a", "train", "--server", "http://127.0.0.1:9", "--token", TOKEN,
        "--features", str(features), "--config", str(DEMO_CONFIG),
        "--state-dir", str(tmp_path / "state"), "--device", "cuda",
    )  # fmt: skip
    assert ran.returncode == 2, ran.stderr
    # the refusal is one line (besides the phases fedlite-a reports as it goes)
    lines = [line for line in ran.stderr.splitlines() if line.startswith("fedlite-a train:")]
    assert len(lines) == 1 and "device 'cuda'" in lines[0] and "'cpu' or 'auto'" in lines[0]


@no_cuda
def test_connect_refuses_cuda_without_a_gpu(tmp_path: Path) -> None:
    features, _ = demo_tables(tmp_path)
    with (
        pytest.raises(DeviceUnavailable, match="device 'cuda'"),
        connect(
            "http://127.0.0.1:9",
            TOKEN,
            features=features,
            config=DEMO_CONFIG,
            state_dir=tmp_path / "state",
            device="cuda",
        ),
    ):
        pass  # pragma: no cover - refused before the block
