"""Serving is batch-independent and uses the transform fitted on the training rows.

* a sample's score is the same scored alone and inside any batch (hypothesis over random
  batches, the real party B service in process): rows are quantized against the codebook
  frozen at the end of training, never one fitted on the request;
* ``GroupedProductQuantizer.assign`` gives each row the codewords it gets alone;
* the z-score is fitted on the run's training rows only, stored with the run and applied
  unchanged to a serving table that holds none of them.
"""

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from party_a.config import load_config
from party_a.errors import problem_from_body
from party_a.features import FeatureTable, FeatureTransform
from party_a.store import LocalStore, RunServing
from party_a.trainer import PartyATrainer
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.privacy import parse_policy
from party_b.service import Service
from party_b.service.runstate import Caller
from shared.pq.quantizer import GroupedProductQuantizer, PQConfig
from tests.party_b.service.test_run_creation import CONFIG, _data


def _trainer(tmp: Path, features: FeatureTable, party_b: tuple[Service, Caller]) -> PartyATrainer:
    service, caller = party_b
    return PartyATrainer(
        config=load_config(None, {**CONFIG, "run.steps": 6}),
        features=features,
        transport=InProcessTransport(service, caller, problem=problem_from_body),
        store=LocalStore.in_directory(tmp / "a"),
        server="in-process",
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PartyATrainer]:
    """A FedLite run (q=4, L=2) trained 6 steps against party B's service, in process."""
    tmp = tmp_path_factory.mktemp("serving")
    features, labels = _data()
    features = replace(features, standardize=True)
    # the tests score training rows too: a policy that answers for them (the default,
    # label DP, does; off does not unless told)
    party_b = in_process_party_b(
        labels, tmp / "b.sqlite", privacy=parse_policy("off,predict_train_ids=true")
    )
    trainer = _trainer(tmp, features, party_b)
    trainer.prepare()
    trainer.train()
    yield trainer
    trainer.close()


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_score_does_not_depend_on_the_other_samples_of_the_request(
    trained: PartyATrainer, data: st.DataObject
) -> None:
    ids = trained.features.ids
    target = data.draw(st.sampled_from(ids), label="target")
    others = data.draw(st.lists(st.sampled_from(ids), unique=True, max_size=40), label="others")
    batch = data.draw(st.permutations([target, *[i for i in others if i != target]]))

    alone = trained.predict([target]).scores[0]
    inside = trained.predict(list(batch)).scores[batch.index(target)]

    np.testing.assert_allclose(inside, alone, rtol=0, atol=1e-6)


def test_a_codebook_fitted_per_request_would_make_scores_batch_dependent(
    trained: PartyATrainer,
) -> None:
    """The failure the frozen codebook removes (issue 15, finding 2): with a fresh k-means
    per request, one row alone is rebuilt exactly, inside a batch it is not."""
    z = trained.bottom.forward(trained.data.x[:40])
    quantizer = trained.bottom._quantizer(int(z.shape[1]))
    _code, alone = quantizer.quantize(z[:1], seed=0)
    _code, inside = quantizer.quantize(z, seed=0)
    assert torch.allclose(alone[0], z[0]) and not torch.allclose(inside[0], z[0], atol=1e-3)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 150),
    q=st.sampled_from([1, 2, 4]),
    L=st.sampled_from([1, 3, 16]),
    seed=st.integers(0, 2**16),
)
def test_assign_gives_each_row_the_codewords_it_gets_alone(
    rows: int, q: int, L: int, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, 8, generator=generator)
    quantizer = GroupedProductQuantizer(8, PQConfig(q=q, L=L, R=1 if q == 1 else 2))
    codebook = quantizer.encode(torch.randn(64, 8, generator=generator), seed=seed).codebook
    together = quantizer.assign(z, codebook).codewords
    for i in range(0, rows, 37):
        assert torch.equal(quantizer.assign(z[i : i + 1], codebook).codewords[0], together[i])
    # and it is the nearest centroid of every subvector
    rebuilt = quantizer.decode(quantizer.assign(z, codebook))
    nearest = torch.cdist(quantizer.group_points(z), codebook).min(dim=2).values
    assert float(((z - rebuilt) ** 2).sum()) == pytest.approx(float((nearest**2).sum()), rel=1e-4)


def test_the_transform_is_fitted_on_training_rows_and_serves_a_table_without_them(
    trained: PartyATrainer, tmp_path: Path
) -> None:
    transform = trained.data.transform  # type: ignore[union-attr]
    assert transform is not None and transform.mean is not None
    train_rows = trained.data.rows[trained.data.train_pos]  # type: ignore[union-attr]
    held_out = trained.data.rows[trained.eval_pos]  # type: ignore[union-attr]
    expected = trained.features.x[train_rows].astype(np.float64).mean(axis=0)
    assert np.allclose(transform.mean, expected)
    whole = trained.features.x.astype(np.float64).mean(axis=0)
    assert not np.allclose(transform.mean, whole)  # held-out rows took no part
    assert trained.store.serving(trained.local.id).transform == transform.to_json()  # type: ignore[union-attr]

    # a serving table: the held-out rows only, columns in another order, one extra column
    x = trained.features.x[held_out]
    serving = FeatureTable(
        ids=[trained.features.ids[r] for r in held_out],
        x=np.concatenate([x[:, ::-1], np.ones((len(x), 1), np.float32)], axis=1),
        columns=[*trained.features.columns[::-1], "extra"],
        standardize=True,
    )
    stored = FeatureTransform.from_json(transform.to_json())
    np.testing.assert_array_equal(stored.apply(serving), trained.data.x[held_out])


def test_a_run_begun_before_the_transform_was_stored_keeps_its_whole_table_z_score(
    tmp_path: Path,
) -> None:
    """A run with checkpoints and no stored transform was standardized over its whole table:
    resumed, evaluated or served, it gets exactly those numbers back (bit for bit)."""
    features, labels = _data()
    features = replace(features, standardize=True)
    party_b = in_process_party_b(labels, tmp_path / "b.sqlite")
    first = _trainer(tmp_path, features, party_b)
    first.prepare()
    assert first.local is not None
    with first.store.session() as session:  # what an older release left behind
        session.query(RunServing).delete()
        session.commit()
    first.close()

    again = _trainer(tmp_path, features, party_b)
    again.prepare()
    x = features.x
    std = x.std(axis=0, keepdims=True)
    before = ((x - x.mean(axis=0, keepdims=True)) / np.where(std > 0, std, 1.0)).astype(np.float32)
    np.testing.assert_array_equal(again.data.x, before)  # the former load_features, verbatim
    again.close()
