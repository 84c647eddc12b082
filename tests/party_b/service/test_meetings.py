"""Meetings on their own (party_b/service/meetings.py), on an event loop, with worker threads
for the computations: the rules of docs/PROTOCOL.md sections 11 and 12.4 and 12.7.

The tests order their requests by the event loop alone: a request attended with
``_started`` has joined its meeting when ``_started`` returns (``asyncio.sleep(0)`` yields
once to it); no test's verdict depends on how long anything takes."""

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from api_schemas import ProblemType
from party_b.errors import ProblemError
from party_b.service.meetings import MAX_MEETINGS, Agenda, Meetings, Ticket, at_once, now

T = TypeVar("T")
PARTIES = ("a", "b", "c")
LONG = 60.0  # a wait no test waits out
SHORT = 0.05  # a wait every test that needs one waits out


async def offload(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


class Run:
    """What an agenda reads of a run: its applied step; counts the computations."""

    def __init__(self, parties: tuple[str, ...] = PARTIES, wait: float = LONG) -> None:
        self.parties = parties
        self.wait = wait
        self.applied = 0
        self.computed: list[tuple[str, dict[str, Any]]] = []

    def _agenda(self, what: str, compute: Callable[[dict[str, Any]], dict[str, Any]]) -> Agenda:
        return Agenda(what, self.parties, compute, wait=self.wait)

    def step(self, t: int) -> Agenda:
        def compute(parts: dict[str, Any]) -> dict[str, Any]:
            self.computed.append((f"step {t}", parts))
            self.applied = t
            return {p: f"{p}:{t}" for p in parts}

        return Agenda(
            what=f"step {t}",
            parties=self.parties,
            compute=compute,
            wait=self.wait,
            ready=lambda: self.applied >= t - 1,
            applied=lambda: self.applied,
            step=t,
        )

    def served(self, kind: str) -> Agenda:
        def compute(parts: dict[str, Any]) -> dict[str, Any]:
            self.computed.append((kind, parts))
            return {p: f"{p}:{kind}" for p in parts}

        return self._agenda(kind, compute)


def _ticket(run: Run, party: str, key: tuple[str, ...], digest: bytes = b"x") -> Ticket:
    agenda = run.step(int(key[1])) if key[0] == "step" else run.served(key[0])
    return Ticket(key, party, f"{party}'s part", digest, agenda)


def _attend(meetings: Meetings, run: Run, party: str, t: int, digest: bytes = b"x") -> Any:
    return meetings.attend("r", _ticket(run, party, ("step", str(t)), digest), offload, epoch=0)


async def _started(coroutine: Coroutine[Any, Any, T]) -> "asyncio.Task[T]":
    """The request as a task that has joined its meeting (it runs until it first waits)."""
    task = asyncio.ensure_future(coroutine)
    await asyncio.sleep(0)
    return task


async def _outcome(task: "asyncio.Task[Any]") -> Any:
    try:
        return await task
    except ProblemError as problem:
        return problem


def _type(answer: Any) -> ProblemType | None:
    return answer.type if isinstance(answer, ProblemError) else None


def test_a_meeting_computes_once_when_every_part_is_in_and_answers_each_party() -> None:
    async def scenario() -> list[Any]:
        meetings, run = Meetings(), Run()
        return await asyncio.gather(*(_attend(meetings, run, p, 1) for p in PARTIES))

    assert asyncio.run(scenario()) == ["a:1", "b:1", "c:1"]


def test_steps_ahead_wait_for_their_predecessor_and_run_in_order() -> None:
    async def scenario() -> tuple[list[Any], Run]:
        meetings, run = Meetings(), Run()
        ahead = [await _started(_attend(meetings, run, p, 2)) for p in PARTIES]  # pipelined
        first = [_attend(meetings, run, p, 1) for p in PARTIES]
        return await asyncio.gather(*ahead, *first), run

    answers, run = asyncio.run(scenario())
    assert answers == ["a:2", "b:2", "c:2", "a:1", "b:1", "c:1"]
    assert [what for what, _parts in run.computed] == ["step 1", "step 2"]


def test_a_step_of_one_party_ahead_of_its_predecessor_waits_and_goes_when_poked() -> None:
    """A run with one feature party: its steps are computed at once (``at_once``) unless one
    overtook its predecessor; that one waits until a poke says the run moved."""

    async def scenario() -> tuple[Any, Any, Run]:
        meetings, run = Meetings(), Run(parties=("a",))
        early = _ticket(run, "a", ("step", "2"))
        assert at_once(early, str) is early  # its predecessor is not applied: it waits
        waiting = await _started(meetings.attend("r", early, offload, epoch=0))
        first = at_once(_ticket(run, "a", ("step", "1")), str)  # computed in this thread
        meetings.poke("r")
        return first, await waiting, run

    first, second, run = asyncio.run(scenario())
    assert (first, second) == ("a:1", "a:2")
    assert [what for what, _parts in run.computed] == ["step 1", "step 2"]


def test_a_caller_that_cannot_wait_is_refused_what_would_wait() -> None:
    run = Run(parties=("a",))
    with pytest.raises(ProblemError) as ahead:
        now(at_once(_ticket(run, "a", ("step", "2")), str))
    assert ahead.value.type == ProblemType.STEP_OUT_OF_ORDER
    assert ahead.value.extensions == {"expected_step": 1, "applied_step": 0}
    with pytest.raises(ProblemError) as alone:
        now(at_once(_ticket(Run(), "a", ("eval",)), str))
    assert alone.value.type == ProblemType.PARTIES_INCOMPLETE
    assert alone.value.extensions["missing_parties"] == ["b", "c"]


def test_the_same_message_again_joins_its_part_and_another_replaces_it() -> None:
    async def scenario() -> list[Any]:
        meetings, run = Meetings(), Run()
        first = await _started(_attend(meetings, run, "a", 1, b"one"))
        again = await _started(_attend(meetings, run, "a", 1, b"one"))
        other = await _started(_attend(meetings, run, "b", 1, b"two"))
        replaced = await _started(_attend(meetings, run, "b", 1, b"three"))
        last = await _started(_attend(meetings, run, "c", 1))
        return [await _outcome(t) for t in (first, again, other, replaced, last)]

    first, again, other, replaced, last = asyncio.run(scenario())
    assert first == again == "a:1" and replaced == "b:1" and last == "c:1"
    assert _type(other) == ProblemType.STEP_REPLAY_MISMATCH


def test_a_missing_party_is_named_when_the_wait_ends_and_the_part_is_forgotten() -> None:
    async def scenario() -> tuple[list[Any], dict[Any, list[str]]]:
        meetings, run = Meetings(), Run(wait=SHORT)
        answers = await asyncio.gather(
            _attend(meetings, run, "a", 1), _attend(meetings, run, "b", 1), return_exceptions=True
        )
        return answers, meetings.waiting("r")

    answers, left = asyncio.run(scenario())
    for answer in answers:
        assert _type(answer) == ProblemType.PARTIES_INCOMPLETE
        assert "c" in answer.extensions["missing_parties"]
    assert left == {}  # nothing kept: the parties send again


def test_a_party_that_has_not_sent_an_earlier_step_is_told_where_the_run_is() -> None:
    """Party B restarted at step 0 while every party had sent step 3: waiting would not help
    (each waits at a step the others are not at); each is told to go back, and the same
    step sent again is told at once."""

    async def scenario() -> tuple[list[Any], Any]:
        meetings, run = Meetings(), Run(wait=SHORT)
        answers = await asyncio.gather(
            *(_attend(meetings, run, p, 3) for p in PARTIES), return_exceptions=True
        )
        run.wait = LONG  # the resend would wait a minute if it waited
        again = await _outcome(await _started(_attend(meetings, run, "a", 3)))
        return answers, again

    answers, again = asyncio.run(scenario())
    for answer in [*answers, again]:
        assert _type(answer) == ProblemType.STEP_OUT_OF_ORDER
        assert answer.extensions == {"expected_step": 1, "applied_step": 0}


def test_a_refused_step_refuses_the_later_steps_of_its_party_that_wait() -> None:
    async def scenario() -> list[Any]:
        meetings, run = Meetings(), Run()
        waiting = [await _started(_attend(meetings, run, "a", t)) for t in (2, 3)]
        others = await _started(_attend(meetings, run, "b", 2))
        meetings.refused("r", "a", 1)  # party a's step 1 was refused (say, 409 batch-mismatch)
        answers = [await _outcome(t) for t in waiting]
        answers.append(meetings.waiting("r"))
        others.cancel()
        return answers

    second, third, left = asyncio.run(scenario())
    assert _type(second) == _type(third) == ProblemType.STEP_OUT_OF_ORDER
    assert left == {("step", "2"): ["b"]}  # the other party's part waits on


def test_a_reset_answers_the_waiting_requests_and_a_stale_check_is_refused() -> None:
    async def scenario() -> tuple[Any, Any]:
        meetings, run = Meetings(), Run()
        waiting = await _started(_attend(meetings, run, "a", 1))
        epoch = meetings.epoch("r")  # a request checked before the rollback ...
        problem = ProblemError(ProblemType.STEP_OUT_OF_ORDER, "rolled back", applied_step=0)
        meetings.reset("r", problem, kinds=("step", "finish"))
        stale = meetings.attend("r", _ticket(run, "b", ("step", "1")), offload, epoch=epoch)
        return await _outcome(waiting), await _outcome(asyncio.ensure_future(stale))

    waiting, stale = asyncio.run(scenario())
    assert _type(waiting) == ProblemType.STEP_OUT_OF_ORDER
    assert _type(stale) == ProblemType.STEP_OUT_OF_ORDER  # ... attends after it: refused


def test_a_failed_computation_answers_every_party_with_its_problem() -> None:
    def fails(parts: dict[str, Any]) -> dict[str, Any]:
        raise ProblemError(ProblemType.TRAINING_DIVERGED, "nan loss")

    async def scenario() -> list[Any]:
        meetings = Meetings()
        agenda = Agenda("step 1", PARTIES, fails, wait=LONG, step=1)
        tickets = [Ticket(("step", "1"), p, None, b"x", agenda) for p in PARTIES]
        return await asyncio.gather(
            *(meetings.attend("r", t, offload, epoch=0) for t in tickets), return_exceptions=True
        )

    assert {_type(a) for a in asyncio.run(scenario())} == {ProblemType.TRAINING_DIVERGED}


def test_a_run_holds_a_bounded_number_of_meetings() -> None:
    async def scenario() -> Any:
        meetings, run = Meetings(), Run()
        waiting = [
            await _started(_attend(meetings, run, "a", t)) for t in range(2, 2 + MAX_MEETINGS)
        ]
        over = await _outcome(await _started(_attend(meetings, run, "a", 2 + MAX_MEETINGS)))
        for task in waiting:
            task.cancel()
        return over

    assert _type(asyncio.run(scenario())) == ProblemType.LIMIT_EXCEEDED


# ------------------------------------------------------------------ the end of a run


def _attend_end(meetings: Meetings, run: Run, party: str, kind: str) -> Any:
    return meetings.attend("r", _ticket(run, party, (kind,)), offload, epoch=0)


def test_an_evaluation_while_another_party_finishes_is_told_to_finish_first() -> None:
    """Party a finishes (and waits for the others); party b evaluates: it cannot meet a,
    which evaluates after the end, so it is told at once to finish first, and the run ends
    and evaluates whichever order each party chose."""

    async def scenario() -> tuple[Any, list[Any], list[Any], Run]:
        meetings, run = Meetings(), Run(parties=("a", "b"))
        finishing = await _started(_attend_end(meetings, run, "a", "finish"))
        early = await _outcome(await _started(_attend_end(meetings, run, "b", "eval")))
        ended = await asyncio.gather(finishing, _attend_end(meetings, run, "b", "finish"))
        evaluated = await asyncio.gather(
            *(_attend_end(meetings, run, p, "eval") for p in ("a", "b"))
        )
        return early, ended, evaluated, run

    early, ended, evaluated, run = asyncio.run(scenario())
    assert _type(early) == ProblemType.CALL_OUT_OF_ORDER
    assert early.extensions == {"expected_call": "finish", "finishing_parties": ["a"]}
    assert ended == ["a:finish", "b:finish"] and evaluated == ["a:eval", "b:eval"]
    assert [what for what, _parts in run.computed] == ["finish", "eval"]


def test_a_party_that_starts_to_finish_releases_the_evaluations_waiting_for_it() -> None:
    """Party b evaluates first (and waits for a); party a finishes: b's evaluation can never
    meet a's, so b is told at once to finish first; both finish, then both evaluate."""

    async def scenario() -> tuple[Any, list[Any], Run]:
        meetings, run = Meetings(), Run(parties=("a", "b"))
        evaluating = await _started(_attend_end(meetings, run, "b", "eval"))
        finishing = await _started(_attend_end(meetings, run, "a", "finish"))
        told = await _outcome(evaluating)
        rest = await asyncio.gather(finishing, _attend_end(meetings, run, "b", "finish"))
        return told, rest, run

    told, rest, run = asyncio.run(scenario())
    assert _type(told) == ProblemType.CALL_OUT_OF_ORDER
    assert told.extensions["expected_call"] == "finish"
    assert rest == ["a:finish", "b:finish"]
    assert [what for what, _parts in run.computed] == ["finish"]
