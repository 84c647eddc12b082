"""Checkpoints of party B's top models: their size, and what writing and reading one costs
on SQLite and on PostgreSQL -- where replicas keep them (docs/DEPLOY.md, "Replicas").

    python -m benchmarks.scale.checkpoints [--database-url postgresql+psycopg://...] [--repeats 5]

Each top model is built as party B builds it (``Admission.new_trainer``) and takes one real
optimizer step (so that Adam's moments exist); a checkpoint is then its model state and its
optimizer state as party B stores them (``TopTrainer.state``). Writing is
``store.save_checkpoint`` plus the commit (with pruning, as every checkpoint step does);
reading is ``store.load_checkpoint`` plus ``TopTrainer.load_state`` (what a takeover does).
Without ``--database-url`` a throwaway PostgreSQL is started (``party_b.ops.stack``).
Writes ``benchmarks/results/checkpoints.json`` and the table between the checkpoint markers
of docs/DEPLOY.md.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from api_schemas import RunCreate, RunStatus
from benchmarks.common import RESULTS, ROOT, versions, write_result
from loadtests.scenarios import write_label_table
from party_b import auth, store
from party_b.labels import LabelSource, load_label_table
from party_b.ops.launch import free_port
from party_b.ops.stack import local_postgres
from party_b.service.admission import Admission
from party_b.settings import Limits
from party_b.top import TopTrainer
from shared.demo_data import write_party_b_demo

DOC = ROOT / "docs" / "DEPLOY.md"
BEGIN, END = "<!-- BEGIN GENERATED checkpoints -->", "<!-- END GENERATED checkpoints -->"


def _spec(model: str, cut_dim: int, top: dict[str, Any], optimizer: str, side: bool) -> RunCreate:
    return RunCreate.model_validate(
        {
            "name": "checkpoint",
            "model": model,
            "top": top,
            "cut_dim": cut_dim,
            "quantizer": {"mode": "raw"},
            "optimizer": {"name": optimizer, "lr": 0.001},
            "batch_size": 20,
            "steps": 1000,
            "seed": 0,
            "checkpoint_interval": 50,
            "eval_fraction": 0.2,
            "use_side_features": side,
        }
    )


def models(work: Path) -> list[tuple[str, LabelSource, RunCreate]]:
    """(what, labels, run config) of each top model measured."""
    demo = load_label_table(
        write_party_b_demo(work / "demo.csv"), id_column="id", label_column="y",
        feature_columns=None,
    )  # fmt: skip
    classes = load_label_table(
        write_label_table(work / "classes.csv", n=200), id_column="id", label_column="y",
        feature_columns=None,
    )  # fmt: skip
    return [
        ("demo: breast cancer, MLP [32 + 10 side] -> 32 -> 2, Adam", demo,
         _spec("tabular_mlp", 32, {"hidden": [32]}, "adam", True)),
        ("FEMNIST CNN top 9216 -> 128 -> 62, SGD (the paper's)", classes,
         _spec("femnist_cnn", 9216, {}, "sgd", False)),
        ("FEMNIST CNN top 9216 -> 128 -> 62, Adam", classes,
         _spec("femnist_cnn", 9216, {}, "adam", False)),
        ("large MLP top 1024 -> 2048 -> 2048 -> 62, Adam", classes,
         _spec("tabular_mlp", 1024, {"hidden": [2048, 2048]}, "adam", False)),
    ]  # fmt: skip


def stepped(labels: LabelSource, spec: RunCreate) -> TopTrainer:
    """The run's top model after one optimizer step on random activations."""
    trainer = Admission(labels, Limits()).new_trainer(spec)
    rows = np.arange(spec.batch_size)
    assert spec.cut_dim is not None  # a run of one feature party
    z = torch.randn(spec.batch_size, spec.cut_dim, generator=torch.Generator().manual_seed(0))
    side = labels.side(rows) if trainer.model.side_features else None
    trainer.train_step(z, labels.targets(rows), side, dropout_seed=0)
    return trainer


def _run_row(sessions: Any) -> str:
    with sessions() as session:
        auth.register_token(session, "bench", f"bench-token-{uuid.uuid4().hex}")
        owner = store.token_named(session, "bench")
        assert owner is not None
        run = store.Run(
            id=uuid.uuid4().hex, owner_id=owner.id, name="checkpoint",
            status=RunStatus.TRAINING.value, config={}, alignment_key="00" * 32,
            num_classes=2, side_features=0,
        )  # fmt: skip
        store.add_run(session, run, None)
        session.commit()
        return run.id


def timings(url: str, trainer: TopTrainer, repeats: int) -> dict[str, float]:
    """Median ms to write (save + prune + commit) and to read and load a checkpoint."""
    engine = store.make_engine(url)
    sessions = store.make_session_factory(engine)
    run_id = _run_row(sessions)
    model_state, optimizer_state = trainer.state()
    writes, reads = [], []
    for step in range(1, repeats + 2):
        start = time.perf_counter()
        with sessions() as session:
            store.save_checkpoint(
                session, run_id=run_id, step=step * 50, model_state=model_state,
                optimizer_state=optimizer_state, request_sha256=b"0" * 32, response=b"r" * 1024,
                keep=3, interval=50,
            )  # fmt: skip
            session.commit()
        writes.append(time.perf_counter() - start)
        start = time.perf_counter()
        with sessions() as session:
            checkpoint = store.load_checkpoint(session, run_id)
            assert checkpoint is not None
            trainer.load_state(checkpoint.model_state, checkpoint.optimizer_state)
        reads.append(time.perf_counter() - start)
    engine.dispose()
    # the first write creates the table's pages: left out
    return {
        "write_ms": 1000 * statistics.median(writes[1:]),
        "read_and_load_ms": 1000 * statistics.median(reads[1:]),
    }


@contextmanager
def _postgres(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    with local_postgres(free_port()) as started:
        yield started


def measure(work: Path, database_url: str | None, repeats: int) -> list[dict[str, Any]]:
    rows = []
    with _postgres(database_url) as postgres:
        for what, labels, spec in models(work):
            trainer = stepped(labels, spec)
            model_state, optimizer_state = trainer.state()
            params = sum(p.numel() for p in trainer.model.parameters())
            sqlite = f"sqlite:///{work / f'{uuid.uuid4().hex}.sqlite'}"
            rows.append(
                {
                    "model": what,
                    "parameters": params,
                    "model_state_bytes": len(model_state),
                    "optimizer_state_bytes": len(optimizer_state),
                    "sqlite": timings(sqlite, trainer, repeats),
                    "postgresql": timings(postgres, trainer, repeats),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}" if n < 10e6 else f"{n / 1e6:.0f}"


def table(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"*{doc['when']}, {doc['machine']['cpus']} CPUs ({doc['machine']['cpu']}), load "
        f"average {doc['loadavg_before'][0]:.1f} → {doc['loadavg_after'][0]:.1f}; "
        f"`{doc['command']}`*",
        "",
        "| top model | parameters | checkpoint MB (model + optimizer) | kept per run (3) MB "
        "| write ms SQLite / PostgreSQL | read + load ms SQLite / PostgreSQL |",
        "|---|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        size = row["model_state_bytes"] + row["optimizer_state_bytes"]
        s, p = row["sqlite"], row["postgresql"]
        lines.append(
            f"| {row['model']} | {row['parameters']:,} | {_mb(size)} "
            f"({_mb(row['model_state_bytes'])} + {_mb(row['optimizer_state_bytes'])}) "
            f"| {_mb(3 * size)} | {s['write_ms']:.1f} / {p['write_ms']:.1f} "
            f"| {s['read_and_load_ms']:.1f} / {p['read_and_load_ms']:.1f} |"
        )
    return lines


def render(doc: dict[str, Any]) -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + BEGIN + "\n" + "\n".join(table(doc)) + "\n" + END + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="a running PostgreSQL (default: start one)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", action="store_true", help="re-render the doc's table only")
    args = parser.parse_args()
    if args.report:
        render(json.loads((args.out or RESULTS / "checkpoints.json").read_text()))
        return
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fedlite-checkpoints-") as tmp:
        rows = measure(Path(tmp), args.database_url, args.repeats)
    path = write_result(
        "checkpoints",
        {
            "versions": versions("torch", "sqlalchemy", "psycopg"),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "repeats": args.repeats,
            "rows": rows,
        },
        args.out,
    )
    render(json.loads(path.read_text()))
    print(f"wrote {path} and {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
