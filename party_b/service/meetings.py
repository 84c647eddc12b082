"""Where a run's requests wait: a step for its predecessor, and every feature party's request
for the others' (docs/PROTOCOL.md sections 11 and 12.4). Party B's one waiting mechanism.

A request is first checked on its own, in a worker thread, by the room that serves it
(``steps``, ``serving``, ``alignment``, ``runs``): what would be refused is refused at once,
and a step sent again gets its stored answer. What passes becomes a ``Ticket``: the request's
part of a *meeting* (one per step, alignment, evaluation, prediction and end of a run, one
part per feature party) and the meeting's ``Agenda``, whose ``compute`` runs once, with every
party's part, when the meeting is complete and ready (a step: once its predecessor is applied).

``at_once`` computes a ticket in the worker thread that checked it when its meeting needs no
one else and is ready: every request of a run with one feature party, except a step that
overtook its predecessor on the way (party A's pipelining). Everything else *attends* its
meeting here, on the event loop, without a worker thread: waiting requests must not take the
few threads that the requests they wait for need. When a meeting is complete and ready, one
of its attendees computes it (in a worker thread) and every waiting request gets its own
party's result; then the run's other meetings look again (the next step may be ready), each
computed by its own attendees, so that no request's answer waits for another's computation.

A request waits at most ``Agenda.wait`` seconds (party B's step hold for a run with one
feature party, its party wait for several) and is then answered: 409 ``step-out-of-order``
if its own party has not sent a step before it that is not applied yet (waiting would not
help: that party is not where party B is, and resends its steps in order), else 409
``parties-incomplete`` naming the parties missing. A step that ended its wait out of order
does not wait again (its resend is answered at once, while it is still ahead), so a client
whose timeout is shorter than the wait still learns where party B is.

The end of a run cannot deadlock the parties' last calls: a feature party's evaluation or
prediction while another party waits to finish, and every such request waiting when a party
starts to finish, is answered at once with 409 ``call-out-of-order``, ``expected_call:
"finish"``: finish first, evaluate and predict after (PROTOCOL.md 12.7).

Everything here runs on the event loop thread only: no locks.
"""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

from api_schemas import ProblemType
from party_b.errors import ProblemError

__all__ = ["MAX_MEETINGS", "Agenda", "Key", "Meetings", "Offload", "Ticket", "at_once", "now"]

MAX_MEETINGS = 64  # waiting meetings of one run: steps in flight of every party, and more

Key = tuple[str, ...]  # ("step", "12"), ("align",), ("finish",), ("eval", split, h), ...
T = TypeVar("T")
R = TypeVar("R")


class Offload(Protocol):
    """Runs a blocking call in a worker thread (the API's ``in_thread``)."""

    def __call__(self, fn: Callable[[], T], /) -> Awaitable[T]: ...


@dataclass(frozen=True)
class Agenda:
    """What a meeting is for: who attends, when it may run, and what it computes."""

    what: str  # for people: "step 12", "the alignment", ...
    parties: tuple[str, ...]  # every party must bring its part
    # blocking, in a worker thread: {party: its result, or the ProblemError it gets}
    compute: Callable[[dict[str, Any]], dict[str, Any]]
    wait: float  # the longest wait of one request, in seconds
    ready: Callable[[], bool] = lambda: True  # a step: its predecessor applied
    applied: Callable[[], int | None] = lambda: None  # the run's applied step, for problems
    step: int | None = None  # a step's number: the meetings before it are the earlier steps


@dataclass(frozen=True)
class Ticket:
    """A checked request: ``party``'s part of the meeting ``key``, and the meeting's agenda."""

    key: Key
    party: str
    part: Any
    digest: bytes  # the request's identity: the same message again joins the same part
    agenda: Agenda


def at_once(ticket: Ticket, kind: type[R]) -> R | Ticket:
    """The ticket's result (a ``kind``) now, if its meeting needs no other party and may run
    (in the worker thread that checked it); the ticket itself otherwise, to ``attend``."""
    agenda = ticket.agenda
    if agenda.parties != (ticket.party,) or not agenda.ready():
        return ticket
    result = agenda.compute({ticket.party: ticket.part})[ticket.party]
    if isinstance(result, BaseException):
        raise result
    assert isinstance(result, kind), result
    return result


def now(checked: R | Ticket) -> R:
    """A room's answer for a caller that cannot wait (party A in party B's process, a
    benchmark): a ticket is refused as a request whose wait ended at once would be."""
    if not isinstance(checked, Ticket):
        return checked
    agenda = checked.agenda
    if agenda.step is not None:
        raise _out_of_order(f"{agenda.what} is ahead of its predecessor:", agenda.applied())
    others = [p for p in agenda.parties if p != checked.party]
    raise ProblemError(
        ProblemType.PARTIES_INCOMPLETE,
        f"{agenda.what} needs the parts of {', '.join(map(repr, others))}, and this caller "
        "does not wait for them",
        waiting_for=agenda.what,
        missing_parties=others,
    )


@dataclass(eq=False)
class _Part:
    value: Any  # what the party's checked request brought
    digest: bytes  # a resend of the same message joins the part, and its wait
    deadline: float  # the event loop's time when the part's wait ends
    waiters: list["asyncio.Future[Any]"] = field(default_factory=list)


@dataclass(eq=False)
class _Meeting:
    agenda: Agenda
    parts: dict[str, _Part] = field(default_factory=dict)
    running: bool = False

    def missing(self) -> list[str]:
        return [p for p in self.agenda.parties if p not in self.parts]

    def may_run(self) -> bool:
        return not self.running and not self.missing() and self.agenda.ready()


class Meetings:
    """The waiting requests of every run; ``attend`` per ticket, ``poke`` after a change."""

    def __init__(self, on_wait: Callable[[Ticket], None] = lambda _ticket: None) -> None:
        """``on_wait``: told of every request that waits (the metrics count held steps)."""
        self._on_wait = on_wait
        self._runs: dict[str, dict[Key, _Meeting]] = {}
        self._epochs: dict[str, int] = {}  # a run's rollbacks so far
        self._nudges: dict[str, asyncio.Future[None]] = {}  # resolved when the run changes
        self._out_of_order: dict[str, set[tuple[str, int]]] = {}  # (party, step) waited once

    def epoch(self, run_id: str) -> int:
        """Read before a request is checked and passed to ``attend``: a rollback in between
        makes the check stale, and ``attend`` refuses it."""
        return self._epochs.get(run_id, 0)

    async def attend(self, run_id: str, ticket: Ticket, offload: Offload, *, epoch: int) -> Any:
        """Bring the ticket's part to its meeting; its result once every party's part is in
        and the meeting ran (or the meeting's ProblemError), else 409 when its wait ends."""
        agenda = ticket.agenda
        if epoch != self.epoch(run_id):
            raise _rolled_back(agenda)
        self._refuse_at_once(run_id, ticket)
        loop = asyncio.get_running_loop()
        meeting = self._meeting(run_id, ticket.key, agenda)
        waiter: asyncio.Future[Any] = loop.create_future()
        deadline = self._join(meeting, ticket, waiter, loop.time() + agenda.wait)
        if ticket.key[0] == "finish":
            self._finishing(run_id, meeting)
        if not meeting.may_run():
            self._on_wait(ticket)
        try:
            while not waiter.done():
                if meeting.may_run():
                    await self._run(run_id, ticket.key, meeting, offload)
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if meeting.running:  # computing: its result comes
                        return await waiter
                    raise self._gave_up(run_id, ticket, meeting, waiter)
                await asyncio.wait(
                    [waiter, self._nudge(run_id)],
                    timeout=remaining,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            return waiter.result()
        except asyncio.CancelledError:
            if not meeting.running:
                self._leave(run_id, ticket.key, meeting, ticket.party, waiter)
            raise

    def poke(self, run_id: str) -> None:
        """The run changed (a step was applied, a meeting ran): its waiting requests look
        again whether their meeting may run."""
        nudge = self._nudges.pop(run_id, None)
        if nudge is not None and not nudge.done():
            nudge.set_result(None)

    def refused(self, run_id: str, party: str | None, step: int) -> None:
        """A party's request for ``step`` was refused (``party`` None: the run's only one):
        its requests for later steps that wait cannot be applied before it sends that step
        again, so they are answered 409 now instead of when their wait ends."""
        for key, meeting in list(self._runs.get(run_id, {}).items()):
            agenda = meeting.agenda
            if agenda.step is None or agenda.step <= step or meeting.running:
                continue
            applied = agenda.applied()
            if applied is not None and step <= applied:
                return  # a step applied already: nothing is missing
            who = party if party is not None else agenda.parties[0]
            if who in meeting.parts and (party is not None or len(agenda.parties) == 1):
                what = f"{agenda.what} of party {who!r} waited for step {step}, which was refused:"
                _fail([meeting.parts.pop(who)], _out_of_order(what, applied))
                if not meeting.parts:
                    del self._runs[run_id][key]
        self._forget_if_idle(run_id)

    def reset(self, run_id: str, problem: ProblemError, kinds: tuple[str, ...]) -> None:
        """The run moved under its meetings (a rollback): every waiting request of a meeting
        of ``kinds`` gets ``problem``; a meeting already computing finishes first."""
        self._epochs[run_id] = self.epoch(run_id) + 1
        self._out_of_order.pop(run_id, None)
        meetings = self._runs.get(run_id, {})
        for key in [k for k, m in meetings.items() if k[0] in kinds and not m.running]:
            _fail(meetings.pop(key).parts.values(), problem)
        self.poke(run_id)
        self._forget_if_idle(run_id)

    def waiting(self, run_id: str) -> dict[Key, list[str]]:
        """The run's meetings and the parties whose parts are in (for views and tests)."""
        return {k: list(m.parts) for k, m in self._runs.get(run_id, {}).items()}

    # ------------------------------------------------------------------ internals

    def _nudge(self, run_id: str) -> "asyncio.Future[None]":
        nudge = self._nudges.get(run_id)
        if nudge is None or nudge.done():
            nudge = self._nudges[run_id] = asyncio.get_running_loop().create_future()
        return nudge

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
    def _join(meeting: _Meeting, ticket: Ticket, waiter: Any, deadline: float) -> float:
        """Add the ticket's part; the same message again joins it and its wait (a client
        whose timeout is shorter than the wait, resending, still sees the wait end), another
        message replaces it. Returns when the request's wait ends."""
        party = ticket.party
        earlier = meeting.parts.get(party)
        if earlier is not None and earlier.digest == ticket.digest:
            earlier.waiters.append(waiter)
            return earlier.deadline
        if earlier is not None:
            if meeting.running:
                raise _superseded(meeting.agenda, party, computing=True)
            _fail([earlier], _superseded(meeting.agenda, party, computing=False))
        meeting.parts[party] = _Part(ticket.part, ticket.digest, deadline, [waiter])
        return deadline

    async def _run(self, run_id: str, key: Key, meeting: _Meeting, offload: Offload) -> None:
        """Compute the meeting once, in a worker thread, and settle every waiting request."""
        meeting.running = True
        values = {p: part.value for p, part in meeting.parts.items()}
        try:
            results = await offload(partial(meeting.agenda.compute, values))
        except Exception as exc:  # the same refusal (or fault) for every party
            _settle(meeting, partial(_same, exc))
        except BaseException:  # this request was cancelled (a shutdown): not the others
            gone = ProblemError.internal(f"{meeting.agenda.what} was interrupted; send again")
            _settle(meeting, partial(_same, gone))
            raise
        else:
            _settle(meeting, results.get)
        finally:
            meetings = self._runs.get(run_id, {})
            if meetings.get(key) is meeting:
                del meetings[key]
            self.poke(run_id)
            self._forget_if_idle(run_id)

    def _refuse_at_once(self, run_id: str, ticket: Ticket) -> None:
        """A step that waited out of order before and is still not ready; an evaluation or
        prediction by a party that has not finished while another one waits to finish."""
        agenda = ticket.agenda
        if agenda.step is not None:
            applied = agenda.applied()
            seen = self._out_of_order.get(run_id, set())
            seen.difference_update({s for s in seen if applied is None or s[1] <= applied})
            if (ticket.party, agenda.step) in seen and not agenda.ready():
                what = f"{agenda.what} of party {ticket.party!r} waited already and is still ahead:"
                raise _out_of_order(what, applied)
        if ticket.key[0] in ("eval", "predict"):
            finish = self._runs.get(run_id, {}).get(("finish",))
            if finish is not None and ticket.party not in finish.parts:
                raise _finish_first(agenda.what, ticket.party, list(finish.parts))

    def _finishing(self, run_id: str, finish: _Meeting) -> None:
        """A party started to finish: every evaluation or prediction waiting for it can no
        longer meet it; the parties waiting there that have not finished must finish first."""
        for key, meeting in list(self._runs.get(run_id, {}).items()):
            if key[0] not in ("eval", "predict") or meeting.running:
                continue
            for party in [p for p in meeting.parts if p not in finish.parts]:
                problem = _finish_first(meeting.agenda.what, party, list(finish.parts))
                _fail([meeting.parts.pop(party)], problem)
            if not meeting.parts:
                del self._runs[run_id][key]

    def _gave_up(self, run_id: str, ticket: Ticket, meeting: _Meeting, waiter: Any) -> ProblemError:
        """The problem of a request whose wait ended; it leaves its meeting."""
        problem = self._incomplete(run_id, ticket.key, meeting, ticket.party)
        self._leave(run_id, ticket.key, meeting, ticket.party, waiter)
        if problem.type is ProblemType.STEP_OUT_OF_ORDER and meeting.agenda.step is not None:
            seen = self._out_of_order.setdefault(run_id, set())
            seen.add((ticket.party, meeting.agenda.step))
        return problem

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
        self._forget_if_idle(run_id)

    def _forget_if_idle(self, run_id: str) -> None:
        """A run with no waiting request keeps nothing here but its epoch and the steps that
        waited out of order (small, and needed until the run moves on)."""
        if not self._runs.get(run_id):
            self._runs.pop(run_id, None)
            nudge = self._nudges.pop(run_id, None)
            if nudge is not None and not nudge.done():
                nudge.cancel()

    def _incomplete(self, run_id: str, key: Key, meeting: _Meeting, party: str) -> ProblemError:
        """409 naming whom the request waited for: ``step-out-of-order`` for a step whose own
        party has not sent an earlier step that is not applied (that party is not where
        party B is, waiting would not help); else ``parties-incomplete``, naming the parties
        missing from its meeting or, for a complete step, from the oldest earlier step."""
        agenda, applied = meeting.agenda, meeting.agenda.applied()
        what, missing = agenda.what, meeting.missing()
        if agenda.step is not None and applied is not None:
            meetings = self._runs.get(run_id, {})
            for step in range(applied + 1, agenda.step):
                earlier = meetings.get(("step", str(step)))
                if earlier is None or party not in earlier.parts:
                    return _out_of_order(
                        f"{agenda.what} of party {party!r} waits for step {step}, which party "
                        f"{party!r} has not sent:",
                        applied,
                    )
                if not missing and earlier.missing():
                    what, missing = f"step {step}", earlier.missing()
        names = ", ".join(repr(p) for p in missing) or "no party (it was computing)"
        return ProblemError(
            ProblemType.PARTIES_INCOMPLETE,
            f"{agenda.what} waited {agenda.wait:g} s for {what} of {names}; send it again",
            waiting_for=what,
            missing_parties=missing,
            **({"applied_step": applied} if applied is not None else {}),
        )


def _same(value: Any, _party: str) -> Any:
    return value


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


def _fail(parts: Any, problem: ProblemError) -> None:
    for part in parts:
        for waiter in part.waiters:
            if not waiter.done():
                waiter.set_exception(problem)


def _out_of_order(what: str, applied: int | None) -> ProblemError:
    if applied is None:
        return ProblemError.run_state(f"{what} the run is not in memory; send it again")
    return ProblemError(
        ProblemType.STEP_OUT_OF_ORDER,
        f"{what} party B has applied step {applied} and expects {applied + 1}",
        expected_step=applied + 1,
        applied_step=applied,
    )


def _finish_first(what: str, party: str, finishing: list[str]) -> ProblemError:
    names = ", ".join(repr(p) for p in finishing)
    return ProblemError(
        ProblemType.CALL_OUT_OF_ORDER,
        f"{what} needs every party, and {names} finished the run's training: party {party!r} "
        "must finish first (POST .../finish), then evaluate or predict",
        expected_call="finish",
        finishing_parties=finishing,
    )


def _superseded(agenda: Agenda, party: str, *, computing: bool) -> ProblemError:
    when = "is being computed with" if computing else "was replaced by"
    return ProblemError(
        ProblemType.STEP_REPLAY_MISMATCH,
        f"{agenda.what} {when} another request of party {party!r} with other bytes",
        **({"applied_step": a} if (a := agenda.applied()) is not None else {}),
    )


def _rolled_back(agenda: Agenda) -> ProblemError:
    return _out_of_order(
        f"the run was rolled back while {agenda.what} was checked:", agenda.applied()
    )
