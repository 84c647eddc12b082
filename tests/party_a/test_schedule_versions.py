"""Schedule versions: version 1 is exactly the pre-version numpy schedule, so runs stored before
``schedule_version`` existed resume bit-identically; version 2 is what new runs use.

The version 1 expectations below were printed by the code of commit 461c985 (before versions
existed); they must never change.
"""

from pathlib import Path

import pytest

from api_schemas import RunCreate, default_downlink
from party_a.errors import problem_from_body
from party_a.features import load_features
from party_a.store import LocalRun, LocalStore
from party_a.trainer import PartyATrainer
from party_b import store
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.labels import load_label_table
from party_b.service import Caller, Service
from shared.demo_data import write_party_a_demo, write_party_b_demo
from shared.schedule import (
    SCHEDULE_VERSION,
    ClientBatches,
    batch_digest,
    batch_positions,
    make_schedule,
    split_train_eval,
    step_seed,
)
from tests.utils.party_a import breast_config

GROUPS = ["b", "a", "c", "a", "b", "c", "c", "a", "d", "c", "c", "b"]


def test_version_1_is_the_schedule_runs_were_stored_with() -> None:
    train, held_out = split_train_eval(10, seed=3, eval_fraction=0.25, version=1)
    assert (train.tolist(), held_out.tolist()) == ([0, 1, 2, 4, 5, 6, 7, 9], [3, 8])
    _, held_out = split_train_eval(569, seed=0, eval_fraction=0.2, version=1)
    assert len(held_out) == 114
    assert held_out[:10].tolist() == [9, 10, 20, 22, 30, 40, 41, 45, 51, 58]

    steps = [
        batch_positions(t, batch_size=4, n=10, seed=3, version=1).tolist() for t in (1, 2, 3, 4)
    ]
    assert steps == [[9, 6, 0, 2], [1, 4, 7, 5], [3, 8, 4, 1], [2, 8, 5, 0]]

    clients = ClientBatches(GROUPS, clients_per_step=2, batch_size=3, seed=5, version=1)
    drawn = [(clients.batch(t).positions.tolist(), clients.batch(t).chunk_sizes) for t in (1, 2, 3)]
    assert drawn == [
        ([11, 4, 0, 8], (3, 1)),
        ([7, 3, 1, 8], (3, 1)),
        ([1, 3, 7, 9, 2, 10], (3, 3)),
    ]


def test_digests_and_step_seeds_did_not_change() -> None:
    assert batch_digest([bytes(32), bytes([1]) * 32]).hex() == "feaa2c9e58a7ff7a"
    assert step_seed(7, 3, "dropout-top") == 7431264824107364840


def test_version_2_is_what_new_runs_and_the_defaults_use() -> None:
    spec = RunCreate.model_validate(
        {
            "name": "n",
            "model": "tabular_mlp",
            "cut_dim": 4,
            "quantizer": {"mode": "raw"},
            "optimizer": {"name": "sgd", "lr": 0.1},
            "batch_size": 2,
            "steps": 1,
            "seed": 3,
        }
    )
    assert spec.schedule_version == SCHEDULE_VERSION == 2
    assert spec.model_dump(mode="json")["schedule_version"] == 2  # stored explicitly
    stored_before = spec.model_dump(mode="json", exclude={"schedule_version"})
    assert RunCreate.from_stored(stored_before).schedule_version == 1
    assert RunCreate.from_stored(spec.model_dump(mode="json")).schedule_version == 2

    v1 = split_train_eval(10, seed=3, eval_fraction=0.25, version=1)
    v2 = split_train_eval(10, seed=3, eval_fraction=0.25, version=2)
    default = split_train_eval(10, seed=3, eval_fraction=0.25)
    assert [a.tolist() for a in default] == [a.tolist() for a in v2]
    assert [a.tolist() for a in v1] != [a.tolist() for a in v2]
    schedule = make_schedule(n=10, batch_size=4, seed=3)
    assert (
        schedule.batch(2).positions.tolist()
        == batch_positions(2, batch_size=4, n=10, seed=3).tolist()
    )


def test_an_unknown_version_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown schedule version 3"):
        split_train_eval(10, seed=0, eval_fraction=0.2, version=3)
    with pytest.raises(ValueError, match="unknown schedule version"):
        make_schedule(n=10, batch_size=2, seed=0, version=0)


# ------------------------------------------------------------------ both parties, end to end


class _Stop(Exception):
    pass


def _party_b(tmp_path: Path, labels: Path) -> tuple[Service, Caller]:
    """A party B on ``tmp_path/b.sqlite``: a fresh service object each call is a restart."""
    table = load_label_table(labels, id_column="id", label_column="y", feature_columns=None)
    service, caller = in_process_party_b(table, tmp_path / "b.sqlite")
    service.runs.recover()
    return service, caller


def _party_a(tmp_path: Path, features: Path, party_b: tuple[Service, Caller]) -> PartyATrainer:
    config = breast_config("versions", **{"run.steps": 12, "run.checkpoint_interval": 4})
    return PartyATrainer(
        config=config,
        features=load_features(features, id_column="id", feature_columns=None, standardize=True),
        transport=InProcessTransport(*party_b, problem=problem_from_body),
        store=LocalStore.in_directory(tmp_path / "a-state"),
        server="in-process",
    )


def _stored_before_versions(
    tmp_path: Path, trainer: PartyATrainer, party_b: tuple[Service, Caller]
) -> None:
    """The state both parties would hold had the run been created before schedule versions
    and downlinks: party B's row has neither ``schedule_version`` nor ``downlink`` (its
    gradients go as float32), party A's state directory knows the run."""
    service, caller = party_b
    run = service.runs.create(caller, trainer.config.run_create(trainer.cut_dim))
    engine = store.make_engine(f"sqlite:///{tmp_path / 'b.sqlite'}")
    with store.make_session_factory(engine)() as session:
        row = session.get(store.Run, run.id)
        assert row is not None
        row.config = {
            k: v for k, v in row.config.items() if k not in ("schedule_version", "downlink")
        }
        session.commit()
    engine.dispose()
    trainer.store.add_run(
        LocalRun(
            server=trainer.server,
            name=trainer.config.run.name,
            remote_id=run.id,
            # as written then: without the settings added since (pipelining, downlink,
            # codeword coding, AdaGrad's options, the party of a run with several, the
            # typing of columns and their categories)
            config=trainer.config.model_dump(
                mode="json",
                by_alias=True,
                exclude={
                    "run": {"pipeline_depth", "downlink", "device", "party"},
                    "quantizer": {"codewords"},
                    "optimizer": {s: {"initial_accumulator", "eps"} for s in ("bottom", "top")},
                    "data": trainer.config.data.unset_preparation(),
                },
            ),
            alignment_key=run.alignment_key,
        )
    )


def _train(tmp_path: Path, *, old: bool, stop_at: int | None = None) -> tuple[int, str]:
    """Train the run to its end (restarting both parties after ``stop_at``); returns
    (party A's schedule version, party B's top-model checksum)."""
    features = write_party_a_demo(tmp_path / "features.csv", overlap=0.9)
    labels = write_party_b_demo(tmp_path / "labels.csv", overlap=0.9)
    party_b = _party_b(tmp_path, labels)
    trainer = _party_a(tmp_path, features, party_b)
    if old:
        _stored_before_versions(tmp_path, trainer, party_b)

    def stop(result: object, _summary: object) -> None:
        if getattr(result, "step", None) == stop_at:
            raise _Stop

    trainer.on_step = stop
    trainer.prepare()
    try:
        trainer.train()
    except _Stop:
        trainer.close()
        party_b = _party_b(tmp_path, labels)  # both parties restart
        trainer = _party_a(tmp_path, features, party_b)
        trainer.prepare()
        trainer.train()
    remote = trainer.transport.get_run(trainer.run_id)
    trainer.close()
    assert remote.step == 12 and remote.model_sha256 is not None
    assert remote.config.schedule_version == trainer.schedule_version
    # a run stored before the field keeps float32; a new one gets the default of its d
    assert remote.config.downlink == ("float32" if old else default_downlink(trainer.cut_dim))
    return trainer.schedule_version, remote.model_sha256


def test_a_run_stored_before_versions_trains_and_resumes_on_version_1(tmp_path: Path) -> None:
    """Both parties read the old run as version 1 (party A from party B's record), agree on
    every batch, and a restart of both mid-run ends bit-identically to an uninterrupted run."""
    old = _train(tmp_path / "old", old=True)
    old_restarted = _train(tmp_path / "old-restarted", old=True, stop_at=6)
    new = _train(tmp_path / "new", old=False)
    new_restarted = _train(tmp_path / "new-restarted", old=False, stop_at=5)

    assert old[0] == old_restarted[0] == 1
    assert new[0] == new_restarted[0] == 2
    assert old_restarted == old
    assert new_restarted == new
    assert old[1] != new[1]  # the versions really draw different batches
