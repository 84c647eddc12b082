"""The operator's queries (party_b/store/overview.py) on SQLite and PostgreSQL alike."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from party_b import auth, store
from party_b.store import overview
from tests.utils.databases import fresh_database

LONG_AGO = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def session(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Session]:
    with fresh_database(request.param, tmp_path) as url:
        engine: Engine = store.make_engine(url)
        with store.make_session_factory(engine)() as made:
            _fill(made)
            yield made
        engine.dispose()


def _run(run_id: str, owner_id: int, status: str) -> store.Run:
    return store.Run(
        id=run_id, owner_id=owner_id, name=f"name-{run_id}", status=status, config={"steps": 9},
        alignment_key="k", num_classes=2, side_features=0,
    )  # fmt: skip


def _fill(session: Session) -> None:
    """alice: 'live' (training, steps 1-7, checkpoint 5, two evaluations of 'eval', one of
    'train'); bob: 'old' (finished long ago, steps 1-2) and 'new' (created, no steps)."""
    for name in ("alice", "bob"):
        auth.register_token(session, name, f"{name}-token-0123456789")
    alice, bob = session.scalars(select(store.ApiToken.id).order_by(store.ApiToken.name)).all()
    session.add_all([_run("live", alice, "training"), _run("old", bob, "finished")])
    session.add(_run("new", bob, "created"))
    session.flush()
    for step in range(1, 8):
        store.log_step(
            session, run_id="live", step=step, loss=float(step),
            accuracy=None if step == 2 else 0.5, bytes_in=100 + step, bytes_out=1000,
            decode_ms=1.0, compute_ms=1.0, total_ms=step,
        )  # fmt: skip
    for step in (1, 2):
        store.log_step(
            session, run_id="old", step=step, loss=1.0, accuracy=1.0, bytes_in=10, bytes_out=20,
            decode_ms=1.0, compute_ms=1.0, total_ms=1.0, created_at=LONG_AGO,
        )  # fmt: skip
    store.save_checkpoint(
        session, run_id="live", step=5, model_state=b"m", optimizer_state=b"o",
        request_sha256=None, response=None, keep=3,
    )  # fmt: skip
    for step, split, loss in ((3, "eval", 0.9), (6, "eval", 0.4), (6, "train", 0.3)):
        store.log_evaluation(
            session, run_id="live", step=step, split=split, n=10, loss=loss,
            metrics={"accuracy": 1 - loss},
        )  # fmt: skip
    session.execute(
        update(store.Run)
        .where(store.Run.id == "old")
        .values(updated_at=LONG_AGO, created_at=LONG_AGO)
    )
    session.commit()


def test_runs_of_every_owner_with_their_owners(session: Session) -> None:
    every = overview.runs_with_owners(session, limit=10)
    recent = overview.runs_with_owners(
        session, limit=10, finished=("finished", datetime.now(UTC) - timedelta(days=1))
    )

    assert {(run.id, owner) for run, owner in every} == {
        ("live", "alice"), ("old", "bob"), ("new", "bob"),
    }  # fmt: skip
    assert every[-1][0].id == "old"  # newest first
    assert {run.id for run, _ in recent} == {"live", "new"}
    assert [run.id for run, _ in overview.runs_with_owners(session, limit=5, run_id="old")] == [
        "old"
    ]
    assert overview.runs_by_status(session) == {"training": 1, "finished": 1, "created": 1}


def test_step_log_aggregates(session: Session) -> None:
    ids = ["live", "old", "new"]
    totals = overview.step_totals(session, ids)
    logged = overview.last_logged(session, ids)
    last = overview.last_steps(session, ids)

    assert set(totals) == set(logged) == set(last) == {"live", "old"}
    assert (totals["live"].steps, totals["live"].last_step) == (7, 7)
    assert (totals["live"].bytes_in, totals["live"].bytes_out) == (sum(range(101, 108)), 7000)
    assert logged["old"] == (2, LONG_AGO) and logged["live"][0] == 7
    assert logged["live"][1].tzinfo is not None
    assert (last["live"].step, last["live"].loss) == (7, 7.0)
    assert overview.newest_checkpoints(session, ids) == {"live": 5}
    assert overview.steps_since(session, LONG_AGO + timedelta(days=1)) == 7
    assert [row.step for row in overview.recent_steps(session, "live", 3)] == [7, 6, 5]


def test_curves_in_buckets_of_steps(session: Session) -> None:
    buckets = overview.step_buckets(session, "live", 3)

    assert [(b.first, b.last, b.steps) for b in buckets] == [(1, 3, 3), (4, 6, 3), (7, 7, 1)]
    assert [b.loss for b in buckets] == pytest.approx([2.0, 5.0, 7.0])
    assert [b.accuracy for b in buckets] == pytest.approx([0.5, 0.5, 0.5])  # step 2 has none
    assert [b.bytes_in for b in buckets] == [306, 315, 107]
    assert [b.step_ms for b in buckets] == pytest.approx([2.0, 5.0, 7.0])
    assert overview.step_buckets(session, "new", 3) == []


def test_the_newest_evaluation_of_each_split(session: Session) -> None:
    newest = overview.latest_evaluations(session, ["live", "old"])

    assert sorted((e.split, e.step, e.loss) for e in newest["live"]) == [
        ("eval", 6, 0.4), ("train", 6, 0.3),
    ]  # fmt: skip
    assert "old" not in newest
