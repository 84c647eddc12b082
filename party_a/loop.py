"""Party A's step loop, with up to K steps in flight (``[run] pipeline_depth``, K = 1: send a
step, wait for its answer, apply it, as the protocol has always run).

Between two institutions a step mostly waits for the network; with K > 1 party A forwards and
sends step t+1 (up to t+K-1) before step t's gradient is back. The staleness is fixed by the
run's settings, never by timing, so a run is deterministic for a given K:

    the bottom model that forwards step t has applied the gradients of exactly the steps
    <= need(t) = max(t - K, c(t)),  c(t) = the last checkpoint step before t
    (the largest multiple of checkpoint_interval below t, 0 at the start).

The pipeline drains at every checkpoint (step c+1 waits for step c's answer): a checkpoint then
holds the whole state of the run and a resume from it replays bit-identically; the cost is a
refill of K-1 steps every checkpoint_interval steps. K = 1 gives need(t) = t - 1, today's loop.

Each in-flight step's gradient is taken at the weights that forwarded it (weight stashing,
``BottomTrainer.request(stash=True)``) and applied, in step order, to the live weights: the
PipeDream rule, so an answer that arrives after K-1 other updates is still a true gradient.

Party B still applies steps strictly in order, each exactly once. A request that overtakes its
predecessor on the way (separate connections) is held by party B (for at most
``FEDLITE_B_STEP_HOLD_SECONDS``, docs/PROTOCOL.md section 11) until the predecessor's request
is answered, so resends are rare; with the hold off, or still ahead after it, it gets
409 step-out-of-order and changes nothing, and party A resends
it once the predecessor's answer is in (``TrainSummary.resent``). Any other
disagreement drains the pipeline and reconciles as before (``party_a.recovery``); an
answer lost on the way after its successor was applied is such a case (party B keeps only
the last answer), so after a reconciliation requests go one at a time until the next
checkpoint, the forwards keeping their schedule.
"""

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

from party_a.bottom import PendingStep, StepResult
from party_a.errors import BatchMismatch, ProtocolError, StepOutOfOrder

__all__ = ["LoopSettings", "StepPort", "StepRecord", "TrainSummary", "needed", "run_steps"]

log = logging.getLogger("fedlite.party_a")

MAX_STALLS = 3  # reconciliations in a row without a step applied before giving up


@dataclass(frozen=True)
class LoopSettings:
    """The run's settings the loop follows (``[run]`` of party A's config)."""

    steps: int  # the run's last step
    depth: int  # pipeline_depth K: steps in flight
    checkpoint_interval: int


@dataclass(frozen=True)
class StepRecord:
    """One applied step as party A logs it: bytes of the request and its answer, and the
    bytes SplitFed's raw float32 request of the same chunks would have taken."""

    step: int
    loss: float
    bytes_sent: int
    bytes_received: int
    raw_bytes: int
    seconds: float  # from the forward to the update applied


@dataclass
class TrainSummary:
    run_id: str
    steps: int  # steps of the run
    last_step: int  # last step applied
    last_loss: float
    bytes_sent: int  # step request bodies sent (training only, all attempts that counted)
    bytes_received: int
    raw_bytes: int  # what SplitFed's raw float32 requests would have been
    seconds: float
    alignment_bytes: int = 0  # the id exchange before training, both directions
    rollbacks: int = 0
    resent: int = 0  # pipelined requests that overtook their predecessor, sent again
    eval_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def compression(self) -> float:
        return self.raw_bytes / self.bytes_sent if self.bytes_sent else 1.0

    def add(self, record: StepRecord) -> None:
        self.last_step = record.step
        self.last_loss = record.loss
        self.bytes_sent += record.bytes_sent
        self.bytes_received += record.bytes_received
        self.raw_bytes += record.raw_bytes


class StepPort(Protocol):
    """What the loop needs of a run; ``party_a.trainer.PartyATrainer`` is one."""

    @property
    def step(self) -> int:
        """The last step applied to the bottom model."""
        ...

    def forward(self, step: int, *, stash: bool) -> PendingStep:
        """Forward, quantize and encode ``step``'s batch (``stash``: keep the weights)."""
        ...

    def send(self, body: bytes) -> bytes:
        """Party B's answer to one step request."""
        ...

    def apply(self, pending: PendingStep, answer: bytes) -> StepResult:
        """Apply party B's answer: correct the gradient, backward, optimizer step."""
        ...

    def raw_bytes(self, chunk_sizes: tuple[int, ...]) -> int:
        """Bytes of the SplitFed request (raw float32 chunks) with these chunk sizes."""
        ...

    def commit(self, record: StepRecord) -> None:
        """Log the step and checkpoint where the run's interval says (the step is applied)."""
        ...

    def reconcile(self) -> bool:
        """Agree with party B on the step (``party_a.recovery``); True when it rolled back."""
        ...


def needed(step: int, depth: int, checkpoint_interval: int) -> int:
    """The last step whose gradient the bottom model must hold (and no later one) when it
    forwards ``step``: max(step - depth, last checkpoint step before ``step``)."""
    last_checkpoint = (step - 1) // checkpoint_interval * checkpoint_interval
    return max(step - depth, last_checkpoint, 0)


@dataclass
class _InFlight:
    pending: PendingStep
    answer: "Future[bytes] | None"  # None: not sent yet (one request at a time, see _Loop)
    started: float  # perf_counter() before the forward


class _Loop:
    def __init__(
        self,
        port: StepPort,
        settings: LoopSettings,
        summary: TrainSummary,
        pool: ThreadPoolExecutor,
        on_step: Callable[[StepResult, TrainSummary], None] | None,
    ) -> None:
        self.port = port
        self.settings = settings
        self.summary = summary
        self.pool = pool
        self.on_step = on_step
        self.in_flight: deque[_InFlight] = deque()
        # After a reconciliation, until the next checkpoint, requests go one at a time (the
        # forwards keep their schedule, so nothing changes but the speed): with several in
        # flight, an answer lost on the way while its successor is applied cannot be asked
        # for again (party B keeps the last answer only) and costs a rollback each time.
        self.cautious = False

    def run(self) -> None:
        port, run = self.port, self.settings
        next_step = port.step + 1
        stalled = 0
        while port.step < run.steps:
            if next_step <= run.steps and port.step >= needed(
                next_step, run.depth, run.checkpoint_interval
            ):
                self.in_flight.append(self._send(next_step))
                next_step += 1
                continue
            head = self.in_flight.popleft()
            try:
                response = self._answer(head)
            except StepOutOfOrder as exc:
                self._drain()
                stalled += 1
                if stalled > MAX_STALLS:
                    raise ProtocolError(f"cannot agree with party B on the step: {exc}") from None
                log.warning("party B is elsewhere (%s); reconciling", exc.detail)
                _reconcile(port, self.summary)
                next_step = port.step + 1
                self.cautious = run.depth > 1
                continue
            except BatchMismatch as exc:
                self._drain()
                raise ProtocolError(
                    f"the parties disagree on step {head.pending.step}'s batch: {exc}"
                ) from None
            except BaseException:
                self._drain()
                raise
            stalled = 0
            self._applied(head, port.apply(head.pending, response))
            if port.step % run.checkpoint_interval == 0:
                self.cautious = False

    def _applied(self, head: _InFlight, result: StepResult) -> None:
        pending = head.pending
        record = StepRecord(
            step=pending.step,
            loss=result.loss,
            bytes_sent=len(pending.body),
            bytes_received=result.bytes_received,
            raw_bytes=self.port.raw_bytes(pending.chunk_sizes),
            seconds=time.perf_counter() - head.started,
        )
        self.port.commit(record)
        self.summary.add(record)
        if self.on_step is not None:
            self.on_step(result, self.summary)

    def _send(self, step: int) -> _InFlight:
        """Forward and encode ``step`` here (the model is touched by this thread only) and,
        with several in flight, hand its request to a sender thread."""
        started = time.perf_counter()
        pending = self.port.forward(step, stash=self.settings.depth > 1)
        # One step in flight (K = 1) is sent from this thread, when its answer is asked for:
        # nothing overlaps it, and a hand-off to a sender thread and back cost two wake-ups
        # per step (milliseconds on a loaded machine; docs/PERFORMANCE.md, "The floor")
        alone = self.cautious or self.settings.depth == 1
        answer = None if alone else self.pool.submit(self.port.send, pending.body)
        return _InFlight(pending, answer, started)

    def _answer(self, head: _InFlight) -> bytes:
        """The oldest step's answer; a request that overtook its predecessor is sent again
        (its predecessor has been answered by now, so party B expects it)."""
        if head.answer is None:
            return self.port.send(head.pending.body)
        try:
            return head.answer.result()
        except StepOutOfOrder as exc:
            if exc.applied_step >= head.pending.step - 1 or self.settings.depth == 1:
                raise  # party B is not behind this step: a real disagreement
        self.summary.resent += 1
        return self.port.send(head.pending.body)

    def _drain(self) -> None:
        """Wait out (and drop) every step still in flight: none may land after a resume."""
        wait([f.answer for f in self.in_flight if f.answer is not None])
        self.in_flight.clear()


def _reconcile(port: StepPort, summary: TrainSummary) -> None:
    if port.reconcile():
        summary.rollbacks += 1
    summary.last_step = port.step


def run_steps(
    port: StepPort,
    settings: LoopSettings,
    summary: TrainSummary,
    on_step: Callable[[StepResult, TrainSummary], None] | None = None,
) -> None:
    """Reconcile with party B, then run the remaining steps, up to ``settings.depth`` in
    flight; ``summary`` collects them and ``on_step`` sees each applied step."""
    _reconcile(port, summary)
    with ThreadPoolExecutor(max_workers=settings.depth, thread_name_prefix="fedlite-step") as pool:
        _Loop(port, settings, summary, pool, on_step).run()
