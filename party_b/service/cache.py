"""The runs party B holds in memory: every training run in use, and the last few finished.

A run's state is loaded from the store on first use (``RunLoader``), by one thread while
others asking for it wait. Lookups are by owner as well as id: a request for a run the
caller does not own takes exactly the path of a request for an id that names no run (the
store's ownership lookup, then 404), whether or not the run is in memory, so neither the
answer nor its timing tells another token that the run exists.

The training runs in memory are bounded (``bounds.LiveBounds``): loading one past the bounds
parks the least recently used others (``park``: checkpointed at their applied step, their
lease released) and forgets them; their next request loads them again. A run being parked
counts as being loaded, so a request for it waits and then reads the checkpoint it left. A
copy whose lease was lost (parked, or claimed by another replica: ``state.lease is None``)
is never handed out again; on a database replicas share, a copy is handed out only after
``verify`` found its lease still current (another replica may have taken the run over since
this one last touched it: a copy behind would answer 409s and show a step the run has left).
"""

import threading
from collections import OrderedDict
from collections.abc import Callable

from party_b.metrics import Metrics
from party_b.service.bounds import Footprints, LiveBounds, over_bounds
from party_b.service.runstate import Caller, RunState

__all__ = ["FINISHED_KEPT", "RunCache"]

FINISHED_KEPT = 4  # finished runs kept in memory for evaluate/predict

Loader = Callable[[Caller, str], RunState]  # raises ProblemError (404 unless owned)
Parker = Callable[[RunState], None]  # checkpoints an evicted run and releases its lease
Verifier = Callable[[RunState], bool]  # whether a copy still holds its run (else marks it)


class RunCache:
    def __init__(
        self,
        load: Loader,
        metrics: Metrics,
        bounds: LiveBounds | None = None,
        park: Parker | None = None,
        verify: Verifier | None = None,
    ) -> None:
        """``bounds``: training runs kept in memory (default none); ``park``: how a run over
        them leaves (default: runs never leave); ``verify``: checks a copy found in memory
        before it is handed out (default: none)."""
        self._load = load
        self._metrics = metrics
        self._bounds = bounds or LiveBounds()
        self._park = park
        self._verify = verify
        self._footprints = Footprints()
        self._live: OrderedDict[str, RunState] = OrderedDict()  # least recently used first
        self._finished: OrderedDict[str, RunState] = OrderedDict()
        self._lock = threading.Lock()  # guards _live, _finished and _loading
        self._loading: dict[str, threading.Lock] = {}

    def owned(self, caller: Caller, run_id: str) -> RunState:
        """The in-memory state of an aligned run the caller owns, loaded on first use."""
        # A loading lock exists only while a run is being loaded (one per run id ever asked
        # for, unknown ones included, would grow without bound). Whoever holds it loads; the
        # others wait, and then start over: the run is in memory by then, or the load failed
        # and its lock was retired, so that exactly one of them takes a fresh lock and tries
        # again (never two loads of one run at once, never two states of one run).
        while True:
            with self._lock:
                state = self._get(run_id)
                hit = state is not None and state.owner_id == caller.token_id
                if hit and run_id in self._live:
                    self._live.move_to_end(run_id)
                if not hit:
                    # not in memory, or not the caller's: the store decides, the same way
                    loading = self._loading.setdefault(run_id, threading.Lock())
            if hit:
                assert state is not None
                if self._verify is None or self._verify(state):
                    return state
                continue  # another replica took the run over: load it afresh
            with loading:
                with self._lock:
                    if self._loading.get(run_id) is not loading:
                        continue  # retired while we waited: look again
                try:
                    return self._load_once(caller, run_id)
                finally:
                    with self._lock:
                        del self._loading[run_id]

    def peek(self, run_id: str) -> RunState | None:
        """The state if it is in memory (for views; no ownership check, no load)."""
        with self._lock:
            return self._get(run_id)

    def peek_owned(self, caller: Caller, run_id: str) -> RunState | None:
        """The state if it is in memory and the caller's, else None: no load, no database, so
        it may be called from the event loop. Another token's run is None like a missing one,
        and the caller then takes the path every request takes (``owned``: 404)."""
        with self._lock:
            state = self._get(run_id)
        return state if state is not None and state.owner_id == caller.token_id else None

    def current_copy(self, caller: Caller, run_id: str) -> RunState | None:
        """The caller's copy of the run in memory, if it still holds its run; never loads.

        A read (``GET``) goes through here, not ``owned``: loading claims the run's lease,
        so a read that reached a replica not holding the run would take it from the one that
        does (and its steps would follow it there, with a rollback). A read of a run not in
        memory here is answered from the database instead."""
        state = self.peek_owned(caller, run_id)
        if state is None or (self._verify is not None and not self._verify(state)):
            return None
        return state

    def live(self) -> list[RunState]:
        """The training runs in memory now (a copy: loads and drops go on meanwhile)."""
        with self._lock:
            return list(self._live.values())

    def retire(self, run_id: str, state: RunState) -> None:
        """Move a run that finished to the few finished runs kept in memory."""
        with self._lock:
            self._live.pop(run_id, None)
            self._keep_finished(run_id, state)

    def drop(self, run_id: str, state: RunState | None = None) -> None:
        """Forget a run's state (only if it is ``state``, when given): the next use reloads
        it from its newest checkpoint."""
        with self._lock:
            if state is None or self._get(run_id, stale=True) is state:
                self._live.pop(run_id, None)
                self._finished.pop(run_id, None)
                self._footprints.forget(run_id)
            self._count()

    def _load_once(self, caller: Caller, run_id: str) -> RunState:
        with self._lock:  # another owner's request may have loaded it while we waited
            state = self._get(run_id)
        if state is None or state.owner_id != caller.token_id:
            state = self._load(caller, run_id)  # 404 unless the caller owns the run
            with self._lock:
                if state.finished:
                    self._keep_finished(run_id, state)
                else:
                    self._live[run_id] = state
                    self._footprints.measure(state, wait=True)
                    self._count()
            if not state.finished:
                self._make_room(keep=run_id)
        return state

    def _make_room(self, *, keep: str) -> None:
        """Park the least recently used training runs until the rest are within bounds."""
        if self._park is None:
            return
        with self._lock:
            victims = [
                v
                for v in over_bounds(self._bounds, self._live.values(), self._footprints, keep=keep)
                if v.run_id not in self._loading  # a request is loading it: leave it be
            ]
            gates = {}
            for victim in victims:
                # the run counts as loading while it is parked: its next request waits, and
                # then loads the checkpoint the park writes
                gates[victim.run_id] = self._loading[victim.run_id] = threading.Lock()
                gates[victim.run_id].acquire()
                del self._live[victim.run_id]
                self._footprints.forget(victim.run_id)
            self._count()
        for victim in victims:
            try:
                self._park(victim)
            finally:
                with self._lock:
                    del self._loading[victim.run_id]
                gates[victim.run_id].release()

    def _get(self, run_id: str, *, stale: bool = False) -> RunState | None:
        """The run's copy in memory; one whose lease was lost only when ``stale``."""
        state = self._live.get(run_id) or self._finished.get(run_id)
        return state if state is None or stale or state.lease is not None else None

    def _keep_finished(self, run_id: str, state: RunState) -> None:
        self._finished[run_id] = state
        while len(self._finished) > FINISHED_KEPT:
            self._finished.popitem(last=False)
        self._count()

    def _count(self) -> None:
        self._metrics.live_runs.set(len(self._live) + len(self._finished))
