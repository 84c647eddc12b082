"""Run leases (``party_b.store.leases``): every claim fences the copies loaded before it, on
SQLite and on a real PostgreSQL, where a takeover and a commit of the old holder are ordered
by the lease row's lock."""

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import RunStatus
from party_b import auth, store
from tests.utils.databases import fresh_database

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with fresh_database(request.param, tmp_path) as url:
        engine = store.make_engine(url)
        yield store.make_session_factory(engine)
        engine.dispose()


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with fresh_database("postgresql", tmp_path) as url:
        engine = store.make_engine(url)
        yield store.make_session_factory(engine)
        engine.dispose()


def _run(sessions: sessionmaker[Session]) -> str:
    """A training run row (owner, config and key as the service would store them)."""
    with sessions() as session:
        auth.register_token(session, "alice", f"alice-token-{uuid.uuid4().hex}")
        owner = store.token_named(session, "alice")
        assert owner is not None
        run = store.Run(
            id=uuid.uuid4().hex,
            owner_id=owner.id,
            name="leased",
            status=RunStatus.TRAINING.value,
            config={},
            alignment_key="00" * 32,
            num_classes=2,
            side_features=0,
        )
        store.add_run(session, run, None)
        session.commit()
        return run.id


def _log(session: Session, run_id: str, step: int) -> None:
    store.log_step(
        session, run_id=run_id, step=step, loss=None, accuracy=None, bytes_in=0, bytes_out=0,
        decode_ms=0.0, compute_ms=0.0, total_ms=0.0,
    )  # fmt: skip


def test_each_claim_fences_the_copies_before_it_and_a_release_frees_the_run(
    sessions: sessionmaker[Session],
) -> None:
    run_id = _run(sessions)
    with sessions() as session:
        assert store.is_free(session, run_id) and store.lease_of(session, run_id) is None
        first = store.claim(session, run_id, "replica-1")
        session.commit()
    with sessions() as session:
        second = store.claim(session, run_id, "replica-2")
        session.commit()
    assert (first, second) == (1, 2)
    with sessions() as session:
        assert not store.fence(session, run_id, first)  # the older copy commits nothing
        assert store.fence(session, run_id, second)
        assert store.lease_of(session, run_id) == ("replica-2", 2)
        assert not store.is_free(session, run_id)
        assert not store.release(session, run_id, first)  # only the holder releases
        assert store.release(session, run_id, second)
        session.commit()
    with sessions() as session:
        assert store.is_free(session, run_id) and store.lease_of(session, run_id) == (None, 3)
        assert not store.fence(session, run_id, second)  # released: no copy holds it now
        assert store.claim(session, run_id, "replica-1") == 4
        session.commit()


def test_a_deleted_run_takes_its_lease_with_it(sessions: sessionmaker[Session]) -> None:
    run_id = _run(sessions)
    with sessions() as session:
        token = store.claim(session, run_id, "replica-1")
        session.commit()
    with sessions() as session:
        store.delete_run(session, run_id)
        session.commit()
    with sessions() as session:
        assert store.lease_of(session, run_id) is None
        assert not store.fence(session, run_id, token)


def test_a_takeover_waits_for_the_commit_in_flight_and_reads_what_it_wrote(
    postgres: sessionmaker[Session],
) -> None:
    """The holder has fenced and is writing step 5 when another replica claims the run: the
    claim waits for that commit, and the same transaction then sees step 5."""
    run_id = _run(postgres)
    with postgres() as session:
        token = store.claim(session, run_id, "replica-1")
        session.commit()
    fenced, committed_at = threading.Event(), [0.0]

    def holder_commits_step_5() -> None:
        with postgres() as session:
            assert store.fence(session, run_id, token)
            _log(session, run_id, 5)
            session.flush()
            fenced.set()
            time.sleep(0.5)
            committed_at[0] = time.monotonic()
            session.commit()

    thread = threading.Thread(target=holder_commits_step_5)
    thread.start()
    assert fenced.wait(10)
    with postgres() as session:
        taken = store.claim(session, run_id, "replica-2")
        claimed_at = time.monotonic()
        logged = [row.step for row in store.step_log(session, run_id, 0, 10)]
        session.commit()
    thread.join(10)
    assert claimed_at >= committed_at[0] > 0  # it waited for the holder's commit
    assert (taken, logged) == (token + 1, [5])


def test_a_commit_after_a_takeover_is_refused(postgres: sessionmaker[Session]) -> None:
    """The other way round: the claim is in flight when the old holder reaches its commit;
    its fence waits for the claim and then refuses."""
    run_id = _run(postgres)
    with postgres() as session:
        token = store.claim(session, run_id, "replica-1")
        session.commit()
    claimed, fenced = threading.Event(), []

    def old_holder() -> None:
        assert claimed.wait(10)
        with postgres() as session:
            fenced.append(store.fence(session, run_id, token))
            session.rollback()

    thread = threading.Thread(target=old_holder)
    thread.start()
    with postgres() as session:
        store.claim(session, run_id, "replica-2")
        claimed.set()
        time.sleep(0.3)  # the old holder's fence is waiting on the row now
        assert fenced == []
        session.commit()
    thread.join(10)
    assert fenced == [False]
