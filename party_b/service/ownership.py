"""Which party B replica holds a run: claimed on load, checked at every commit, released when
the run leaves memory (the protocol is ``party_b.store.leases``).

Several replicas may serve one database behind a load balancer that sends each run's
requests to one of them (docs/DEPLOY.md). A replica that gets a request for a run it does not
hold in memory loads it, which claims its lease: the run's previous holder, dead or alive,
can commit nothing of that run any more (``fence`` refuses it with 503 ``run-moved``, and
drops the copy). So whichever replica the balancer picks, one copy of a run moves at a time,
from its newest checkpoint, and party A's usual rollback replays what the old holder had
applied after that checkpoint.

``park`` is the other way out of memory: a run evicted to keep this replica within its
bounds (``bounds.LiveBounds``) is checkpointed at its applied step and released first, so its
next request, here or at another replica, goes on exactly where it stopped.
"""

import logging
import os
import secrets
import socket
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import ProblemType
from party_b import store
from party_b.errors import ProblemError
from party_b.service.runstate import RunState
from party_b.store import sole
from party_b.store.engine import Database

__all__ = ["Applied", "Ownership", "default_holder", "once_more_if_moved"]

log = logging.getLogger("fedlite.party_b")
T = TypeVar("T")

# (step, every party's request digests, their answers): a step and what it was answered with,
# as a checkpoint records it (``store.pack_answers``)
Applied = tuple[int, bytes | None, bytes | None]


def default_holder() -> str:
    """This process's name as a lease holder: host, process id and a random suffix (a
    restarted process with a recycled id is still another holder)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Ownership:
    """This replica's side of the run leases."""

    def __init__(
        self, sessions: sessionmaker[Session], *, holder: str | None = None, checkpoints_kept: int
    ) -> None:
        self.holder = holder or default_holder()  # FEDLITE_B_REPLICA_ID, or default_holder()
        self._sessions = sessions
        self._checkpoints_kept = checkpoints_kept
        with sessions() as session:  # (no connection is opened for this)
            bind = session.get_bind()
        # one SQLite file has one party B: no other process can take its runs over
        self._shared = bind.dialect.name != "sqlite"
        # ... and where this process holds the file's serving lock (store.sole), that is
        # proven: no lease can move, so a commit need not fence it (an UPDATE every step)
        self._sole = isinstance(bind, Engine) and sole.holds(bind)

    def claim(self, session: Session, run_id: str) -> int:
        """Take the run over, in the transaction that then reads its newest checkpoint;
        returns the token the copy about to be loaded holds it with."""
        return store.claim(session, run_id, self.holder)

    def current(self, state: RunState) -> bool:
        """Whether a copy found in memory still holds its run; marks it stale if not. On a
        database replicas share this reads the lease (one indexed row); on SQLite only the
        copy's own mark counts."""
        if state.lease is None or not self._shared:
            return state.lease is not None
        with self._sessions() as session:
            lease = store.lease_of(session, state.run_id)
        if lease is not None and lease[1] == state.lease:
            return True
        log.info("run %s was taken over by another replica; loading it afresh", state.run_id)
        state.lease = None
        return False

    def fence(self, db: Database, state: RunState) -> None:
        """Refuse a commit from a copy that no longer holds the run (503 ``run-moved``); the
        caller holds ``state.lock`` and is inside the commit's transaction (``db``'s)."""
        lease = state.lease
        if lease is not None and (self._sole or store.fence(db, state.run_id, lease)):
            return
        if state.lease is not None:
            log.warning("run %s was taken over by another holder; dropping this copy", state.run_id)
        state.lease = None  # the cache hands it out no more
        raise ProblemError(
            ProblemType.RUN_MOVED,
            "another party B replica took this run over while the request was being served; "
            "nothing was applied here: send it again",
        )

    def checkpoint(self, db: Database, state: RunState, at: Applied | None = None) -> None:
        """Fence (503 ``run-moved``), then write the run's checkpoint: its top model and
        optimizer as they are, recorded as step ``at`` (a step being committed, with every
        party's request digest and answer) or, by default, the run's applied step. The one
        way a live run is checkpointed: a step's commit, the end of a run, a run leaving
        memory, a drain. The caller holds ``state.lock`` and commits; pruning keeps the run's
        newest interval checkpoints (party A keeps the same ones) and the newest of all."""
        self.fence(db, state)
        self.save(db, state, at)

    def save(self, db: Database, state: RunState, at: Applied | None = None) -> None:
        """``checkpoint`` within a transaction that fenced already (a step's commit)."""
        step, digests, answers = at or (state.step, state.last_request_sha, state.last_response)
        model_state, optimizer_state = state.trainer.state()
        store.save_checkpoint(
            db,
            run_id=state.run_id,
            step=step,
            model_state=model_state,
            optimizer_state=optimizer_state,
            request_sha256=digests,
            response=answers,
            keep=self._checkpoints_kept,
            interval=state.config.checkpoint_interval,
        )

    def park(self, state: RunState) -> None:
        """Checkpoint an evicted run at its applied step and release its lease. Best effort:
        if that fails, the run reloads its newest earlier checkpoint and party A rolls back."""
        with state.lock:
            if state.lease is None:
                return
            try:
                with self._sessions() as session:
                    steps = store.checkpoint_steps(session, state.run_id)
                    if not state.finished and state.step not in steps:
                        self.checkpoint(session, state)
                    else:
                        self.fence(session, state)
                    store.release(session, state.run_id, state.lease)
                    session.commit()
                log.info("run %s left memory at step %d (checkpointed)", state.run_id, state.step)
            except ProblemError:
                return  # another replica holds it: nothing of ours to save
            except Exception:
                log.exception("run %s could not be checkpointed on leaving memory", state.run_id)
            finally:
                state.lease = None


def once_more_if_moved(call: Callable[[], T]) -> T:
    """``call()``, and once more if its copy of the run had lost its lease: that copy is gone
    from memory by then, so the second call loads the run and takes it over (the load
    balancer sent the request here). A second ``run-moved`` goes to the client, which
    resends it like any 503."""
    try:
        return call()
    except ProblemError as exc:
        if exc.type is not ProblemType.RUN_MOVED:
            raise
        return call()
