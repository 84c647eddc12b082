"""Replicas on one database (``party_b.service.ownership``): a replica that gets a run it
does not hold takes it over, and the copy the previous holder kept applies nothing more."""

import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine

from api_schemas import ProblemType, RunCreate
from party_b import auth, store
from party_b.errors import ProblemError
from party_b.metrics import Metrics
from party_b.service import Caller, Service, build_service
from party_b.service.ownership import once_more_if_moved
from party_b.settings import Limits
from tests.utils.databases import fresh_database
from tests.utils.small_runs import (
    OTHER,
    TOKEN,
    SmallPartyB,
    aligned_in_process,
    run_spec,
    small_party_b,
)


def _replica(party_b: SmallPartyB, name: str) -> Service:
    return build_service(
        sessions=party_b.sessions,
        labels=party_b.labels,
        limits=Limits(),
        metrics=Metrics(),
        replica_id=name,
    )


def test_a_takeover_fences_the_old_holders_copy(tmp_path: Path) -> None:
    # Prepare: replica one trains the run to step 3 (checkpoint at 2)
    party_b = small_party_b(tmp_path)
    one, two = _replica(party_b, "one"), _replica(party_b, "two")
    caller = party_b.caller
    run = aligned_in_process(one, caller)
    reference = [one.steps.step(caller, run.id, run.step_body(t)) for t in (1, 2, 3)]

    # Act: the load balancer now sends the run to replica two. A read there shows the newest
    # checkpoint (step 2) and takes no lease; the step takes the run over at that checkpoint
    # and applies step 3 again (party A's replay), then step 4
    assert two.runs.get(caller, run.id).step == 2
    with party_b.sessions() as session:
        assert store.lease_of(session, run.id) == ("one", 1)
    assert two.steps.step(caller, run.id, run.step_body(3)) == reference[2]
    with party_b.sessions() as session:
        assert store.lease_of(session, run.id) == ("two", 2)
    step_4 = two.steps.step(caller, run.id, run.step_body(4))

    # Assert: replica one's copy (at step 3) cannot apply step 4 a second time: its commit is
    # refused, and the step goes again on a fresh load (replica one takes the run back, at
    # replica two's checkpoint of step 4), which answers it from that checkpoint
    assert one.steps.step(caller, run.id, run.step_body(4)) == step_4
    with party_b.sessions() as session:
        assert store.lease_of(session, run.id) == ("one", 3)
    logged = [row.step for row in one.runs.step_log(caller, run.id, 0, 100)]
    assert logged == [1, 2, 3, 4]


def test_a_stale_copy_is_refused_rather_than_rolling_the_run_back(tmp_path: Path) -> None:
    """Replica one still holds the run at step 3 when replica two has gone on to step 6.
    Without the fence, replica one's resume to its checkpoint would delete replica two's
    steps; with it, the resume loads the run first and rolls back what the run really has."""
    party_b = small_party_b(tmp_path)
    one, two = _replica(party_b, "one"), _replica(party_b, "two")
    caller = party_b.caller
    run = aligned_in_process(one, caller)
    for t in (1, 2, 3):
        one.steps.step(caller, run.id, run.step_body(t))
    for t in (3, 4, 5, 6):  # step 3 takes it over at 2
        two.steps.step(caller, run.id, run.step_body(t))

    out = one.steps.resume(caller, run.id, 4)

    assert out.step == 4 and out.checkpoints == [2, 4]
    logged = [row.step for row in one.runs.step_log(caller, run.id, 0, 100)]
    assert logged == [1, 2, 3, 4]


def test_a_second_takeover_in_one_request_reaches_the_client_as_run_moved() -> None:
    calls = []

    def always_moved() -> None:
        calls.append(1)
        raise ProblemError(ProblemType.RUN_MOVED, "taken over")

    with pytest.raises(ProblemError) as refused:
        once_more_if_moved(always_moved)
    assert len(calls) == 2 and refused.value.status == 503


def test_on_a_shared_database_a_copy_left_behind_is_never_read(tmp_path: Path) -> None:
    """On PostgreSQL replica one still holds the run at step 3 when replica two has moved it
    to step 6. What replica one answers next is the run as it is: its list and GET show
    step 6 (a stale step 3 sent party A's rollback looking for a checkpoint it no longer
    had), and step 7 applies instead of a 409 from the copy."""
    with fresh_database("postgresql", tmp_path) as url:
        engine = store.make_engine(url)
        try:
            party_b = _on(engine, small_party_b(tmp_path))
            one, two = _replica(party_b, "one"), _replica(party_b, "two")
            caller = party_b.caller
            run = aligned_in_process(one, caller)
            for t in (1, 2, 3):
                one.steps.step(caller, run.id, run.step_body(t))
            two.runs.get(caller, run.id)  # takes it over at 2
            for t in (3, 4, 5, 6):
                two.steps.step(caller, run.id, run.step_body(t))

            assert [r.step for r in one.runs.list_runs(caller)] == [6]  # not its copy's 3
            assert one.runs.get(caller, run.id).step == 6
            one.steps.step(caller, run.id, run.step_body(7))
            assert one.runs.get(caller, run.id).step == 7
        finally:
            engine.dispose()


def _on(engine: Engine, party_b: SmallPartyB) -> SmallPartyB:
    """The same party B's labels and tokens on another database."""
    sessions = store.make_session_factory(engine)
    callers = []
    with sessions() as session:
        for name, token in (("tester", TOKEN), ("other", OTHER)):
            auth.register_token(session, name, token)
            row = auth.authenticate(session, token)
            assert row is not None
            callers.append(Caller(token_id=row.id, name=row.name))
    return SmallPartyB(sessions, party_b.labels, callers[0], callers[1])


def test_the_run_quota_holds_across_replicas(tmp_path: Path) -> None:
    """Eight creations at once, alternating between two replicas on PostgreSQL, with a quota
    of one open run: one run is created, seven get 429 (each replica's own lock alone let one
    through per replica)."""
    with fresh_database("postgresql", tmp_path) as url:
        engine = store.make_engine(url)
        try:
            party_b = _on(engine, small_party_b(tmp_path))
            replicas = [
                build_service(
                    sessions=party_b.sessions,
                    labels=party_b.labels,
                    limits=Limits(max_runs_per_token=1),
                    metrics=Metrics(),
                    replica_id=name,
                )
                for name in ("one", "two")
            ]
            spec = RunCreate.model_validate(run_spec())
            start = threading.Barrier(8)
            outcomes: list[int] = []

            def create(i: int) -> None:
                start.wait(30)
                try:
                    replicas[i % 2].runs.create(party_b.caller, spec)
                    outcomes.append(201)
                except ProblemError as exc:
                    outcomes.append(exc.status)

            threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert sorted(outcomes) == [201] + [429] * 7
        finally:
            engine.dispose()
