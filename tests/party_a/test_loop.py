"""Pipelined steps (``[run] pipeline_depth`` = K): the staleness is exactly the documented one,
a run is deterministic for a given K, steps that overtake each other are resent without a
double update, and a party A killed with steps in flight resumes bit-identically.

Real parts throughout: party B's ``Service`` on a SQLite file (in process), party A's
trainer with its own SQLite store, real torch. The kill tests over HTTP are in test_faults.py.
"""

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments.tasks import ClassLabels
from party_a.config import load_config
from party_a.errors import StepOutOfOrder, problem_from_body
from party_a.features import FeatureTable
from party_a.loop import needed
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer, TrainSummary
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.service import Service
from party_b.service.runstate import Caller
from shared.codec import decode_step_request
from shared.training import state_sha256

STEPS = 24
CONFIG: dict[str, Any] = {
    "run.name": "pipelined",
    "run.model": "tabular_mlp",
    "run.steps": STEPS,
    "run.batch_size": 8,
    "run.checkpoint_interval": 6,
    "run.use_side_features": False,
    "model.bottom": {"hidden": [8], "cut_dim": 8},
    "model.top": {"hidden": [8]},
    "quantizer.mode": "pq",
    "quantizer.q": 4,
    "quantizer.L": 2,
    "quantizer.lambda": 0.001,
    "optimizer.bottom": {"name": "adam", "lr": 0.01},
    "optimizer.top": {"name": "adam", "lr": 0.01},
}


def _data() -> tuple[FeatureTable, ClassLabels]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 120)
    x = (rng.normal(size=(120, 4)) + y[:, None]).astype(np.float32)
    ids = [f"id{i:03d}" for i in range(120)]
    features = FeatureTable(ids=ids, x=x, columns=[f"x{i}" for i in range(4)])
    return features, ClassLabels(row_ids=ids, labels=y.astype(np.int64), num_outputs=2)


class _Transport(InProcessTransport):
    """In-process party B with hooks on the step call (it runs in party A's sender threads)."""

    def __init__(self, service: Service, caller: Caller) -> None:
        super().__init__(service, caller, problem=problem_from_body)
        self.delay: dict[int, float] = {}  # step -> seconds to hold its request back
        self.overtaken: set[int] = set()  # steps held back until their successor is refused
        self.lose: set[int] = set()  # steps whose first answer is lost after the next applies
        self.die_at: int | None = None  # a step whose request kills party A (SystemExit)
        self.sent: list[int] = []
        self._refused: set[int] = set()
        self._changed = threading.Condition()

    def step(self, run_id: str, body: bytes) -> bytes:
        step = decode_step_request(body).step
        self.sent.append(step)
        if step == self.die_at:
            raise SystemExit(f"party A killed while step {step} was in flight")
        time.sleep(self.delay.get(step, 0.0))
        if step in self.overtaken:  # its successor, sent meanwhile, reaches party B first
            with self._changed:
                overtook = self._changed.wait_for(lambda: step + 1 in self._refused, 120)
            assert overtook, f"step {step + 1} never overtook step {step}"  # a deadlock
        try:
            return self._step(run_id, body, step)
        except StepOutOfOrder:
            with self._changed:
                self._refused.add(step)
                self._changed.notify_all()
            raise

    def _step(self, run_id: str, body: bytes, step: int) -> bytes:
        if step - 1 in self.lose:
            # never overtake a step whose answer is to be lost: refused (409), this step would
            # be resent only after that answer, which the hook below holds until this step is
            # applied (a deadlock that failed the test at load 15)
            self._wait_applied(run_id, step - 1, f"step {step - 1} was never applied")
        if step in self.lose:  # applied, the answer lost, the retry arrives after step + 1
            super().step(run_id, body)
            self.lose.discard(step)  # only now: step + 1 may go
            self._wait_applied(run_id, step + 1, f"step {step + 1} was never sent")
        return super().step(run_id, body)

    def _wait_applied(self, run_id: str, step: int, failure: str) -> None:
        deadline = time.monotonic() + 120  # a deadlock, not a slow machine
        while self.service.runs.get(self.caller, run_id).step < step:
            assert time.monotonic() < deadline, failure
            time.sleep(0.01)


class _Parties:
    def __init__(self, tmp_path: Path) -> None:
        self.features, labels = _data()
        self.tmp_path = tmp_path
        self.service, self.caller = in_process_party_b(labels, tmp_path / "b.sqlite")

    def trainer(self, name: str, depth: int, state: str | None = None) -> PartyATrainer:
        return PartyATrainer(
            config=load_config(None, {**CONFIG, "run.name": name, "run.pipeline_depth": depth}),
            features=self.features,
            transport=_Transport(self.service, self.caller),
            store=LocalStore.in_directory(self.tmp_path / (state or name)),
            server="in-process",
        )

    def train(self, name: str, depth: int) -> tuple[PartyATrainer, TrainSummary]:
        trainer = self.trainer(name, depth)
        trainer.prepare()
        return trainer, trainer.train()

    def applied(self, trainer: PartyATrainer) -> list[int]:
        return [s.step for s in self.service.runs.step_log(self.caller, trainer.run_id, 0, 10_000)]


def _bottom(trainer: PartyATrainer) -> str:
    return state_sha256(trainer.bottom.model.state_dict())


def _evaluation(trainer: PartyATrainer) -> tuple[float, dict[str, float]]:
    answer = trainer.evaluate()
    return answer.loss, answer.metrics


def test_needed_is_one_step_back_at_depth_one_and_drains_at_checkpoints() -> None:
    assert [needed(t, 1, 6) for t in range(1, 10)] == list(range(0, 9))
    # K = 3, checkpoints every 6: steps 7 and 8 wait for step 6, step 9 uses step 6 too
    assert [needed(t, 3, 6) for t in range(1, 14)] == [0, 0, 0, 1, 2, 3, 6, 6, 6, 7, 8, 9, 12]


@pytest.mark.parametrize("depth", [2, 4])
def test_every_forward_has_exactly_the_documented_staleness(tmp_path: Path, depth: int) -> None:
    parties = _Parties(tmp_path)
    trainer = parties.trainer("staleness", depth)
    trainer.prepare()  # the bottom model is built from the run's fitted preparation
    seen: list[tuple[int, int]] = []
    request = trainer.bottom.request

    def spy(step: int, *args: Any, **kwargs: Any) -> Any:
        seen.append((step, trainer.step))  # the steps applied when step is forwarded
        return request(step, *args, **kwargs)

    trainer.bottom.request = spy  # type: ignore[method-assign]
    trainer.train()
    assert seen == [(t, needed(t, depth, 6)) for t in range(1, STEPS + 1)]
    assert parties.applied(trainer) == list(range(1, STEPS + 1))


def test_a_pipelined_run_is_deterministic_and_differs_from_one_step_at_a_time(
    tmp_path: Path,
) -> None:
    parties = _Parties(tmp_path)
    first, s1 = parties.train("k2-a", 2)
    second, s2 = parties.train("k2-b", 2)
    serial, _ = parties.train("k1", 1)
    assert _bottom(first) == _bottom(second)
    assert s1.last_loss == s2.last_loss
    assert _evaluation(first) == _evaluation(second)
    assert _bottom(first) != _bottom(serial)  # the staleness is real, not a no-op


def test_steps_that_overtake_their_predecessor_are_resent_and_applied_once(
    tmp_path: Path,
) -> None:
    parties = _Parties(tmp_path)
    reference, _ = parties.train("reference", 3)
    trainer = parties.trainer("overtaken", 3)
    assert isinstance(trainer.transport, _Transport)
    trainer.transport.overtaken = set(range(1, STEPS + 1, 2))  # even steps overtake odd ones
    trainer.prepare()
    summary = trainer.train()
    assert summary.resent > 0
    assert summary.rollbacks == 0
    assert parties.applied(trainer) == list(range(1, STEPS + 1))
    assert _bottom(trainer) == _bottom(reference)
    assert _evaluation(trainer) == _evaluation(reference)


@pytest.mark.parametrize("die_at", [9, 14])
def test_party_a_killed_with_steps_in_flight_resumes_bit_identically(
    tmp_path: Path, die_at: int
) -> None:
    parties = _Parties(tmp_path)
    reference, _ = parties.train("reference", 3)
    killed = parties.trainer("killed", 3)
    assert isinstance(killed.transport, _Transport)
    killed.transport.delay = {die_at - 1: 0.05}  # a predecessor still on its way
    killed.transport.die_at = die_at
    killed.prepare()
    with pytest.raises(SystemExit):
        killed.train()
    assert die_at in killed.transport.sent
    killed.close()

    again = parties.trainer("killed", 3)  # a new process on the same state directory
    again.prepare()
    summary = again.train()
    assert summary.last_step == STEPS
    assert parties.applied(again) == list(range(1, STEPS + 1))
    assert _bottom(again) == _bottom(reference)
    assert _evaluation(again) == _evaluation(reference)
    assert threading.active_count() < 20  # sender threads end with their run


def test_an_answer_lost_after_its_successor_applied_rolls_back_and_ends_bit_identical(
    tmp_path: Path,
) -> None:
    parties = _Parties(tmp_path)
    reference, _ = parties.train("reference", 3)
    trainer = parties.trainer("lost", 3)
    assert isinstance(trainer.transport, _Transport)
    trainer.transport.lose = {8, 14}  # one before and one after the checkpoint at step 12
    trainer.prepare()
    summary = trainer.train()
    assert summary.rollbacks == 2
    assert parties.applied(trainer) == list(range(1, STEPS + 1))
    assert _bottom(trainer) == _bottom(reference)
    assert _evaluation(trainer) == _evaluation(reference)
