"""The intra-op thread default: picked from a step's size and the cores, the operator's wins,
and both parties' training steps run on it (which count is picked, never how fast)."""

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from party_a.bottom import BottomTrainer
from party_b.top import TopTrainer
from shared import threads
from shared.codec import StepResponse, encode_step_response


@pytest.fixture(autouse=True)
def _process_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two threads for the process (a 2-core machine's torch default), no pin; put back."""
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_pinned", None)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_steps_take_one_thread_on_any_machine() -> None:
    assert threads.choose(threads.MIN_PARALLEL_MACS - 1, cores=64) == 1


def test_large_steps_take_at_most_two_threads_and_only_from_four_cores() -> None:
    big = 100 * threads.MACS_PER_THREAD
    assert threads.choose(big, cores=16) == threads.MAX_THREADS == 2
    assert threads.choose(big, cores=2) == 1  # two would be every core
    assert threads.choose(threads.MIN_PARALLEL_MACS, cores=16) == 2


def test_the_operators_count_wins() -> None:
    threads.pin(3)
    assert threads.pinned() == 3
    assert torch.get_num_threads() == 3
    assert threads.choose(1, cores=2) == 3
    with pytest.raises(ValueError, match=">= 1"):
        threads.pin(0)


def test_macs_of_a_linear_and_a_convolution_layer() -> None:
    linear = torch.nn.Linear(20, 64)
    assert threads.macs_per_sample(linear, torch.zeros(1, 20)) == 3 * (20 * 64 + 64)
    conv = torch.nn.Conv2d(1, 4, kernel_size=3)  # 26 x 26 outputs of 4 channels
    per_position = 4 * 1 * 3 * 3 + 4
    assert threads.macs_per_sample(conv, torch.zeros(1, 1, 28, 28)) == 3 * per_position * 26 * 26


def test_intra_op_sets_this_thread_only_and_puts_it_back() -> None:
    seen: dict[str, int] = {}

    def worker() -> None:
        with threads.intra_op(1):
            seen["inside"] = torch.get_num_threads()
            seen["caller"] = caller[0]

    caller = [torch.get_num_threads()]
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"inside": 1, "caller": 2}
    assert torch.get_num_threads() == 2
    with threads.intra_op(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def _threads_seen(model: torch.nn.Module) -> list[int]:
    seen: list[int] = []
    model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    return seen


def _top() -> TopTrainer:
    return TopTrainer(
        model="tabular_mlp",
        top_kwargs={"hidden": [32], "num_classes": 2},
        cut_dim=32,
        optimizer={"name": "adam", "lr": 0.01},
        task="classification",
        seed=0,
    )


@pytest.mark.parametrize("pin", [None, 3])
def test_party_bs_step_runs_on_the_chosen_count(pin: int | None) -> None:
    """The demo's top step (~0.1 M multiply-adds) on one thread, in a process whose torch
    default is two; with the operator's pin, on that."""
    if pin is not None:
        threads.pin(pin)
        torch.set_num_threads(2)  # the process's setting, which the pin outranks
    top = _top()
    seen = _threads_seen(top.model)
    top.compute_step(torch.randn(32, 32), torch.randint(0, 2, (32,)), None, dropout_seed=1)
    top.apply_step()
    assert seen[-1] == (pin or 1)
    assert torch.get_num_threads() == 2  # the caller's setting, put back


@pytest.mark.parametrize("pin", [None, 3])
def test_party_as_step_runs_on_the_chosen_count(pin: int | None) -> None:
    if pin is not None:
        threads.pin(pin)
        torch.set_num_threads(2)
    bottom = BottomTrainer(
        model="tabular_mlp",
        bottom_kwargs={"in_features": 20, "hidden": [64], "cut_dim": 32},
        quantizer={"mode": "pq", "q": 8, "L": 4, "R": 1},
        optimizer={"name": "adam", "lr": 0.01},
        seed=0,
    )
    seen = _threads_seen(bottom.model)
    x = np.random.default_rng(0).standard_normal((32, 20)).astype(np.float32)
    pending = bottom.request(1, x, b"\0" * 8)
    assert seen[-1] == (pin or 1) and pending.threads == (pin or 1)
    grad = np.zeros((32, 32), dtype=np.float32)
    bottom.apply(pending, encode_step_response(StepResponse(1, 0.5, {"n": 32.0}, grad)))
    assert torch.get_num_threads() == 2
