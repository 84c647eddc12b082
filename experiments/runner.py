"""One training run through the product's own two parties, recorded as a JSON-able dict.

Party A is ``party_a.trainer.PartyATrainer`` with its local SQLite store; party B is
``party_b.service.Service`` on its own SQLite file, reached either in-process
(``party_b.inprocess.InProcessTransport``) or over real HTTP (``fedlite-b serve`` in a
subprocess, ``party_a.transport.http.HttpTransport``). No step is re-implemented here: this module
only builds the config, evaluates every ``eval_every`` steps and counts bits.

A run is described by a flat dict (see ``RunConfig``), stored verbatim with its results.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.tasks import TASK_ENV, TaskData, load_task
from party_a.bottom import StepResult
from party_a.config import load_config
from party_a.errors import problem_from_body
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer, TrainSummary
from party_a.transport import Transport
from party_a.transport.http import HttpTransport
from party_b.device import use_device
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.ops.launch import child_process, free_port, wait_until_healthy
from party_b.settings import Limits
from party_b.store import sole
from shared.accounting import PAPER_PHI, paper_message_bits, pq_step_request_bytes
from shared.devices import describe, resolve_device
from shared.models import build_bottom, cut_dim

__all__ = ["RunConfig", "run_split", "bottom_parameters", "paper_uplink_bits"]

HTTP_TOKEN = "experiments-http-token-0123456789"

# Whole evaluation sets travel in one request (Shakespeare's held-out 5 % is ~32,000 token
# rows); the HTTP party B of the spot checks gets the same limits through its environment.
EXPERIMENT_LIMITS = Limits(max_batch=1 << 20, max_aligned_ids=1 << 24)


_SHORT = {"initial_accumulator": "acc"}  # optimizer option names in run keys


@dataclass(frozen=True)
class RunConfig:
    """One split-learning run (FedLite or SplitFed) of one task."""

    task: str  # experiments.tasks name
    method: str  # "fedlite" (PQ + correction) or "splitfed" (raw activations)
    steps: int
    batch_size: int  # rows per client per step ('clients' schedule) or per step
    lr_bottom: float
    lr_top: float
    optimizer: str  # "sgd", "adagrad" or "adam", both parties
    seed: int = 0
    q: int | None = None
    L: int | None = None
    R: int = 1
    lam: float = 0.0  # gradient correction lambda (party A)
    clients_per_step: int | None = None  # None = the shuffled single-chunk schedule
    eval_fraction: float = 0.1
    eval_every: int = 100
    kmeans_iterations: int = 10
    use_side_features: bool = True
    task_options: dict[str, Any] = field(default_factory=dict)
    # extra OptimizerSpec fields, both parties: FedJAX's AdaGrad is
    # {"initial_accumulator": 0.1, "eps": 1e-6} (FEDJAX_ADAGRAD in experiments.sweeps)
    optimizer_options: dict[str, Any] = field(default_factory=dict)
    transport: str = "inprocess"  # or "http"
    save_bottom: bool = False  # keep party A's trained bottom (<key>.bottom.pt) for Fig. 2
    eval_raw: bool = False  # also evaluate on unquantized activations (eval_raw_* fields)
    downlink: str | None = None  # party B's gradient representation (None: float32)
    codebook_dtype: str = "float32"  # uplink codebooks on the wire ("float16" halves them)
    codewords: str = "packed"  # uplink codewords: "packed", or "ans" (rANS where smaller)
    pipeline_depth: int = 1  # party A's steps in flight (party_a.loop)
    # where both parties compute ("cpu", "cuda", "auto"): how the run is executed, not what it
    # is, so it is not in the key (the record says which device ran it, "device")
    device: str = "cpu"

    @property
    def key(self) -> str:
        """A readable file name that identifies the run within its sweep."""
        parts = [self.task, self.method]
        if self.method == "fedlite":
            parts += [f"q{self.q}", f"L{self.L}", f"R{self.R}", f"lam{self.lam:g}"]
        parts.append(f"lr{self.lr_bottom:.3g}")
        if self.optimizer_options:  # e.g. "adagrad-acc0.1-eps1e-06"
            opts = "-".join(
                f"{_SHORT.get(k, k)}{v:g}" for k, v in sorted(self.optimizer_options.items())
            )
            parts.append(f"{self.optimizer}-{opts}")
        parts += [f"s{self.seed}", f"T{self.steps}"]
        if self.downlink is not None:
            parts.append("dl-" + self.downlink.replace(":", "-").replace(",", "-"))
        if self.codebook_dtype != "float32":
            parts.append(f"cb-{self.codebook_dtype}")
        if self.codewords != "packed":
            parts.append(f"cw-{self.codewords}")
        if self.eval_raw:
            parts.append("evalraw")
        if self.pipeline_depth > 1:
            parts.append(f"K{self.pipeline_depth}")
        if self.transport != "inprocess":
            parts.append(self.transport)
        return "-".join(parts)

    def party_a_config(self, task: TaskData) -> dict[str, Any]:
        """Dotted overrides for ``party_a.config.load_config``."""
        optimizer: dict[str, Any] = {"name": self.optimizer, **self.optimizer_options}
        overrides: dict[str, Any] = {
            "run.name": self.key,
            "run.model": task.model,
            "run.steps": self.steps,
            "run.batch_size": self.batch_size,
            "run.seed": self.seed,
            "run.checkpoint_interval": self.steps,  # one checkpoint, at the end
            "run.eval_fraction": self.eval_fraction,
            "run.use_side_features": self.use_side_features,
            "run.pipeline_depth": self.pipeline_depth,
            "run.device": self.device,
            "model.bottom": task.bottom,
            "model.top": task.top,
            "optimizer.bottom": {**optimizer, "lr": self.lr_bottom},
            "optimizer.top": {**optimizer, "lr": self.lr_top},
        }
        # The paper's methods send float32 gradients back: pinned, whatever the product's
        # default for new runs is, so that the sweeps keep measuring what they measured.
        overrides["run.downlink"] = self.downlink or "float32"
        if self.clients_per_step is not None:
            overrides["run.schedule"] = {
                "kind": "clients",
                "clients_per_step": self.clients_per_step,
            }
        if self.method == "fedlite":
            overrides.update(
                {
                    "quantizer.mode": "pq",
                    "quantizer.q": self.q,
                    "quantizer.L": self.L,
                    "quantizer.R": self.R,
                    "quantizer.lambda": self.lam,
                    "quantizer.iterations": self.kmeans_iterations,
                    "quantizer.codebook_dtype": self.codebook_dtype,
                    "quantizer.codewords": self.codewords,
                }
            )
        elif self.method == "splitfed":
            overrides["quantizer.mode"] = "raw"
        else:
            raise ValueError(f"run_split runs fedlite or splitfed, not {self.method!r}")
        return overrides


def bottom_parameters(task: TaskData) -> int:
    """Trainable parameters of party A's bottom model (the paper's |w_c|)."""
    model = build_bottom(task.model, **task.bottom)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def paper_uplink_bits(
    config: RunConfig, d: int, chunk_sizes: tuple[int, ...], client_model_params: int
) -> tuple[float, float, float]:
    """The paper's uplink bits of one step, phi = 64: (activation message, same for SplitFed,
    client-model synchronisation). Each chunk is one client's message; every client of the
    step also uploads its client-model gradient (SplitFed step 4), |w_c| floats."""
    message = raw = 0.0
    for b in chunk_sizes:
        if config.method == "fedlite":
            assert config.q is not None and config.L is not None
            size = paper_message_bits(d=d, batch=b, q=config.q, L=config.L, R=config.R)
            message += size.total_bits
            raw += size.raw_bits
        else:
            message += PAPER_PHI * d * b
            raw += PAPER_PHI * d * b
    sync = float(len(chunk_sizes) * client_model_params * PAPER_PHI)
    return message, raw, sync


# ---------------------------------------------------------------------------------------------
# Party B: in-process, or fedlite-b serve in a subprocess
# ---------------------------------------------------------------------------------------------


@contextmanager
def http_party_b(config: RunConfig, workdir: Path) -> Iterator[str]:
    """``fedlite-b serve --label-source experiments.tasks:label_source_from_env`` on a free
    port, one torch thread (so its arithmetic matches the in-process run); yields its URL."""
    port = free_port()
    env = {
        **os.environ,
        TASK_ENV: json.dumps({"task": config.task, "options": config.task_options}),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "FEDLITE_B_LIMIT_MAX_BATCH": str(EXPERIMENT_LIMITS.max_batch),
        "FEDLITE_B_LIMIT_MAX_ALIGNED_IDS": str(EXPERIMENT_LIMITS.max_aligned_ids),
    }
    cmd = [
        sys.executable, "-m", "party_b.ops.cli", "serve",
        "--port", str(port),
        "--data-dir", str(workdir / "party_b"),
        "--label-source", "experiments.tasks:label_source_from_env",
        "--tokens", f"experiments:{HTTP_TOKEN}",
        "--torch-threads", "1",
        "--worker-threads", "1",
        "--device", config.device,
        "--log-level", "warning",
        # the experiments measure the protocol undefended, as the in-process party B runs it
        # (docs/PRIVACY.md measures the privacy policies)
        "--privacy", "off",
    ]  # fmt: skip
    log_path = workdir / "party_b.log"
    url = f"http://127.0.0.1:{port}"
    with child_process(cmd, log_path, env=env) as proc:
        wait_until_healthy(url, proc, log_path=log_path, timeout=120, poll_seconds=0.2)
        yield url


@contextmanager
def _transport(config: RunConfig, task: TaskData, workdir: Path) -> Iterator[tuple[Transport, str]]:
    if config.transport == "inprocess":
        use_device(config.device)  # party B's device is its process's: here, this one
        database = workdir / "party_b.sqlite"
        service, caller = in_process_party_b(task.labels, database, limits=EXPERIMENT_LIMITS)
        try:
            yield InProcessTransport(service, caller, problem=problem_from_body), "in-process"
        finally:
            sole.release(f"sqlite:///{database}")  # a sweep runs many runs in one process
    elif config.transport == "http":
        with http_party_b(config, workdir) as url, HttpTransport(url, HTTP_TOKEN) as transport:
            yield transport, url
    else:
        raise ValueError(f"unknown transport {config.transport!r}")


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------


def run_split(
    config: RunConfig,
    workdir: Path | None = None,
    artifacts: Path | None = None,
    progress: Path | None = None,
    deadline: float | None = None,
    on_step: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Train one FedLite / SplitFed run end to end; returns the record (config + results).

    With ``config.save_bottom``, party A's trained bottom model is saved to
    ``artifacts/<key>.bottom.pt`` (a plain state dict). With ``progress``, the record as it
    stands (``"partial": true``, the curve so far) is written there, atomically, after every
    evaluation: what a run cut short leaves of itself. ``on_step(step)`` is called after every
    step (timing, fault injection).

    ``deadline`` (``time.time()`` seconds): the run ends at the last evaluation from which
    another evaluation interval would pass it, and its record is the record of a run of that
    many steps (key and config say so, ``cut_from`` names the configured run): nothing in a
    run depends on its length (tests/test_experiments.py), so its first S steps are a run of
    S steps.

    ``curve`` holds one row per evaluation: step, the held-out metrics (party B computes
    them), cumulative uplink bits in the paper's accounting and measured request bytes.
    """
    task = load_task(config.task, **config.task_options)
    own_dir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="fedlite-exp-")) if workdir is None else workdir
    workdir.mkdir(parents=True, exist_ok=True)
    party_a = load_config(None, config.party_a_config(task))
    run = _Recorder(config, task)
    per_sample = int(task.labels.targets(np.arange(1)).shape[0])  # T rows per sequence
    try:
        with _transport(config, task, workdir) as (transport, server):
            trainer = PartyATrainer(
                config=party_a,
                features=task.features,
                transport=transport,
                store=LocalStore.in_directory(workdir / "party_a"),
                server=server,
            )

            def after_step(result: StepResult, summary: TrainSummary) -> None:
                if on_step is not None:  # before any evaluation: step timings leave it out
                    on_step(result.step)
                sizes = tuple(per_sample * b for b in trainer.batch(result.step).chunk_sizes)
                run.count(result, sizes)
                if result.step % config.eval_every == 0 or result.step == config.steps:
                    run.evaluate(trainer, result.step, summary)
                    if progress is not None:
                        _write_atomically(progress, {**run.record(summary), "partial": True})
                    if deadline is not None and run.out_of_time(deadline, config.steps):
                        raise _Deadline(summary)

            trainer.on_step = after_step
            try:
                trainer.prepare()
                try:
                    summary = trainer.train()
                    trainer.finish()
                except _Deadline as cut:
                    return run.cut(cut.summary)
                if config.save_bottom and artifacts is not None:
                    state = trainer.bottom.model.state_dict()
                    if trainer.bottom.device.type != "cpu":  # readable without a GPU
                        state = type(state)((k, v.cpu()) for k, v in state.items())
                    torch.save(state, artifacts / f"{config.key}.bottom.pt")
            finally:
                trainer.close()
    finally:
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    return run.record(summary)


class _Deadline(Exception):  # noqa: N818 - control flow, not an error
    """Raised from the step hook when the run's deadline is too close for another interval."""

    def __init__(self, summary: TrainSummary) -> None:
        super().__init__("deadline")
        self.summary = summary


class _Recorder:
    """What a run records as it goes: bit counts per step, one curve row per evaluation."""

    def __init__(self, config: RunConfig, task: TaskData) -> None:
        self.config = config
        self.task = task
        self.d = cut_dim(task.model, **task.bottom)
        self.w_c = bottom_parameters(task)
        self.curve: list[dict[str, Any]] = []
        self.totals = {"message": 0.0, "raw": 0.0, "sync": 0.0, "steps": 0, "rows": 0}
        self.losses: list[float] = []
        self.device = describe(resolve_device(config.device))
        self.started = time.perf_counter()

    def count(self, result: StepResult, sizes: tuple[int, ...]) -> None:
        """Step ``result``'s uplink in the paper's accounting; ``sizes``: its chunks' rows."""
        message, raw, sync = paper_uplink_bits(self.config, self.d, sizes, self.w_c)
        self.totals["message"] += message
        self.totals["raw"] += raw
        self.totals["sync"] += sync
        self.totals["steps"] += 1
        self.totals["rows"] += sum(sizes)
        self.losses.append(result.loss)

    def evaluate(self, trainer: PartyATrainer, step: int, summary: TrainSummary) -> None:
        answer = trainer.evaluate()
        raw: dict[str, Any] = {}
        if self.config.eval_raw:  # the same model, its activations sent unquantized
            unquantized = trainer.evaluate(raw=True)
            raw = {
                "eval_raw_loss": unquantized.loss,
                **{f"eval_raw_{k}": v for k, v in unquantized.metrics.items()},
            }
        self.curve.append(
            {
                "step": step,
                "train_loss": float(np.mean(self.losses)) if self.losses else None,
                "eval_loss": answer.loss,
                "eval_n": answer.n,
                **{f"eval_{k}": v for k, v in answer.metrics.items()},
                **raw,
                "paper_message_bits": self.totals["message"],
                "paper_raw_bits": self.totals["raw"],
                "paper_sync_bits": self.totals["sync"],
                "wire_bytes": summary.bytes_sent,
                "wire_raw_bytes": summary.raw_bytes,
                "seconds": time.perf_counter() - self.started,
            }
        )
        self.losses.clear()

    def out_of_time(self, deadline: float, steps: int) -> bool:
        """Whether another evaluation interval (as long as the last one) would pass
        ``deadline``, with steps still to go."""
        if self.curve[-1]["step"] >= steps:
            return False
        before = self.curve[-2]["seconds"] if len(self.curve) > 1 else 0.0
        return time.time() + float(self.curve[-1]["seconds"] - before) >= deadline

    def cut(self, summary: TrainSummary) -> dict[str, Any]:
        """The record of this run cut at its last evaluation: a run of that many steps."""
        nominal = self.config
        self.config = replace(nominal, steps=self.curve[-1]["step"])
        return {**self.record(summary), "cut_from": nominal.key, "nominal_steps": nominal.steps}

    def record(self, summary: TrainSummary) -> dict[str, Any]:
        """The run's record: its config, curve, final metrics and traffic, as of now."""
        config, totals = self.config, self.totals
        record: dict[str, Any] = {
            "key": config.key,
            "config": asdict(config),
            "lambda_units": "paper",  # shared.correction: per client batch-mean
            "task_notes": self.task.notes,
            "cut_dim": self.d,
            "client_model_params": self.w_c,
            "final": {k: v for k, v in self.curve[-1].items() if k.startswith("eval_")},
            "curve": self.curve,
            "steps": summary.last_step,
            "rows_per_step": totals["rows"] / max(totals["steps"], 1),
            "paper_ratio": totals["raw"] / totals["message"] if totals["message"] else 1.0,
            "wire_ratio": summary.compression,
            "wire_bytes": summary.bytes_sent,
            "wire_raw_bytes": summary.raw_bytes,
            "wire_bytes_received": summary.bytes_received,
            "seconds": time.perf_counter() - self.started,
            "device": self.device,
        }
        if config.method == "fedlite" and config.clients_per_step is None:
            assert config.q is not None and config.L is not None
            record["wire_step_bytes"] = pq_step_request_bytes(
                d=self.d, batch=config.batch_size, q=config.q, L=config.L, R=config.R
            )
        return record


def _write_atomically(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=float))
    tmp.replace(path)
