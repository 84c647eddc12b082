"""The tasks of the floor benchmark and the product's two parties on them.

Each task is a run as a user would configure it: party A's config (the demo's
``examples/breast.toml`` for breast), its features and party B's labels from
``experiments.tasks`` (the data sets under ``../shared/data``). ``Session`` is one such run
trained by the product's own party A (``PartyATrainer`` driven by ``party_a.loop.run_steps``)
against party B in this process (``InProcessTransport``) or behind ``fedlite-b serve`` on
127.0.0.1 (``HttpTransport``), with the time of every step and of its round trip recorded.
"""

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT
from experiments.tasks import TASK_ENV, TaskData, load_task
from party_a.bottom import StepResult
from party_a.config import PartyAConfig, load_config
from party_a.errors import problem_from_body
from party_a.loop import LoopSettings, run_steps
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer, TrainSummary
from party_a.transport.http import HttpTransport
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.ops.launch import child_process, free_port, wait_until_healthy
from party_b.service import Service

__all__ = [
    "TASKS",
    "FloorTask",
    "ServedPartyB",
    "Session",
    "StepTimes",
    "http_party_b",
    "http_session",
    "in_process_session",
    "party_a_config",
]

TOKEN = "floor-benchmark-token-0123456789"
FOREVER = 10**6  # the runs' steps: never reached, so no run finishes while it is measured


@dataclass(frozen=True)
class FloorTask:
    """One task: which data (``experiments.tasks``) and party A's run config for it."""

    name: str
    config_file: Path | None  # a TOML config of the product, or None: ``overrides`` alone
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted keys (party_a.config)
    note: str = ""


TASKS = {
    t.name: t
    for t in [
        FloorTask(
            "breast",
            ROOT / "examples" / "breast.toml",
            note="the demo run: B=32, tabular MLP 20->64->32 | [32+10]->32->2, q=8 L=4, Adam",
        ),
        FloorTask(
            "default_credit",
            None,
            {
                "run.model": "tabular_mlp",
                "run.batch_size": 256,
                "run.checkpoint_interval": 50,
                "model.bottom": {"hidden": [64], "cut_dim": 32},
                "model.top": {"hidden": [32]},
                "quantizer": {"mode": "pq", "q": 8, "L": 16, "R": 1, "lambda": 0.0},
                "optimizer.bottom": {"name": "adam", "lr": 0.003},
                "optimizer.top": {"name": "adam", "lr": 0.003},
            },
            note="FATE default_credit: B=256, the same MLP on 13+10 columns, q=8 L=16, Adam",
        ),
        FloorTask(
            "femnist",
            None,
            {
                "run.model": "femnist_cnn",
                "run.batch_size": 20,
                "run.checkpoint_interval": 50,
                "run.use_side_features": False,
                "quantizer": {"mode": "pq", "q": 1152, "L": 2, "R": 1, "lambda": 1e-4},
                "optimizer.bottom": {"name": "sgd", "lr": 0.01},
                "optimizer.top": {"name": "sgd", "lr": 0.01},
            },
            note="FEMNIST CNN at the paper's point: B=20, d=9216, q=1152 L=2, SGD",
        ),
    ]
}


def party_a_config(task: FloorTask, name: str) -> PartyAConfig:
    """Party A's config of ``task``, as run ``name``, long enough never to finish."""
    overrides = {"run.name": name, "run.steps": FOREVER, **task.overrides}
    if task.config_file is None:
        overrides.setdefault("run.seed", 0)
    return load_config(task.config_file, overrides)


@dataclass(frozen=True)
class ServedPartyB:
    """A ``fedlite-b serve`` process: where it answers, and its process id (whose threads'
    CPU time ``measure.thread_cpu`` reads)."""

    url: str
    pid: int


@contextmanager
def http_party_b(task: str, workdir: Path) -> Iterator[ServedPartyB]:
    """``fedlite-b serve`` for ``task``'s labels on a free 127.0.0.1 port with the product's
    defaults (threads, workers, SQLite in WAL mode); yields its URL and process id."""
    port = free_port()
    env = {**os.environ, TASK_ENV: json.dumps({"task": task, "options": {}})}
    cmd = [
        sys.executable, "-m", "party_b.ops.cli", "serve",
        "--port", str(port),
        "--data-dir", str(workdir / f"party_b-{task}"),
        "--label-source", "experiments.tasks:label_source_from_env",
        "--tokens", f"floor:{TOKEN}",
        "--log-level", "warning",
    ]  # fmt: skip
    log_path = workdir / f"party_b-{task}.log"
    url = f"http://127.0.0.1:{port}"
    with child_process(cmd, log_path, env=env, cwd=ROOT) as proc:
        wait_until_healthy(url, proc, log_path=log_path, timeout=180, poll_seconds=0.2)
        yield ServedPartyB(url, proc.pid)


@dataclass
class StepTimes:
    """Per applied step: party A's time (seconds, from the previous applied step's end to
    this one's, minus the round trip) and the round trip (``transport.step``)."""

    party_a: list[float] = field(default_factory=list)
    round_trip: list[float] = field(default_factory=list)
    parts: list[dict[str, float]] = field(default_factory=list)  # self seconds per part


class Session:
    """One run of a task, trained by the product's party A against one party B."""

    def __init__(
        self,
        task: FloorTask,
        data: TaskData,
        transport: Any,
        workdir: Path,
        parts: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        """``parts``: what each step's time went to (``measure.Parts.take``)."""
        self.task = task
        self._take_parts = parts or dict
        self.transport = transport
        name = f"floor-{task.name}-{type(transport).__name__}"
        self.config = party_a_config(task, name)
        self.trainer = PartyATrainer(
            config=self.config,
            features=data.features,
            transport=transport,
            store=LocalStore.in_directory(workdir / name),
            server=name,
        )
        self._round_trips: list[float] = []
        self._marks: list[float] = []
        self._parts: list[dict[str, float]] = []
        send = transport.step

        def timed_step(run_id: str, body: bytes) -> bytes:
            start = time.perf_counter()
            try:
                return send(run_id, body)  # type: ignore[no-any-return]
            finally:
                self._round_trips.append(time.perf_counter() - start)

        transport.step = timed_step  # party A's trainer calls transport.step: time it there
        self.trainer.on_step = self._applied
        self.trainer.prepare()

    @property
    def run_id(self) -> str:
        return self.trainer.run_id

    def _applied(self, _result: StepResult, _summary: TrainSummary) -> None:
        self._marks.append(time.perf_counter())
        self._parts.append(self._take_parts())

    def block(self, steps: int) -> StepTimes:
        """Train ``steps`` more steps with the product's loop (one in flight, the run's
        checkpoints); the first step of the block is not timed (the loop reconciles first)."""
        self._round_trips.clear()
        self._marks.clear()
        self._parts.clear()
        self._take_parts()
        run = self.config.run
        settings = LoopSettings(self.trainer.step + steps, 1, run.checkpoint_interval)
        summary = TrainSummary(self.run_id, run.steps, self.trainer.step, 0.0, 0, 0, 0, 0.0)
        run_steps(self.trainer, settings, summary, self.trainer.on_step)
        out = StepTimes()
        for i in range(1, len(self._marks)):
            rtt = self._round_trips[i]
            out.party_a.append(self._marks[i] - self._marks[i - 1] - rtt)
            out.round_trip.append(rtt)
            out.parts.append(self._parts[i])
        return out

    def close(self) -> None:
        self.trainer.close()


def in_process_session(
    task: FloorTask, workdir: Path, parts: Callable[[], dict[str, float]] | None = None
) -> tuple[Session, Service]:
    """The task's run against party B's service in this process (its own SQLite file)."""
    data = load_task(task.name)
    service, caller = in_process_party_b(data.labels, workdir / f"inprocess-{task.name}.sqlite")
    transport = InProcessTransport(service, caller, problem=problem_from_body)
    return Session(task, data, transport, workdir, parts), service


def http_session(
    task: FloorTask, url: str, workdir: Path, parts: Callable[[], dict[str, float]] | None = None
) -> Session:
    """The task's run against the party B at ``url``."""
    return Session(task, load_task(task.name), HttpTransport(url, TOKEN), workdir, parts)
