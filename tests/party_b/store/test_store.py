"""Party B's store on SQLite and on a real PostgreSQL server: tokens, runs, checkpoints, PSI
keys, a training run through the service, and copying the state from SQLite to another URL."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from party_a.errors import problem_from_body
from party_a.features import load_features
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_b import auth, store
from party_b.inprocess import InProcessTransport
from party_b.labels import load_label_table
from party_b.metrics import Metrics
from party_b.ops.cli import main as main_b
from party_b.service import Caller, build_service
from party_b.settings import Limits
from shared.demo_data import write_party_a_demo, write_party_b_demo
from tests.utils.databases import fresh_database
from tests.utils.party_a import breast_config

BACKENDS = ["sqlite", "postgresql"]
TOKEN = "alice-token-0123456789"


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with fresh_database(request.param, tmp_path) as url:
        made = store.make_engine(url)
        yield made
        made.dispose()


def _demo(directory: Path, overlap: float = 1.0) -> tuple[Path, Path]:
    """The bundled demo data: (party A's features, party B's labels)."""
    return (
        write_party_a_demo(directory / "features.csv", overlap=overlap),
        write_party_b_demo(directory / "labels.csv", overlap=overlap),
    )


def _run(owner_id: int, run_id: str = "r" * 32) -> store.Run:
    return store.Run(
        id=run_id,
        owner_id=owner_id,
        name="run",
        status="training",
        config={"nested": {"list": [1, 2, 3]}, "lr": 0.003},
        alignment_key="ab" * 32,
        num_classes=2,
        side_features=10,
        aligned_ids=bytes(range(256)) * 4,
    )


def test_tokens_issue_authenticate_and_revoke(engine: Engine) -> None:
    sessions = store.make_session_factory(engine)
    with sessions() as session:
        token = auth.issue_token(session, "alice")
        auth.register_token(session, "bob", "bob-token-0123456789")

        alice = auth.authenticate(session, token)
        revoked = auth.revoke_token(session, "alice")
        after = auth.authenticate(session, token)
        bob = auth.authenticate(session, "bob-token-0123456789")

    assert alice is not None and alice.name == "alice"
    assert revoked and after is None
    assert bob is not None and bob.name == "bob"


def test_checkpoints_are_pruned_rolled_back_and_keep_their_bytes(engine: Engine) -> None:
    sessions = store.make_session_factory(engine)
    blob = bytes(range(256)) * 4096  # 1 MiB of every byte value
    with sessions() as session:
        auth.register_token(session, "alice", TOKEN)
        owner = auth.authenticate(session, TOKEN)
        assert owner is not None
        session.add(_run(owner.id))
        session.commit()
        for step in (0, 25, 50, 75, 100):
            store.save_checkpoint(
                session,
                run_id="r" * 32,
                step=step,
                model_state=blob + step.to_bytes(2, "big"),
                optimizer_state=b"opt",
                request_sha256=None if step == 0 else b"\x00" * 32,
                response=b"\x81\xa1v\x01",
                keep=3,
            )
            session.commit()

        kept = store.checkpoint_steps(session, "r" * 32)
        newest = store.load_checkpoint(session, "r" * 32)
        store.forget_after(session, "r" * 32, 50)
        session.commit()
        after_rollback = store.checkpoint_steps(session, "r" * 32)
        run = session.get(store.Run, "r" * 32)

    assert kept == [50, 75, 100]
    assert newest is not None and newest.step == 100
    assert newest.model_state == blob + (100).to_bytes(2, "big")
    assert after_rollback == [50]
    assert run is not None and run.config == {"nested": {"list": [1, 2, 3]}, "lr": 0.003}
    assert run.aligned_ids == bytes(range(256)) * 4


def test_a_psi_key_is_made_once_per_id_set(engine: Engine) -> None:
    sessions = store.make_session_factory(engine)
    keys = iter([b"k" * 32, b"j" * 32, b"x" * 32])
    with sessions() as session:
        first = store.psi_key(session, ids_sha256="a" * 64, new_key=lambda: next(keys))
        again = store.psi_key(session, ids_sha256="a" * 64, new_key=lambda: next(keys))
        other = store.psi_key(session, ids_sha256="b" * 64, new_key=lambda: next(keys))

    assert (first.private_key, first.dataset_version) == (b"k" * 32, again.dataset_version)
    assert again.private_key == b"k" * 32
    assert other.private_key == b"j" * 32 and other.dataset_version != first.dataset_version


class _Stop(Exception):
    pass


def _train(
    url: str, tmp_path: Path, data: tuple[Path, Path], *, steps: int, stop_at: int | None = None
) -> tuple[PartyATrainer, Engine]:
    """Party B's service on ``url`` (a fresh one each call: a restart) and party A training
    a run of ``steps`` on it, stopped after step ``stop_at`` as if party A had died.
    The caller closes the trainer and disposes of the engine."""
    features, labels_path = data
    engine = store.make_engine(url)
    sessions = store.make_session_factory(engine)
    with sessions() as session:
        auth.register_token(session, "alice", TOKEN)
        row = auth.authenticate(session, TOKEN)
        assert row is not None
    labels = load_label_table(labels_path, id_column="id", label_column="y", feature_columns=None)
    service = build_service(sessions=sessions, labels=labels, limits=Limits(), metrics=Metrics())
    service.runs.recover()
    config = breast_config("on-the-backend", **{"run.steps": steps, "run.checkpoint_interval": 5})
    trainer = PartyATrainer(
        config=config,
        features=load_features(features, id_column="id", feature_columns=None, standardize=True),
        transport=InProcessTransport(
            service, Caller(token_id=row.id, name="alice"), problem=problem_from_body
        ),
        store=LocalStore.in_directory(tmp_path / "a-state"),
        server="in-process",
    )

    def stop(result: object, _summary: object) -> None:
        if getattr(result, "step", None) == stop_at:
            raise _Stop

    trainer.on_step = stop
    trainer.prepare()
    try:
        trainer.train()
    except _Stop:
        pass
    return trainer, engine


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_trains_and_resumes_on_the_backend(backend: str, tmp_path: Path) -> None:
    data = _demo(tmp_path / "data", overlap=0.9)
    with fresh_database(backend, tmp_path) as url:
        first, engine = _train(url, tmp_path, data, steps=20, stop_at=12)
        stopped_at = first.step
        first.close()
        engine.dispose()
        second, engine = _train(url, tmp_path, data, steps=20)  # party B restarted too
        remote = second.transport.get_run(second.run_id)
        metrics = second.evaluate().metrics
        second.close()
        engine.dispose()

    assert stopped_at == 12
    assert second.step == 20
    assert remote.step == 20 and remote.checkpoints[-1] == 20
    assert remote.alignment is not None and remote.alignment.aligned == round(0.9 * 569)
    assert 0.5 < metrics["auc"] <= 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_copying_the_sqlite_state_to_another_database_keeps_everything(
    backend: str, tmp_path: Path
) -> None:
    data = _demo(tmp_path / "data")
    source_url = f"sqlite:///{tmp_path / 'source.sqlite'}"
    trainer, engine = _train(source_url, tmp_path, data, steps=15, stop_at=10)
    run_id = trainer.run_id
    trainer.close()
    engine.dispose()
    source = store.make_engine(source_url)
    with fresh_database(backend, tmp_path / "target") as target_url:
        target = store.make_engine(target_url)

        copied = store.copy_database(source, target)
        with pytest.raises(ValueError, match="not empty"):
            store.copy_database(source, target)
        counts = {}
        with target.connect() as connection:
            for table in store.Base.metadata.sorted_tables:
                counts[table.name] = connection.scalar(select(func.count()).select_from(table))
        with store.make_session_factory(target)() as session:
            auth.register_token(session, "carol", "carol-token-0123456789")  # sequences moved on
            checkpoint = store.load_checkpoint(session, run_id)
        with store.make_session_factory(source)() as session:
            original = store.load_checkpoint(session, run_id)
        target.dispose()
        # party B on the target database resumes the run where it was
        resumed, engine = _train(target_url, tmp_path, data, steps=15)
        resumed.close()
        engine.dispose()
    source.dispose()

    assert copied == counts
    assert copied["runs"] == 1 and copied["step_log"] == 10 and copied["psi_keys"] == 1
    assert checkpoint is not None and original is not None and checkpoint.step == 10
    assert checkpoint.model_state == original.model_state
    assert resumed.run_id == run_id and resumed.step == 15


def test_fedlite_b_db_backup_copies_a_live_sqlite_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "b"
    assert main_b(["token", "issue", "--name", "alice", "--data-dir", str(data_dir)]) == 0
    engine = store.make_engine(f"sqlite:///{data_dir / 'party_b.sqlite'}")  # held open: "live"
    with store.make_session_factory(engine)() as session:
        auth.register_token(session, "bob", "bob-token-0123456789")

    code = main_b(["db", "backup", "--data-dir", str(data_dir), "--to", str(tmp_path / "b.bak")])
    again = main_b(["db", "backup", "--data-dir", str(data_dir), "--to", str(tmp_path / "b.bak")])
    copy = store.make_engine(f"sqlite:///{tmp_path / 'b.bak'}")
    with store.make_session_factory(copy)() as session:
        names = sorted(session.scalars(select(store.ApiToken.name)))
    engine.dispose()
    copy.dispose()

    assert (code, again) == (0, 1)  # an existing backup is never overwritten
    assert names == ["alice", "bob"]
