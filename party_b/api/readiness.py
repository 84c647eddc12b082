"""Whether party B can take work now: the readiness probe behind ``GET /readyz``.

Ready means all of: the app has started (its lifespan ran, so the label table is loaded and
the runs recovered), it is not draining (``party_b.api.lifecycle``), and its database answers
a read of the token table (what every API request does first) within ``timeout`` seconds.
A load balancer or Kubernetes then sends work only to replicas that can do it, and takes a
replica out while its database is gone instead of letting every request fail there.

Liveness (``GET /healthz``) asks none of this: a database or party A that is away is no
reason to restart party B, which recovers by itself once they are back.

The probe is unauthenticated, so what anyone can make it cost is bounded: one database read
at a time (concurrent probes share it) and at most one per ``fresh_for`` seconds (a result
that recent is reused). Why the database failed goes to party B's log, once per change, not
into the answer: the error may name hosts and users.
"""

import logging
import time

import anyio
from sqlalchemy import Engine, select

from party_b.store import ApiToken

__all__ = ["DatabaseProbe"]

log = logging.getLogger("fedlite.party_b")


class DatabaseProbe:
    """``await probe()``: None when the database answers, else why not (for the problem)."""

    def __init__(self, engine: Engine, *, timeout: float = 2.0, fresh_for: float = 1.0) -> None:
        self._engine = engine
        self._timeout = timeout
        self._fresh_for = fresh_for
        self._last: tuple[float, str | None] | None = None  # (monotonic time, outcome)
        self._running: anyio.Event | None = None  # set when the read in progress ends
        self._healthy = True  # what was logged last

    async def __call__(self) -> str | None:
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < self._fresh_for:
            return self._last[1]
        if self._running is not None:  # another probe is reading: take its outcome
            await self._running.wait()
            assert self._last is not None
            return self._last[1]
        self._running = anyio.Event()
        try:
            outcome = await self._read()
            self._last = (time.monotonic(), outcome)
        finally:
            self._running.set()
            self._running = None
        return outcome

    async def _read(self) -> str | None:
        # The read runs in its own thread, not in the worker threads of the steps (all busy
        # under load, which must not make the replica look unready). A database that does
        # not answer (a dropped network, say) leaves that thread waiting for the driver's
        # own timeout; the probe answers after ``timeout`` and the next one starts afresh.
        failure: list[BaseException] = []
        with anyio.move_on_after(self._timeout):
            try:
                await anyio.to_thread.run_sync(self._query, abandon_on_cancel=True)
            except Exception as exc:  # any driver error means: not usable now
                failure.append(exc)
            else:
                self._report(None)
                return None
        if failure:
            self._report(f"{type(failure[0]).__name__}: {failure[0]}")
            return "party B's database does not answer (see party B's log)"
        self._report(f"no answer within {self._timeout:g} s")
        return f"party B's database did not answer within {self._timeout:g} s"

    def _query(self) -> None:
        with self._engine.connect() as connection:
            connection.execute(select(ApiToken.id).limit(1)).all()

    def _report(self, error: str | None) -> None:
        if error is not None and self._healthy:
            log.warning("readiness: the database does not answer (%s); unready", error)
        elif error is None and not self._healthy:
            log.warning("readiness: the database answers again; ready")
        self._healthy = error is None
