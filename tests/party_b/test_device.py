"""Party B's device (one per process): the CPU by default, "auto", and "cuda" refused at
start-up with the fix on a machine without a GPU."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from party_b.device import compute_device, use_device
from party_b.errors import StartupError
from party_b.top import TopTrainer
from tests.utils.cli import TOKEN, demo_tables, run_cli

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@pytest.fixture(autouse=True)
def back_to_the_cpu() -> Iterator[None]:
    yield
    use_device("cpu")


def test_top_models_are_built_on_the_processs_device() -> None:
    assert compute_device() == torch.device("cpu")
    if not torch.cuda.is_available():
        assert use_device("auto") == torch.device("cpu")
    trainer = TopTrainer(
        model="tabular_mlp", top_kwargs={"hidden": [4], "num_classes": 2}, cut_dim=3,
        optimizer={"name": "sgd", "lr": 0.1}, task="classification", seed=0,
    )  # fmt: skip
    assert trainer.device == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in trainer.model.parameters())


@no_cuda
def test_cuda_without_a_gpu_is_a_startup_error_naming_the_fix() -> None:
    with pytest.raises(StartupError, match="FEDLITE_B_DEVICE") as caught:
        use_device("cuda")
    assert "'cpu' or 'auto'" in str(caught.value)
    assert compute_device() == torch.device("cpu")  # unchanged


@no_cuda
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_serve_refuses_cuda_without_a_gpu_in_one_line(tmp_path: Path, how: str) -> None:
    _, labels = demo_tables(tmp_path)
    args = ["serve", "--data-dir", str(tmp_path / "b"), "--labels", str(labels),
            "--tokens", f"tester:{TOKEN}", "--port", "0"]  # fmt: skip
    env = {}
    if how == "flag":
        args += ["--device", "cuda"]
    else:
        env["FEDLITE_B_DEVICE"] = "cuda"
    ran = run_cli("b", *args, env=env, timeout=120)
    assert ran.returncode == 2, ran.stderr
    # the refusal is one line (besides the start-up phases party B logs as it goes)
    lines = [line for line in ran.stderr.splitlines() if line.startswith("fedlite-b serve:")]
    assert len(lines) == 1 and "--device / FEDLITE_B_DEVICE" in lines[0], ran.stderr
