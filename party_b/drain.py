"""A graceful stop of ``fedlite-b serve`` that loses nothing: drain, then checkpoint.

On SIGTERM (Kubernetes ending a pod, ``docker stop``, systemd), in order:

1. **Drain** (:class:`DrainingServer`): party B keeps its port open but refuses every new API
   request with 503 ``unavailable`` and ``Retry-After`` (``party_b.api.lifecycle``), and
   ``GET /readyz`` says 503, so load balancers stop sending it work. It waits until the
   requests in flight have their answers (at most ``DRAIN_WAIT_LIMIT`` seconds).
2. **Checkpoint** (:func:`checkpoint_live_runs`), as soon as nothing is in flight: every
   training run in memory is checkpointed at its last applied step, with that step's request
   hash and answer, so the restarted process or another replica resumes exactly where this
   one stopped: party A's next step is simply the next one (no rollback; a resent last step
   gets its stored answer, as after any restart). This happens before a load balancer can
   have moved a run elsewhere, since party B stays unready for at least ``drain_seconds``
   (set it above the balancer's time to mark a server down).
3. **Stop** (uvicorn's own graceful shutdown) once ``drain_seconds`` have passed: the port
   closes, open connections finish, and the app's lifespan checkpoints again (nothing is
   left to write after a drain; after a plain stop it writes what step 2 would have) and
   folds the SQLite WAL in.

A second SIGTERM, or SIGINT (Ctrl+C), skips what is left of the drain and stops at once; the
lifespan still checkpoints. A SIGKILL skips everything, and recovery falls back to the newest
periodic checkpoint and party A's rollback (docs/RELIABILITY.md), as it always did.
"""

import asyncio
import logging
import signal
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import anyio
import uvicorn

from api_schemas import RunStatus
from party_b import store
from party_b.errors import ProblemError

if TYPE_CHECKING:  # party_b.api imports this module (its lifespan checkpoints)
    from party_b.api.lifecycle import Lifecycle
    from party_b.service import Service

__all__ = ["DRAIN_WAIT_LIMIT", "DrainingServer", "checkpoint_live_runs"]

log = logging.getLogger("fedlite.party_b")

# The longest wait for requests in flight (seconds). A step takes well under a second; a
# request that loads a large run from its checkpoint can take several. Kubernetes'
# terminationGracePeriodSeconds must cover this, drain_seconds and the checkpoints
# (docker/k8s/base/deployment.yaml).
DRAIN_WAIT_LIMIT = 60.0


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with the drain (step 1 above) before its own graceful stop."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        lifecycle: "Lifecycle",
        checkpoint: Callable[[], object],
        drain_seconds: float = 0.0,
        wait_limit: float = DRAIN_WAIT_LIMIT,
    ) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.checkpoint = checkpoint  # step 2, in a worker thread
        self.drain_seconds = drain_seconds
        self.wait_limit = max(wait_limit, drain_seconds)
        self._drain_asked = False  # set by the signal handler, acted on by the next tick
        self._drain: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: it only records the wish; the event loop's next tick acts on it.
        if sig == signal.SIGTERM and not self._drain_asked and not self.should_exit:
            self._drain_asked = True
            return
        super().handle_exit(sig, frame)  # a second signal, or SIGINT: stop now

    async def on_tick(self, counter: int) -> bool:
        if self._drain_asked and self._drain is None:
            self._drain = asyncio.create_task(self._drain_requests())
        if self._drain is not None and self._drain.done():
            self.should_exit = True
        return await super().on_tick(counter)

    async def _drain_requests(self) -> None:
        lifecycle = self.lifecycle
        lifecycle.drain()
        log.warning(
            "SIGTERM: draining (%d requests in flight; new ones get 503 for at least %g s)",
            lifecycle.requests_in_flight,
            self.drain_seconds,
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        while lifecycle.requests_in_flight and loop.time() - started < self.wait_limit:
            await asyncio.sleep(0.05)
        if lifecycle.requests_in_flight:
            log.error(
                "drain: %d requests still in flight after %.0f s; checkpointing and stopping "
                "anyway (a run's checkpoint waits for its step; each request is retried)",
                lifecycle.requests_in_flight,
                loop.time() - started,
            )
        await anyio.to_thread.run_sync(self.checkpoint)
        await asyncio.sleep(max(0.0, self.drain_seconds - (loop.time() - started)))
        log.warning("drained in %.1f s; stopping", loop.time() - started)


def checkpoint_live_runs(service: "Service") -> list[tuple[str, int]]:
    """Checkpoint every training run in memory at its last applied step (step 2 above);
    returns [(run id, step)] of the checkpoints written.

    A run whose newest checkpoint is already at that step is left alone. The checkpoint
    prunes nothing that party A may still roll back to: the run's interval checkpoints stay,
    and only an older off-schedule checkpoint (an earlier stop's) is replaced
    (``Ownership.checkpoint``). Runs the event loop does not touch: call it in a thread.
    """
    ctx = service.context
    written = []
    for state in ctx.cache.live():
        with state.lock, ctx.sessions() as session:  # no step of the run meanwhile
            run = session.get(store.Run, state.run_id)
            if state.finished or run is None or run.status != RunStatus.TRAINING.value:
                continue  # finished (checkpointed then) or deleted meanwhile
            kept = store.checkpoint_steps(session, state.run_id)
            if kept and kept[-1] >= state.step:
                continue
            try:
                ctx.ownership.checkpoint(session, state)
            except ProblemError:
                continue  # another replica took the run over: nothing of this copy to save
            session.commit()
            written.append((state.run_id, state.step))
            log.warning("run %s checkpointed at step %d on the way down", state.run_id, state.step)
    return written
