"""What the floor benchmark times besides the product's steps: each party's bare floor, and
where the product's step spends its time.

The floors are the work a step cannot do without, written with nothing around it:

- party B, (a): bare torch's forward + backward (down to d loss / d z~, which party A needs)
  + optimizer step of a copy of the run's own top model, on a batch of the run's shape;
- party B, (b): one durable commit of one step-log row, through the DB-API alone (``sqlite3``)
  on a database with party B's schema and connection settings (WAL, ``synchronous=NORMAL``);
- party A: a copy of the run's bottom model forward, the product's quantizer (encode, and
  the z~ the correction needs), backward of a gradient through it, optimizer step.

``Parts`` wraps the product's own functions (by module attribute, so the product's code runs
unchanged) to say where a step's time goes: self time per part, nested calls subtracted.
"""

import copy
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import import_module
from pathlib import Path
from typing import Any

import numpy as np
import torch

from party_a.trainer import PartyATrainer
from party_b.service import Service
from party_b.store import ApiToken, Run, make_engine, make_session_factory
from shared.pq import GroupedProductQuantizer, PQConfig
from shared.training import make_optimizer

__all__ = [
    "A_PARTS",
    "B_PARTS",
    "Parts",
    "bare_bottom",
    "bare_top",
    "commit_floor",
    "fixed_threads",
    "summary",
    "thread_cpu",
]

# (module, class or None, attribute, part): where the product's step is timed
B_PARTS = [
    ("party_b.service.steps", "Steps", "step", "service"),
    ("party_b.service.activations", None, "decode", "decode"),
    ("party_b.service.activations", None, "dequantize", "decode"),
    ("party_b.service.steps", None, "protected_step", "top_step"),
    ("party_b.top", "TopTrainer", "apply_step", "top_step"),
    ("party_b.service.answer", None, "step_response", "downlink_encode"),
    ("party_b.service.steps", "Steps", "_record", "store_commit"),
]
A_PARTS = [
    ("party_a.bottom", "BottomTrainer", "request", "bottom_forward"),
    ("party_a.bottom", "BottomTrainer", "_compress", "quantize"),
    ("shared.codec", None, "encode_step_request", "encode_request"),
    ("party_a.bottom", "BottomTrainer", "apply", "backward_opt"),
    ("shared.codec", None, "decode_step_response", "decode_response"),
    ("party_a.trainer", "PartyATrainer", "commit", "local_store"),
]


class Parts:
    """Self time per part of the wrapped calls, per thread's call stack, until ``take``."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self.missing: list[str] = []  # wrapped names this version of the product lacks

    def install(self, spec: list[tuple[str, str | None, str, str]]) -> None:
        for module_name, owner_name, attr, part in spec:
            owner: Any = import_module(module_name)
            if owner_name is not None:
                owner = getattr(owner, owner_name)
            if not hasattr(owner, attr):
                self.missing.append(f"{module_name}.{owner_name or ''}.{attr}")
                continue
            setattr(owner, attr, self._wrap(getattr(owner, attr), part))

    def _wrap(self, fn: Callable[..., Any], part: str) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                children = stack.pop()
                if stack:
                    stack[-1] += elapsed
                with self._lock:
                    self._totals[part] = self._totals.get(part, 0.0) + elapsed - children

        return wrapped

    def take(self) -> dict[str, float]:
        """The self seconds per part since the last ``take``."""
        with self._lock:
            out, self._totals = self._totals, {}
        return out


@contextmanager
def fixed_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads at ``n`` in this thread for the block, then as they were."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def bare_top(service: Service, run_id: str) -> Callable[[], None]:
    """Party B's floor (a) for the run: one call is one bare training step of a copy of its
    top model and optimizer on a batch of its shape (random z~, its real labels)."""
    state = service.context.cache.peek(run_id)
    assert state is not None, "train the run first"
    labels = service.context.labels
    model = copy.deepcopy(state.trainer.model).train()
    optimizer = make_optimizer(model.parameters(), state.config.optimizer.model_dump())
    rows = state.label_rows[state.batch(1).positions]
    targets = labels.targets(rows)
    side = labels.side(rows) if model.side_features else None
    cut_dim = state.config.cut_dim
    assert cut_dim is not None, "a run with one feature party"
    z = torch.randn(len(rows) * state.rows_per_sample, cut_dim)

    def step() -> None:
        z_tilde = z.detach().requires_grad_(True)  # party A needs d loss / d z~
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(z_tilde, side), targets)
        torch.autograd.backward(loss)
        optimizer.step()

    return step


def bare_bottom(trainer: PartyATrainer) -> Callable[[int], dict[str, float]]:
    """Party A's floor for the run: one call (with the step, the k-means seed) is a bare
    forward of a copy of its bottom model on a batch of its shape, the product's quantizer,
    backward of a corrected gradient and the optimizer step; returns seconds per part."""
    assert trainer.data is not None, "prepare the trainer first"
    config = trainer.config
    model = copy.deepcopy(trainer.bottom.model).train()
    optimizer = make_optimizer(model.parameters(), config.optimizer.bottom.model_dump())
    x = torch.from_numpy(
        np.ascontiguousarray(trainer.data.inputs(trainer.batch(1).positions))
    ).float()
    spec = config.quantizer
    pq = None
    if spec.mode == "pq":
        assert spec.q is not None and spec.L is not None
        pq = GroupedProductQuantizer(
            trainer.cut_dim, PQConfig(q=spec.q, L=spec.L, R=spec.R, iterations=spec.iterations)
        )
    with torch.no_grad():
        g = 1e-3 * torch.randn_like(model(x))
    lam = spec.lambda_

    def step(t: int) -> dict[str, float]:
        marks = [time.perf_counter()]
        z = model(x)
        marks.append(time.perf_counter())
        z_tilde = z.detach()
        if pq is not None:
            z_tilde = pq.decode(pq.encode(z.detach(), seed=t))
        marks.append(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(z, g + lam * (z.detach() - z_tilde))
        optimizer.step()
        marks.append(time.perf_counter())
        names = ("bottom_forward", "quantize", "backward_opt")
        return {n: b - a for n, a, b in zip(names, marks[:-1], marks[1:], strict=True)}

    return step


def commit_floor(path: Path) -> Callable[[], None]:
    """Party B's floor (b): one call inserts one step-log row and commits it, through
    ``sqlite3`` alone, on a new database at ``path`` with party B's schema and pragmas."""
    engine = make_engine(f"sqlite:///{path}")  # the schema (keys, indexes) and pragmas
    with make_session_factory(engine)() as session:
        session.add(ApiToken(id=1, name="floor", token_sha256="0" * 64))
        session.add(
            Run(
                id="floor",
                owner_id=1,
                name="floor",
                status="training",
                config={},
                alignment_key="0" * 64,
                num_classes=2,
                side_features=0,
            )
        )
        session.commit()
    engine.dispose()
    connection = sqlite3.connect(path, timeout=30, check_same_thread=False)
    for pragma in ("journal_mode=WAL", "busy_timeout=30000", "foreign_keys=ON"):
        connection.execute(f"PRAGMA {pragma}")
    connection.execute("PRAGMA synchronous=NORMAL")
    step = iter(range(1, 1 << 62))
    insert = (
        "INSERT INTO step_log (run_id, step, loss, accuracy, bytes_in, bytes_out, decode_ms, "
        "compute_ms, total_ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )

    def commit() -> None:
        now = datetime.now(UTC).isoformat(sep=" ")
        connection.execute(insert, ("floor", next(step), 0.5, 0.5, 201, 730, 0.1, 0.5, 1.0, now))
        connection.commit()

    return commit


def thread_cpu(pid: int) -> dict[str, float] | None:
    """CPU seconds process ``pid``'s threads have run so far: its main thread's (uvicorn's
    event loop, in ``fedlite-b serve``) as ``event_loop``, every other thread's (the worker
    threads a step's work runs in) as ``workers``. From Linux's ``/proc/PID/task/*/schedstat``
    (nanoseconds; the ``stat`` ticks are 10 ms, coarser than a block of steps); None where
    there is no such file. A thread that ended between two readings takes its time with it,
    which the product's long-lived workers do not."""
    tasks = Path(f"/proc/{pid}/task")
    if not (tasks / str(pid) / "schedstat").exists():
        return None
    out = {"event_loop": 0.0, "workers": 0.0}
    for task in tasks.iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended while the directory was read
        out["event_loop" if task.name == str(pid) else "workers"] += ns / 1e9
    return out


def summary(seconds: list[float]) -> dict[str, float]:
    """Median, quartiles, mean (ms) and count of a list of seconds."""
    ms = sorted(1000 * s for s in seconds)
    if not ms:
        return {"median_ms": float("nan"), "p25_ms": float("nan"), "p75_ms": float("nan"), "n": 0}
    q = statistics.quantiles(ms, n=4) if len(ms) >= 2 else [ms[0]] * 3
    return {
        "median_ms": statistics.median(ms),
        "p25_ms": q[0],
        "p75_ms": q[2],
        "mean_ms": statistics.fmean(ms),
        "n": len(ms),
    }
