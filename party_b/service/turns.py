"""A step that overtook its predecessor waits its turn, on the event loop (docs/PROTOCOL.md 11).

Party A keeps up to K <= 16 steps in flight, each on its own connection, so step s can reach
party B before step s-1. Party B applies steps strictly in order (``steps.py``), and refusing
such a step with 409 ``step-out-of-order`` costs party A a resend one round trip later: over a
40 ms link at K = 4 that was most steps of a run, and most of what pipelining gains. So a step
s with a + 1 < s <= a + ``MAX_AHEAD`` (a = the last applied step) waits, at most ``hold``
seconds, until the request of a step before it has its answer, and then goes the normal way,
which still decides everything (applied, replayed, 409, ...). A step that is still ahead when
the hold runs out gets today's 409, and so does one whose predecessor's request was refused. A
step is held once: a resend of a step held before (and not applied since) gets its answer at
once, so that a client whose timeout is shorter than the hold still sees the 409.

The wait must not take one of the few worker threads (``worker_threads``) that steps run in:
held steps sitting there could starve the very predecessor they wait for. So it happens on the
event loop, before the step is handed to a thread, and reads only what is cheap and local:
``s`` from the body's top-level map (``peek_step``, in any key order; anything unusual is not
held and meets the normal path's 400), and the applied step of the caller's run in memory
(``RunCache.peek_owned``, never the database). A step about to be held is first decoded in
full, in a worker thread: a malformed body is never held (it gets its 400 at once), however
well its ``v``, ``t`` and ``s`` are formed. A run not in memory yet (its first steps, or
the first after a restart) is loaded first in a worker thread, as the step itself would load
it, with the same 404 for another token's run as for a missing one; the wait starts after.
A run loaded from a checkpoint older than steps it had applied (after a crash, or taken over
from another replica: ``RunState.behind``) holds nothing until it applies a step: party A is
past that checkpoint, the predecessor will never come, and the 409 starts its rollback.
Every step request, once answered, wakes the held steps of its run, which look again; so does
a resume. ``Turns`` is used from the event loop thread only: no locks.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol, TypeVar

from party_b.metrics import Metrics
from party_b.service.cache import RunCache
from party_b.service.runstate import Caller
from shared import codec
from shared.codec import peek_step

__all__ = ["HOLD_SECONDS", "MAX_AHEAD", "Offload", "Turns"]

# Party A's largest pipeline_depth (party_a/config.py): a step further ahead cannot have been
# sent beside its predecessor, so it is refused at once.
MAX_AHEAD = 16

# The default hold (FEDLITE_B_STEP_HOLD_SECONDS; 0 turns it off):
# long enough for a predecessor that left party A a moment earlier on another connection (a
# WAN's jitter, a TLS handshake, a wait for a worker thread behind other runs' steps), short
# enough that a predecessor that never comes delays party A's usual 409 path by a few seconds
# only, far below its request timeout (120 s, party_a/transport/http.py).
HOLD_SECONDS = 5.0

T = TypeVar("T")


class Offload(Protocol):
    """Runs a blocking call in a worker thread (the API's ``in_thread``)."""

    def __call__(self, fn: Callable[[], T], /) -> Awaitable[T]: ...


@dataclass(eq=False)  # each one is itself, whatever its fields
class _Held:
    step: int
    owner_id: int  # only the run's owner wakes it
    woken: "asyncio.Future[bool]" = field(repr=False)  # True: the predecessor was answered


class Turns:
    """Held steps per run; ``turn`` around each step request of the HTTP API."""

    def __init__(
        self,
        cache: RunCache,
        metrics: Metrics,
        hold: float = HOLD_SECONDS,
        limits: codec.DecodeLimits = codec.DEFAULT_LIMITS,
    ) -> None:
        """``hold``: the longest wait of one step in seconds (0: never hold); ``limits``:
        the bounds a body to be held is decoded with (the step's own)."""
        self._cache = cache
        self._metrics = metrics
        self.hold = hold
        self._limits = limits
        self._held: dict[str, list[_Held]] = {}  # run id -> its held steps
        # run id -> the steps held once and not yet applied: a step is held once only. A
        # client whose timeout is shorter than the hold resends a held step before the hold
        # ends; holding every resend would keep it from ever seeing the 409 that tells it
        # party B is behind (a restart, a lost predecessor), and it would time out for good:
        # the flaky-network test's K = 2 run, 1 s timeout against a 5 s hold, did.
        self._once: dict[str, set[int]] = {}

    @asynccontextmanager
    async def turn(
        self, caller: Caller, run_id: str, body: bytes, offload: Offload
    ) -> AsyncIterator[None]:
        """Wait until the step in ``body`` may be tried (or the hold runs out); after the
        block, whatever its outcome, wake the run's held steps. A run not in memory is loaded
        first, through ``offload`` (a worker thread, left before the wait)."""
        step = peek_step(body)
        repeat = False
        try:
            if step is not None and step > 1:  # steps 0 and 1 are never ahead
                repeat = await self._wait(caller, run_id, step, body, offload)
            yield
        finally:
            # a resend of a held step is refused at once, which says nothing of its
            # predecessor: its successors only look again
            self._wake(caller, run_id, answered=None if repeat else step)

    def moved(self, caller: Caller, run_id: str) -> None:
        """The caller's run changed its applied step outside a step (a resume): release its
        held steps; the steps after the new one may be held again."""
        self._wake(caller, run_id, answered=None, release=True)
        if self._cache.peek_owned(caller, run_id) is not None:
            self._once.pop(run_id, None)

    async def _wait(
        self, caller: Caller, run_id: str, step: int, body: bytes, offload: Offload
    ) -> bool:
        """Hold the step while it is ahead, for at most ``hold`` seconds; True when it is not
        held because it was held before (a resend)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold
        held = False
        state = self._cache.peek_owned(caller, run_id)
        if state is None and self.hold > 0:
            # a run's first steps (or the first after a restart): the step would load it
            # anyway, with the same 404 or 409 if the caller may not step it
            state = await offload(partial(self._cache.owned, caller, run_id))
        while True:
            ahead = step - state.step if state is not None and not state.finished else 0
            if not 1 < ahead <= MAX_AHEAD or (state is not None and state.behind):
                return False  # (behind: its predecessor will not come, party A rolls back)
            remaining = deadline - loop.time()
            # at most as many held as party A can have in flight: a client that sends more
            # (each with its body in memory) gets its 409s at once
            if remaining <= 0 or len(self._held.get(run_id, ())) >= MAX_AHEAD:
                return False
            if not held:
                if not await offload(partial(self._decodes, body)):
                    return False  # malformed: its 400 comes at once, from the normal path
                if not self._first_hold(run_id, step, applied=step - ahead):
                    return True  # held before: a resend gets its answer (409) at once
                held = True
                self._metrics.steps.labels("held").inc()
            entry = _Held(step, caller.token_id, loop.create_future())
            self._held.setdefault(run_id, []).append(entry)
            try:
                if await asyncio.wait_for(entry.woken, remaining):
                    return False
            except TimeoutError:
                return False
            finally:
                self._forget(run_id, entry)
            state = self._cache.peek_owned(caller, run_id)

    def _decodes(self, body: bytes) -> bool:
        """Whether ``body`` is a well-formed StepRequest (decoded in a worker thread)."""
        try:
            codec.decode_step_request(body, limits=self._limits)
        except codec.CodecError:
            return False
        return True

    def _wake(
        self, caller: Caller, run_id: str, *, answered: int | None, release: bool = False
    ) -> None:
        """Wake the run's held steps (if ``caller`` owns the run): each looks at the run again,
        and one whose predecessor ``answered`` (applied or refused), or every one when
        ``release``, goes its way."""
        for entry in self._held.get(run_id, ()):
            if entry.owner_id == caller.token_id and not entry.woken.done():
                entry.woken.set_result(release or entry.step - 1 == answered)

    def _first_hold(self, run_id: str, step: int, *, applied: int) -> bool:
        """Whether ``step`` of the run may be held: not if it was held before and the run has
        not applied it since (nor rolled back). Records it as held."""
        once = self._once.setdefault(run_id, set())
        once.difference_update([s for s in once if s <= applied])  # applied: forget them
        if step in once:
            return False
        once.add(step)
        return True

    def _forget(self, run_id: str, entry: _Held) -> None:
        entries = self._held.get(run_id, [])
        if entry in entries:
            entries.remove(entry)
        if not entries:
            self._held.pop(run_id, None)
