"""Bounded memory (``party_b.service.bounds``): party B keeps at most so many training runs
(or bytes) in memory; the least recently used run is checkpointed at its applied step and
leaves, and its next request loads it again -- which no answer and no model can tell."""

import threading
from pathlib import Path

from party_b.metrics import Metrics
from party_b.service import LiveBounds, Service, build_service
from party_b.service.bounds import footprint
from party_b.settings import Limits
from shared.training import state_sha256
from tests.utils.small_runs import SmallPartyB, SmallRun, aligned_in_process, small_party_b

RUNS, STEPS = 5, 7  # checkpoint_interval 2: runs leave memory at odd and even steps


def _service(party_b: SmallPartyB, bounds: LiveBounds | None = None) -> Service:
    return build_service(
        sessions=party_b.sessions,
        labels=party_b.labels,
        limits=Limits(),
        metrics=Metrics(),
        bounds=bounds,
    )


def _alone(tmp_path: Path, seed: int) -> tuple[list[bytes], str]:
    """The answers and final top model of one run trained by itself on a fresh party B."""
    party_b = small_party_b(tmp_path)
    service = _service(party_b)
    run = aligned_in_process(service, party_b.caller, seed=seed)
    answers = [service.steps.step(party_b.caller, run.id, run.step_body(t)) for t in range(1, 8)]
    return answers, _checksum(service, party_b, run)


def _checksum(service: Service, party_b: SmallPartyB, run: SmallRun) -> str:
    state = service.context.cache.owned(party_b.caller, run.id)
    with state.lock:
        return state_sha256(state.trainer.model.state_dict())


def test_more_runs_than_the_cap_trained_interleaved_end_bit_identical_to_each_alone(
    tmp_path: Path,
) -> None:
    # Prepare: five runs (different seeds), each trained alone for reference
    expected = {seed: _alone(tmp_path / f"alone-{seed}", seed) for seed in range(RUNS)}
    party_b = small_party_b(tmp_path / "capped")
    service = _service(party_b, LiveBounds(max_runs=2))
    runs = {seed: aligned_in_process(service, party_b.caller, seed=seed) for seed in range(RUNS)}
    cache = service.context.cache

    # Act: one step of each run in turn, so that every step but the first two loads its run
    # and sends another one out; each step is also sent twice (a lost answer)
    answers: dict[int, list[bytes]] = {seed: [] for seed in runs}
    most_in_memory = 0
    for t in range(1, STEPS + 1):
        for seed, run in runs.items():
            body = run.step_body(t)
            answer = service.steps.step(party_b.caller, run.id, body)
            assert service.steps.step(party_b.caller, run.id, body) == answer
            answers[seed].append(answer)
            most_in_memory = max(most_in_memory, len(cache._live))  # noqa: SLF001
    # a resend of a run's last step after it left memory: the answer stored with its checkpoint
    first = runs[0]
    assert cache.peek(first.id) is None
    assert service.steps.step(party_b.caller, first.id, first.step_body(STEPS)) == answers[0][-1]

    # Assert: every answer and every final model as if each run had trained alone
    assert most_in_memory == 2
    for seed, run in runs.items():
        reference_answers, reference_model = expected[seed]
        assert answers[seed] == reference_answers, seed
        assert _checksum(service, party_b, run) == reference_model, seed
        logged = [row.step for row in service.runs.step_log(party_b.caller, run.id, 0, 100)]
        assert logged == list(range(1, STEPS + 1))
        # the interval checkpoints party A rolls back to survive; one in between only while newest
        checkpoints = service.runs.get(party_b.caller, run.id).checkpoints
        assert checkpoints == [2, 4, 6, 7], checkpoints


def test_a_byte_budget_keeps_only_the_runs_that_fit(tmp_path: Path) -> None:
    party_b = small_party_b(tmp_path)
    probe = _service(party_b)
    run = aligned_in_process(probe, party_b.caller, seed=0)
    probe.steps.step(party_b.caller, run.id, run.step_body(1))
    state = probe.context.cache.owned(party_b.caller, run.id)
    with state.lock:
        one = footprint(state)
    assert one > 4 * 32 * 8  # at least the model, its gradients and the aligned keys

    service = _service(party_b, LiveBounds(max_bytes=int(2.5 * one)))
    runs = [run, *(aligned_in_process(service, party_b.caller, seed=s) for s in (1, 2, 3))]
    for r in runs:
        service.steps.step(party_b.caller, r.id, r.step_body(1))  # (probe's step 1 was lost)
        assert len(service.context.cache._live) <= 2  # noqa: SLF001
    # the least recently used left: the first two runs; the last two stayed
    assert [service.context.cache.peek(r.id) is not None for r in runs] == [
        False,
        False,
        True,
        True,
    ]


def test_a_request_waiting_for_a_run_that_is_leaving_memory_gets_it_back_whole(
    tmp_path: Path,
) -> None:
    """Steps of two runs race with a cap of one: each step sends the other run out while the
    other run's next step may already be waiting. Nothing is lost, nothing applied twice."""
    party_b = small_party_b(tmp_path / "capped")
    service = _service(party_b, LiveBounds(max_runs=1))
    runs = [aligned_in_process(service, party_b.caller, seed=s) for s in (0, 1)]
    answers: dict[int, list[bytes]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def train(index: int) -> None:
        try:
            for t in range(1, STEPS + 1):
                run = runs[index]
                answers[index].append(service.steps.step(party_b.caller, run.id, run.step_body(t)))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=train, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    for index in (0, 1):
        alone, model = _alone(tmp_path / f"alone-{index}", index)
        assert answers[index] == alone
        assert _checksum(service, party_b, runs[index]) == model


class _PausingLock:
    """A run's lock that stops the first ``pause_in`` thread just before it takes it, until
    ``go`` is set: the moment between finding a run in memory and locking it."""

    def __init__(self, pause_in: threading.Thread) -> None:
        self._lock = threading.Lock()
        self._pause_in = pause_in
        self.waiting, self.go = threading.Event(), threading.Event()

    def acquire(self, blocking: bool = True) -> bool:
        if threading.current_thread() is self._pause_in and not self.go.is_set():
            self.waiting.set()
            assert self.go.wait(30)
        return self._lock.acquire(blocking)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_exc: object) -> None:
        self.release()


def test_a_copy_that_left_memory_under_a_request_commits_nothing_and_the_step_goes_again(
    tmp_path: Path,
) -> None:
    """A step finds its run in memory; before it takes the run's lock, another run's load
    sends this one out (checkpointed, lease released). The step's commit is refused by the
    fence, and the step goes once more on a fresh load: one answer, the right one."""
    expected, model = _alone(tmp_path / "alone", 0)
    party_b = small_party_b(tmp_path / "capped")
    service = _service(party_b, LiveBounds(max_runs=1))
    run, other = (aligned_in_process(service, party_b.caller, seed=s) for s in (0, 1))
    for t in (1, 2, 3):
        assert service.steps.step(party_b.caller, run.id, run.step_body(t)) == expected[t - 1]
    answer: list[bytes] = []
    stepper = threading.Thread(
        target=lambda: answer.append(service.steps.step(party_b.caller, run.id, run.step_body(4)))
    )
    state = service.context.cache.owned(party_b.caller, run.id)
    state.lock = lock = _PausingLock(pause_in=stepper)  # type: ignore[assignment]
    stepper.start()
    assert lock.waiting.wait(30)  # the step holds the run's copy, not yet its lock
    service.steps.step(party_b.caller, other.id, other.step_body(1))  # sends the run out
    assert state.lease is None and service.context.cache.peek(run.id) is None
    lock.go.set()
    stepper.join(60)

    assert answer == [expected[3]]
    for t in range(5, STEPS + 1):
        assert service.steps.step(party_b.caller, run.id, run.step_body(t)) == expected[t - 1]
    assert _checksum(service, party_b, run) == model
    logged = [row.step for row in service.runs.step_log(party_b.caller, run.id, 0, 100)]
    assert logged == list(range(1, STEPS + 1))
