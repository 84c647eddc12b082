"""The 'clients' batch schedule through the real party A trainer and party B service.

Party B runs in-process (party_b.inprocess: the same Service the HTTP app wraps).
"""

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments.tasks import ClassLabels, TokenLabels
from party_a.config import load_config
from party_a.errors import ConfigError, ProblemResponse, ProtocolError, problem_from_body
from party_a.features import FeatureTable, load_features
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.labels import load_label_table
from shared.accounting import raw_step_request_bytes
from shared.schedule import batch_digest

N_CLIENTS, ROWS_PER_CLIENT = 7, 12


def _table(seed: int = 0) -> tuple[FeatureTable, ClassLabels]:
    """Two Gaussian classes, 7 clients of 12 rows: party A's features, party B's labels."""
    rng = np.random.default_rng(seed)
    n = N_CLIENTS * ROWS_PER_CLIENT
    y = rng.integers(0, 2, n)
    x = (rng.normal(size=(n, 6)) + 1.5 * y[:, None]).astype(np.float32)
    ids = [f"id{i:03d}" for i in range(n)]
    groups = [f"client{i // ROWS_PER_CLIENT}" for i in range(n)]
    features = FeatureTable(ids=ids, x=x, columns=[f"x{i}" for i in range(6)], groups=groups)
    labels = ClassLabels(row_ids=ids, labels=y.astype(np.int64), num_outputs=2, row_groups=groups)
    return features, labels


def _config(name: str, **overrides: Any) -> Any:
    base: dict[str, Any] = {
        "run.name": name,
        "run.model": "tabular_mlp",
        "run.steps": 6,
        "run.batch_size": 5,
        "run.schedule": {"kind": "clients", "clients_per_step": 3},
        "run.eval_fraction": 0.2,
        "run.use_side_features": False,
        "model.bottom": {"hidden": [8], "cut_dim": 8},
        "model.top": {"hidden": [8]},
        "quantizer.mode": "pq",
        "quantizer.q": 4,
        "quantizer.L": 2,
        "quantizer.lambda": 1e-3,
        "optimizer.bottom": {"name": "adam", "lr": 0.01},
        "optimizer.top": {"name": "adam", "lr": 0.01},
    }
    base.update(overrides)
    return load_config(None, base)


def _trainer(tmp_path: Path, labels: Any, features: FeatureTable, config: Any) -> PartyATrainer:
    tmp_path.mkdir(parents=True, exist_ok=True)
    service, caller = in_process_party_b(labels, tmp_path / "b.sqlite")
    return PartyATrainer(
        config=config,
        features=features,
        transport=InProcessTransport(service, caller, problem=problem_from_body),
        store=LocalStore.in_directory(tmp_path / "a"),
        server="in-process",
    )


def test_each_step_sends_one_chunk_per_client(tmp_path: Path) -> None:
    features, labels = _table()
    trainer = _trainer(tmp_path, labels, features, _config("clients"))
    chunks_per_step: list[tuple[int, ...]] = []
    trainer.on_step = lambda result, summary: chunks_per_step.append(
        trainer.batch(result.step).chunk_sizes
    )

    trainer.prepare()
    summary = trainer.train()
    answer = trainer.evaluate()

    assert summary.last_step == 6
    assert len(chunks_per_step) == 6
    for step, sizes in enumerate(chunks_per_step, start=1):
        assert len(sizes) == 3  # three clients, each its own chunk with its own codebook
        batch = trainer.batch(step)
        owners = [features.groups[trainer.data.rows[p]] for p in batch.positions]  # type: ignore[index]
        offsets = np.cumsum((0, *sizes)).tolist()
        spans = zip(offsets[:-1], offsets[1:], strict=True)
        assert [len(set(owners[a:b])) for a, b in spans] == [1, 1, 1]
    assert 0.0 <= answer.metrics["accuracy"] <= 1.0
    # the compression is measured against SplitFed's raw requests with the same chunks
    assert summary.raw_bytes == sum(raw_step_request_bytes(d=8, batch=s) for s in chunks_per_step)


def test_party_b_refuses_chunks_that_are_not_the_clients_batches(tmp_path: Path) -> None:
    features, labels = _table()
    trainer = _trainer(tmp_path, labels, features, _config("one-chunk"))
    trainer.prepare()
    batch = trainer.batch(1)

    pending = trainer.bottom.request(  # the right rows, but quantized as one chunk
        1,
        features.x[trainer.data.rows[batch.positions]],
        batch_digest([trainer.data.aligned[p] for p in batch.positions]),
    )

    with pytest.raises(ProblemResponse, match="schedule"):
        trainer.transport.step(trainer.run_id, pending.body)


def test_a_client_schedule_needs_clients_on_both_sides(tmp_path: Path) -> None:
    features, labels = _table()
    no_groups_b = ClassLabels(row_ids=labels.row_ids, labels=labels.labels, num_outputs=2)
    no_groups_a = FeatureTable(ids=features.ids, x=features.x, columns=features.columns)

    with pytest.raises(ProblemResponse, match="client column"):
        _trainer(tmp_path / "b", no_groups_b, features, _config("no-b")).prepare()
    with pytest.raises(ConfigError, match="group_column"):
        _trainer(tmp_path / "a", labels, no_groups_a, _config("no-a")).prepare()


def test_parties_with_different_clients_disagree_on_the_batch(tmp_path: Path) -> None:
    features, labels = _table()
    shuffled = list(np.random.default_rng(1).permutation(features.groups))
    other = FeatureTable(ids=features.ids, x=features.x, columns=features.columns, groups=shuffled)
    trainer = _trainer(tmp_path, labels, other, _config("mismatch"))
    trainer.prepare()

    with pytest.raises(ProtocolError, match="disagree"):
        trainer.train()


def test_sequence_chunks_count_tokens_of_each_clients_sequences(tmp_path: Path) -> None:
    """A sample of a next-token model is T activation rows; chunks hold whole sequences."""
    rng = np.random.default_rng(0)
    n, t, vocab = 40, 5, 12
    tokens = rng.integers(4, vocab, size=(n, t + 1))
    ids = [f"s{i:02d}" for i in range(n)]
    groups = [f"role{i % 4}" for i in range(n)]
    features = FeatureTable(ids=ids, x=tokens[:, :t], columns=[], groups=groups)
    labels = TokenLabels(
        row_ids=ids, next_tokens=tokens[:, 1:], vocab_size=vocab, row_groups=groups
    )
    config = _config(
        "tokens",
        **{
            "run.model": "next_token_lstm",
            "run.batch_size": 3,
            "run.schedule": {"kind": "clients", "clients_per_step": 2},
            "model.bottom": {"vocab_size": vocab, "embed_dim": 8, "hidden": 8, "cut_dim": 8},
            "model.top": {},
        },
    )
    trainer = _trainer(tmp_path, labels, features, config)
    sizes: list[tuple[int, ...]] = []
    trainer.on_step = lambda result, summary: sizes.append(trainer.batch(result.step).chunk_sizes)

    trainer.prepare()
    trainer.train()
    answer = trainer.evaluate()

    assert sizes and all(s == (3, 3) for s in sizes)
    assert answer.n == len(trainer.eval_pos) * t  # every eval token counts (no padding here)
    # predict is one score per sample: a clear refusal for a model of one row per token
    with pytest.raises(ConfigError, match="one score per sample"):
        trainer.predict(ids[:2])


def test_csv_tables_carry_the_client_column(tmp_path: Path) -> None:
    guest, host = tmp_path / "guest.csv", tmp_path / "host.csv"
    guest.write_text("id,y,writer,g0\n1,0,w1,0.5\n2,1,w2,1.5\n3,1,w1,2.0\n")
    host.write_text("id,writer,h0,h1\n1,w1,1,2\n2,w2,3,4\n3,w1,5,7\n")

    labels = load_label_table(
        guest, id_column="id", label_column="y", feature_columns=None, group_column="writer"
    )
    features = load_features(
        host, id_column="id", feature_columns=None, standardize=False, group_column="writer"
    )

    assert labels.groups == ["w1", "w2", "w1"] and labels.feature_names == ["g0"]
    assert features.groups == ["w1", "w2", "w1"] and features.columns == ["h0", "h1"]
