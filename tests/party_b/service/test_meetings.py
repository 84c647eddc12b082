"""Meetings on their own (party_b/service/meetings.py), on an event loop, with a thread pool
for the computations: the rules of docs/PROTOCOL.md section 12.4."""

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from api_schemas import ProblemType
from party_b.errors import ProblemError
from party_b.service.meetings import MAX_MEETINGS, Agenda, Meetings

T = TypeVar("T")
PARTIES = ("a", "b", "c")


async def offload(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


class Run:
    """What a step's agenda reads of a run: its applied step; counts the computations."""

    def __init__(self) -> None:
        self.applied = 0
        self.computed: list[dict[str, Any]] = []

    def step(self, t: int) -> Agenda:
        def compute(parts: dict[str, Any]) -> dict[str, Any]:
            self.computed.append(parts)
            self.applied = t
            return {p: f"{p}:{t}" for p in parts}

        return Agenda(
            what=f"step {t}",
            parties=PARTIES,
            compute=compute,
            ready=lambda: self.applied == t - 1,
            applied=lambda: self.applied,
            step=t,
        )


def _attend(meetings: Meetings, run: Run, party: str, t: int, sha: bytes = b"x") -> Any:
    return meetings.attend("r", ("step", str(t)), party, t, sha, run.step(t), offload, epoch=0)


def test_a_meeting_computes_once_when_every_part_is_in_and_answers_each_party() -> None:
    async def scenario() -> list[Any]:
        meetings, run = Meetings(wait=5), Run()
        return await asyncio.gather(*(_attend(meetings, run, p, 1) for p in PARTIES))

    assert asyncio.run(scenario()) == ["a:1", "b:1", "c:1"]


def test_steps_ahead_wait_for_their_predecessor_and_run_in_order() -> None:
    async def scenario() -> tuple[list[Any], Run]:
        meetings, run = Meetings(wait=5), Run()
        ahead = [_attend(meetings, run, p, 2) for p in PARTIES]  # pipelined: step 2 first
        first = [_attend(meetings, run, p, 1) for p in PARTIES]
        return await asyncio.gather(*ahead, *first), run

    answers, run = asyncio.run(scenario())
    assert answers == ["a:2", "b:2", "c:2", "a:1", "b:1", "c:1"]
    assert [sorted(parts.values()) for parts in run.computed] == [[1, 1, 1], [2, 2, 2]]


def test_the_same_bytes_again_join_their_part_and_other_bytes_replace_it() -> None:
    async def scenario() -> list[Any]:
        meetings, run = Meetings(wait=5), Run()
        first = asyncio.ensure_future(_attend(meetings, run, "a", 1, b"one"))
        again = asyncio.ensure_future(_attend(meetings, run, "a", 1, b"one"))
        await asyncio.sleep(0.05)
        other = asyncio.ensure_future(_attend(meetings, run, "b", 1, b"two"))
        replaced = asyncio.ensure_future(_attend(meetings, run, "b", 1, b"three"))
        await asyncio.sleep(0.05)
        last = _attend(meetings, run, "c", 1)
        return await asyncio.gather(first, again, other, replaced, last, return_exceptions=True)

    first, again, other, replaced, last = asyncio.run(scenario())
    assert first == again == "a:1" and replaced == "b:1" and last == "c:1"
    assert isinstance(other, ProblemError) and other.type == ProblemType.STEP_REPLAY_MISMATCH


def test_a_missing_party_is_named_when_the_wait_ends_and_the_part_is_forgotten() -> None:
    async def scenario() -> tuple[list[Any], dict[Any, list[str]]]:
        meetings, run = Meetings(wait=0.3), Run()
        answers = await asyncio.gather(
            _attend(meetings, run, "a", 1), _attend(meetings, run, "b", 1), return_exceptions=True
        )
        return answers, meetings.waiting("r")

    answers, left = asyncio.run(scenario())
    for answer in answers:
        assert isinstance(answer, ProblemError) and answer.type == ProblemType.PARTIES_INCOMPLETE
        assert "c" in answer.extensions["missing_parties"]
    assert left == {}  # nothing kept: the parties send again


def test_a_party_that_has_not_sent_an_earlier_step_is_told_where_the_run_is() -> None:
    """Party B restarted at step 0 while every party had sent step 3: waiting would not help
    (each waits at a step the others are not at); each is told to go back."""

    async def scenario() -> list[Any]:
        meetings, run = Meetings(wait=0.3), Run()
        return await asyncio.gather(
            *(_attend(meetings, run, p, 3) for p in PARTIES), return_exceptions=True
        )

    for answer in asyncio.run(scenario()):
        assert isinstance(answer, ProblemError) and answer.type == ProblemType.STEP_OUT_OF_ORDER
        assert answer.extensions == {"expected_step": 1, "applied_step": 0}


def test_a_reset_answers_the_waiting_requests_and_a_stale_check_is_refused() -> None:
    async def scenario() -> tuple[Any, Any]:
        meetings, run = Meetings(wait=30), Run()
        waiting = asyncio.ensure_future(_attend(meetings, run, "a", 1))
        await asyncio.sleep(0.05)
        epoch = meetings.epoch("r")  # a request checked before the rollback...
        meetings.reset("r", ProblemError.run_state("rolled back"), kinds=("step",))
        stale = meetings.attend("r", ("step", "1"), "b", 1, b"x", run.step(1), offload, epoch=epoch)
        return await asyncio.gather(waiting, stale, return_exceptions=True)

    waiting, stale = asyncio.run(scenario())
    assert isinstance(waiting, ProblemError) and waiting.detail == "rolled back"
    assert isinstance(stale, ProblemError) and stale.type == ProblemType.STEP_OUT_OF_ORDER


def test_a_failed_computation_answers_every_party_with_its_problem() -> None:
    def refuse(parts: dict[str, Any]) -> dict[str, Any]:
        raise ProblemError(ProblemType.TRAINING_DIVERGED, "NaN", applied_step=0)

    async def scenario() -> list[Any]:
        meetings = Meetings(wait=5)
        agenda = Agenda("step 1", PARTIES, refuse, step=1)
        calls = [
            meetings.attend("r", ("step", "1"), p, None, b"x", agenda, offload, epoch=0)
            for p in PARTIES
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(scenario())
    assert all(
        isinstance(a, ProblemError) and a.type == ProblemType.TRAINING_DIVERGED for a in answers
    )


def test_a_run_holds_a_bounded_number_of_meetings() -> None:
    async def scenario() -> None:
        meetings, run = Meetings(wait=30), Run()
        waiting = [
            asyncio.ensure_future(
                meetings.attend(
                    "r", ("predict", str(i)), "a", i, b"x", run.step(10**6), offload, epoch=0
                )
            )
            for i in range(MAX_MEETINGS)
        ]
        await asyncio.sleep(0.05)
        with pytest.raises(ProblemError) as refused:
            await meetings.attend(
                "r", ("predict", "one more"), "a", 0, b"x", run.step(1), offload, epoch=0
            )
        assert refused.value.type == ProblemType.LIMIT_EXCEEDED
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert meetings.waiting("r") == {}  # the cancelled requests took their parts along

    asyncio.run(scenario())
