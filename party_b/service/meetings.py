"""Where the feature parties of a run meet: one meeting per step, alignment, evaluation,
prediction or finish, one part per party (docs/PROTOCOL.md section 12.4).

Each party's request is checked on its own first (in a worker thread, by
``party_b.service.parties``); what passes is its *part*, and it attends the meeting on the
event loop. When every party's part is in and the meeting may run (a step: once its
predecessor is applied), the last attendee computes the meeting once, in a worker thread,
and every waiting request gets its own party's result. A request waits at most ``wait``
seconds and is then answered 409 ``parties-incomplete`` naming who is missing, and
forgotten: the party sends it again.

Everything here runs on the event loop thread only (no locks): waiting requests take no
worker thread, so N parties with K steps in flight each cannot starve the thread pool the
meeting that would release them needs.
"""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from api_schemas import ProblemType
from party_b.errors import ProblemError
from party_b.service.turns import Offload

__all__ = ["MAX_MEETINGS", "Agenda", "Key", "Meetings"]

MAX_MEETINGS = 64  # waiting meetings of one run: steps in flight of every party, and more

Key = tuple[str, ...]  # ("step", "12"), ("align",), ("finish",), ("eval", split, h), ...


@dataclass(frozen=True)
class Agenda:
    """What a meeting is for: who attends, when it may run, and what it computes."""

    what: str  # for people: "step 12", "the alignment", ...
    parties: tuple[str, ...]  # every party must bring its part
    compute: Callable[[dict[str, Any]], dict[str, Any]]  # blocking: {party: result}
    ready: Callable[[], bool] = lambda: True  # a step: its predecessor applied
    applied: Callable[[], int | None] = lambda: None  # the run's applied step, for problems
    step: int | None = None  # a step's number: the meetings before it are the earlier steps


@dataclass(eq=False)
class _Part:
    value: Any  # what the party's checked request brought
    sha: bytes  # a resend with the same bytes joins the part
    waiters: list["asyncio.Future[Any]"] = field(default_factory=list)


@dataclass(eq=False)
class _Meeting:
    agenda: Agenda
    parts: dict[str, _Part] = field(default_factory=dict)
    running: bool = False

    def missing(self) -> list[str]:
        return [p for p in self.agenda.parties if p not in self.parts]


class Meetings:
    """The meetings of every run with several feature parties; ``attend`` per request."""

    def __init__(self, wait: float) -> None:
        """``wait``: the longest wait of one request, in seconds."""
        self.wait = wait
        self._runs: dict[str, dict[Key, _Meeting]] = {}
        self._epochs: dict[str, int] = {}  # a run's resets so far (a rollback)

    def epoch(self, run_id: str) -> int:
        """Read before a request is checked and passed to ``attend``: a rollback in between
        makes the check stale, and ``attend`` refuses it."""
        return self._epochs.get(run_id, 0)

    async def attend(
        self,
        run_id: str,
        key: Key,
        party: str,
        part: Any,
        sha: bytes,
        agenda: Agenda,
        offload: Offload,
        *,
        epoch: int,
    ) -> Any:
        """Bring ``party``'s part to the meeting ``key`` of the run; its result once every
        party's part is in and the meeting ran (or the meeting's ProblemError), else 409
        ``parties-incomplete`` after ``wait`` seconds."""
        if epoch != self.epoch(run_id):
            raise _rolled_back(agenda)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        meeting = self._meeting(run_id, key, agenda)
        waiter: asyncio.Future[Any] = loop.create_future()
        self._join(meeting, party, part, sha, waiter)
        await self._run_ready(run_id, offload)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), deadline - loop.time())
        except TimeoutError:
            if meeting.running or waiter.done():
                return await waiter  # computing: its result comes (bounded by the compute)
            problem = self._incomplete(run_id, key, meeting, party)
            self._leave(run_id, key, meeting, party, waiter)
            raise problem from None
        except asyncio.CancelledError:
            if not meeting.running:
                self._leave(run_id, key, meeting, party, waiter)
            raise

    def reset(self, run_id: str, problem: ProblemError, kinds: tuple[str, ...]) -> None:
        """The run moved under its meetings (a rollback): every waiting request of a meeting
        of ``kinds`` gets ``problem``; a meeting already computing finishes first."""
        self._epochs[run_id] = self.epoch(run_id) + 1
        meetings = self._runs.get(run_id, {})
        for key in [k for k, m in meetings.items() if k[0] in kinds and not m.running]:
            for part in meetings.pop(key).parts.values():
                for waiter in part.waiters:
                    if not waiter.done():
                        waiter.set_exception(problem)
        if not meetings:
            self._runs.pop(run_id, None)

    def waiting(self, run_id: str) -> dict[Key, list[str]]:
        """The run's meetings and the parties whose parts are in (for views and tests)."""
        return {k: list(m.parts) for k, m in self._runs.get(run_id, {}).items()}

    # ------------------------------------------------------------------ internals

    def _meeting(self, run_id: str, key: Key, agenda: Agenda) -> _Meeting:
        meetings = self._runs.setdefault(run_id, {})
        meeting = meetings.get(key)
        if meeting is None:
            if len(meetings) >= MAX_MEETINGS:
                raise ProblemError.limit(
                    f"{len(meetings)} meetings of this run wait for other parties already "
                    f"(limit {MAX_MEETINGS}); send again when they are done"
                )
            meeting = meetings[key] = _Meeting(agenda)
        return meeting

    @staticmethod
    def _join(meeting: _Meeting, party: str, part: Any, sha: bytes, waiter: Any) -> None:
        """Add the party's part; the same bytes again join it, other bytes replace it."""
        earlier = meeting.parts.get(party)
        if earlier is not None and earlier.sha == sha:
            earlier.waiters.append(waiter)
            return
        if earlier is not None:
            if meeting.running:
                raise _superseded(meeting.agenda, party, computing=True)
            for old in earlier.waiters:
                if not old.done():
                    old.set_exception(_superseded(meeting.agenda, party, computing=False))
        meeting.parts[party] = _Part(part, sha, [waiter])

    async def _run_ready(self, run_id: str, offload: Offload) -> None:
        """Compute every meeting of the run that is complete and may run, oldest step first
        (a step's meeting that ran lets the next one run)."""
        while True:
            meetings = self._runs.get(run_id, {})
            ready = [
                (key, m)
                for key, m in meetings.items()
                if not m.running and not m.missing() and m.agenda.ready()
            ]
            if not ready:
                return
            key, meeting = min(ready, key=lambda item: item[1].agenda.step or 0)
            meeting.running = True
            values = {p: part.value for p, part in meeting.parts.items()}
            try:
                results = await offload(partial(meeting.agenda.compute, values))
            except Exception as exc:  # the same refusal (or fault) for every party
                self._settle(meeting, partial(_same, exc))
            except BaseException:  # this request was cancelled (a shutdown): not the others
                gone = ProblemError.internal(f"{meeting.agenda.what} was interrupted; send again")
                self._settle(meeting, partial(_same, gone))
                raise
            else:
                self._settle(meeting, results.get)
            finally:
                meetings.pop(key, None)
                if not meetings:
                    self._runs.pop(run_id, None)

    @staticmethod
    def _settle(meeting: _Meeting, outcome: Callable[[str], Any]) -> None:
        for party, part in meeting.parts.items():
            result = outcome(party)
            for waiter in part.waiters:
                if waiter.done():
                    continue
                if isinstance(result, BaseException):
                    waiter.set_exception(result)
                else:
                    waiter.set_result(result)

    def _leave(self, run_id: str, key: Key, meeting: _Meeting, party: str, waiter: Any) -> None:
        """A request that stops waiting takes its part with it, unless another request of
        the same party still waits on it."""
        part = meeting.parts.get(party)
        if part is not None and waiter in part.waiters:
            part.waiters.remove(waiter)
            if not part.waiters:
                del meeting.parts[party]
        meetings = self._runs.get(run_id, {})
        if not meeting.parts and meetings.get(key) is meeting:
            del meetings[key]
        if not meetings:
            self._runs.pop(run_id, None)

    def _incomplete(self, run_id: str, key: Key, meeting: _Meeting, party: str) -> ProblemError:
        """409 parties-incomplete naming whom the request waited for: the parties missing
        from its meeting, or, for a complete step, from the oldest earlier step not applied.
        A step whose own party has not sent an earlier step that is not applied is told
        where the run is instead (409 step-out-of-order): that party is not where party B is
        (it restarted, or party B rolled back or restarted), and waiting would not help."""
        agenda, applied = meeting.agenda, meeting.agenda.applied()
        what, missing = agenda.what, meeting.missing()
        if agenda.step is not None and applied is not None:
            meetings = self._runs.get(run_id, {})
            for step in range(applied + 1, agenda.step):
                earlier = meetings.get(("step", str(step)))
                if earlier is None or party not in earlier.parts:
                    return ProblemError(
                        ProblemType.STEP_OUT_OF_ORDER,
                        f"{agenda.what} of party {party!r} waits for step {step}, which party "
                        f"{party!r} has not sent: party B has applied step {applied} and "
                        f"expects {applied + 1}",
                        expected_step=applied + 1,
                        applied_step=applied,
                    )
                if not missing and earlier.missing():
                    what, missing = f"step {step}", earlier.missing()
        names = ", ".join(repr(p) for p in missing) or "no party (it was computing)"
        return ProblemError(
            ProblemType.PARTIES_INCOMPLETE,
            f"{agenda.what} waited {self.wait:g} s for {what} of {names}; send it again",
            waiting_for=what,
            missing_parties=missing,
            **({"applied_step": applied} if applied is not None else {}),
        )


def _same(value: Any, _party: str) -> Any:
    return value


def _superseded(agenda: Agenda, party: str, *, computing: bool) -> ProblemError:
    when = "is being computed with" if computing else "was replaced by"
    return ProblemError(
        ProblemType.STEP_REPLAY_MISMATCH,
        f"{agenda.what} {when} another request of party {party!r} with other bytes",
        **({"applied_step": a} if (a := agenda.applied()) is not None else {}),
    )


def _rolled_back(agenda: Agenda) -> ProblemError:
    applied = agenda.applied()
    if applied is None:
        return ProblemError.run_state(f"the run changed while {agenda.what} was checked")
    return ProblemError(
        ProblemType.STEP_OUT_OF_ORDER,
        f"the run was rolled back to step {applied} while {agenda.what} was checked",
        expected_step=applied + 1,
        applied_step=applied,
    )
