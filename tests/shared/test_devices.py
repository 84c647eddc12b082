"""The device setting, host copies and device-neutral checkpoints (shared.devices,
shared.training), on a machine without a GPU: what CI can check of the GPU path."""

import io
from collections import OrderedDict

import pytest
import torch

from shared.devices import DeviceUnavailable, describe, resolve_device, to_host
from shared.training import state_from_bytes, state_to_bytes

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


def test_cpu_and_auto_resolve_to_the_cpu_here() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")


@no_cuda
@pytest.mark.parametrize("setting", ["cuda", "cuda:0", "CUDA:1"])
def test_cuda_without_a_gpu_is_refused_with_the_fix(setting: str) -> None:
    with pytest.raises(DeviceUnavailable) as caught:
        resolve_device(setting)
    message = str(caught.value)
    assert "\n" not in message
    assert setting in message and "'cpu' or 'auto'" in message


@pytest.mark.parametrize("setting", ["gpu", "cuda:", "cuda:x", "", "mps"])
def test_a_setting_that_is_no_device_is_refused(setting: str) -> None:
    with pytest.raises(DeviceUnavailable, match="cpu, cuda, cuda:N or auto"):
        resolve_device(setting)


def test_host_copies_of_cpu_tensors_are_views() -> None:
    a, b = torch.arange(6.0).reshape(2, 3), torch.tensor([1, 2], dtype=torch.int64)
    host = to_host([a, b])
    assert [h.shape for h in host] == [(2, 3), (2,)]
    host[0][0, 0] = 42.0  # no copy: the very memory of the tensor
    assert a[0, 0] == 42.0


def test_describe_names_the_device_and_versions() -> None:
    info = describe(torch.device("cpu"))
    assert info["name"] == "cpu" and info["torch"] == torch.__version__


def _model_state() -> "OrderedDict[str, torch.Tensor]":
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    return model.state_dict()


def test_a_cpu_checkpoint_is_written_as_it_always_was() -> None:
    """No copy and no change of type on a CPU: the bytes of torch.save itself (so checkpoints
    written before and after the device setting compare equal)."""
    state = _model_state()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert state_to_bytes(state) == buffer.getvalue()
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1, momentum=0.9)
    optimizer.step()  # momentum buffers: nested state
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    assert state_to_bytes(optimizer.state_dict()) == buffer.getvalue()


def test_a_checkpoint_written_on_a_gpu_loads_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes whose storages say cuda:0 (what torch.save writes for GPU tensors; here its
    location tag is made to say so) load on this CPU-only machine, into a CPU model."""
    state = _model_state()
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        buffer = io.BytesIO()
        torch.save(state, buffer)
    written_on_gpu = buffer.getvalue()
    assert b"cuda:0" in written_on_gpu
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(io.BytesIO(written_on_gpu), weights_only=True)  # what we avoid
    loaded = state_from_bytes(written_on_gpu)
    assert all(t.device.type == "cpu" for t in loaded.values())
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    model.load_state_dict(loaded)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
