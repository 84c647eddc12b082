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
disagreement drains the pipeline and reconciles as before (``PartyATrainer._reconcile``); an
answer lost on the way after its successor was applied is such a case (party B keeps only
the last answer), so after a reconciliation requests go one at a time until the next
checkpoint, the forwards keeping their schedule.
"""

import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from party_a.bottom import PendingStep
from party_a.errors import BatchMismatch, ProtocolError, StepOutOfOrder
from shared.schedule import batch_digest

if TYPE_CHECKING:
    from party_a.trainer import PartyATrainer, TrainSummary

__all__ = ["needed", "run_steps"]

log = logging.getLogger("fedlite.party_a")

MAX_STALLS = 3  # reconciliations in a row without a step applied before giving up


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
        self, trainer: "PartyATrainer", summary: "TrainSummary", pool: ThreadPoolExecutor
    ) -> None:
        self.trainer = trainer
        self.summary = summary
        self.pool = pool
        self.depth = trainer.config.run.pipeline_depth
        self.in_flight: deque[_InFlight] = deque()
        # After a reconciliation, until the next checkpoint, requests go one at a time (the
        # forwards keep their schedule, so nothing changes but the speed): with several in
        # flight, an answer lost on the way while its successor is applied cannot be asked
        # for again (party B keeps the last answer only) and costs a rollback each time.
        self.cautious = False

    def run(self) -> None:
        trainer, run = self.trainer, self.trainer.config.run
        next_step = trainer.step + 1
        stalled = 0
        while trainer.step < run.steps:
            if next_step <= run.steps and trainer.step >= needed(
                next_step, self.depth, run.checkpoint_interval
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
                trainer._reconcile(self.summary)
                next_step = trainer.step + 1
                self.cautious = self.depth > 1
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
            result = trainer.bottom.apply(head.pending, response)
            trainer._after_step(
                head.pending, result, self.summary, time.perf_counter() - head.started
            )
            if trainer.step % run.checkpoint_interval == 0:
                self.cautious = False

    def _send(self, step: int) -> _InFlight:
        """Forward and encode ``step`` here (the model is touched by this thread only) and
        hand its request to a sender thread."""
        trainer = self.trainer
        started = time.perf_counter()
        batch = trainer.batch(step)
        pending = trainer.bottom.request(
            step,
            trainer.x[trainer.rows[batch.positions]],
            batch_digest([trainer.aligned[p] for p in batch.positions]),
            chunk_sizes=batch.chunk_sizes,
            stash=self.depth > 1,
        )
        body = pending.body
        answer = (
            None
            if self.cautious
            else self.pool.submit(trainer.transport.step, trainer.run_id, body)
        )
        return _InFlight(pending, answer, started)

    def _answer(self, head: _InFlight) -> bytes:
        """The oldest step's answer; a request that overtook its predecessor is sent again
        (its predecessor has been answered by now, so party B expects it)."""
        if head.answer is None:
            return self.trainer.transport.step(self.trainer.run_id, head.pending.body)
        try:
            return head.answer.result()
        except StepOutOfOrder as exc:
            if exc.applied_step >= head.pending.step - 1 or self.depth == 1:
                raise  # party B is not behind this step: a real disagreement
        self.summary.resent += 1
        return self.trainer.transport.step(self.trainer.run_id, head.pending.body)

    def _drain(self) -> None:
        """Wait out (and drop) every step still in flight: none may land after a resume."""
        wait([f.answer for f in self.in_flight if f.answer is not None])
        self.in_flight.clear()


def run_steps(trainer: "PartyATrainer", summary: "TrainSummary") -> None:
    """Run the remaining steps of ``trainer``'s run, up to ``pipeline_depth`` in flight."""
    depth = trainer.config.run.pipeline_depth
    with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="fedlite-step") as pool:
        _Loop(trainer, summary, pool).run()
