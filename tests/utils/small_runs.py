"""A small party B (64 labelled rows, tabular_mlp) and valid messages for its runs.

For tests that talk to party B's HTTP API directly, without a party A: create and align a run,
then build well-formed step / evaluate / predict bodies for it, to send as they are or to
mutate into hostile ones.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import RunCreate
from party_b import auth
from party_b.labels import LabelSource, load_label_table
from party_b.metrics import Metrics
from party_b.privacy import PrivacyPolicy
from party_b.service import Caller, Service, build_service
from party_b.settings import Limits
from party_b.store import make_engine, make_session_factory
from shared import codec
from shared.alignment import hmac_ids
from shared.schedule import batch_digest, batch_positions, split_train_eval

TOKEN = "tester-token-0123456789"
OTHER = "other-token-0123456789"
PROBLEM = "application/problem+json"
MSGPACK = {"Content-Type": "application/msgpack"}


def labels_csv(path: Path, n: int = 64) -> Path:
    """Party B's table: ids u000..u063, a binary label and three feature columns."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"id": [f"u{i:03d}" for i in range(n)], "y": rng.integers(0, 2, n)})
    for j in range(3):
        frame[f"b{j}"] = rng.standard_normal(n)
    frame.to_csv(path, index=False)
    return path


def run_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "t",
        "model": "tabular_mlp",
        "top": {"hidden": [8]},
        "cut_dim": 8,
        "quantizer": {"mode": "pq", "q": 4, "L": 2},
        "optimizer": {"name": "sgd", "lr": 0.1},
        "batch_size": 8,
        "steps": 1000,
        "seed": 3,
        "checkpoint_interval": 2,
        "eval_fraction": 0.25,
    }
    spec.update(overrides)
    return spec


@dataclass
class SmallRun:
    """A run aligned on the even ids (32 of them), with the positions both parties derive."""

    id: str
    alignment_key: bytes
    aligned: list[bytes]
    spec: dict[str, Any]

    @property
    def split(self) -> tuple[np.ndarray, np.ndarray]:
        return split_train_eval(
            len(self.aligned), seed=self.spec["seed"], eval_fraction=self.spec["eval_fraction"]
        )

    def chunk(
        self, rows: int, rng: np.random.Generator | None = None, *, scale: float = 1.0
    ) -> codec.Activations:
        """Random activations of ``rows`` rows in the run's quantizer mode, N(0, scale**2)."""
        rng = rng or np.random.default_rng(rows)
        d = self.spec["cut_dim"]
        if self.spec["quantizer"]["mode"] == "raw":
            return codec.RawActivations((rng.standard_normal((rows, d)) * scale).astype(np.float32))
        q, L = self.spec["quantizer"]["q"], self.spec["quantizer"]["L"]
        return codec.PQActivations(
            codebook=(rng.standard_normal((1, L, d // q)) * scale).astype(np.float32),
            codewords=rng.integers(0, L, (rows, q)),
        )

    def step_body(self, step: int, *, digest: bytes | None = None, scale: float = 1.0) -> bytes:
        """A valid request for ``step``, activations N(0, scale**2), in the run's wire dtypes."""
        train, _ = self.split
        positions = train[
            batch_positions(
                step, batch_size=self.spec["batch_size"], n=len(train), seed=self.spec["seed"]
            )
        ]
        request = codec.StepRequest(
            step=step,
            batch_digest=digest or batch_digest([self.aligned[p] for p in positions]),
            chunks=(self.chunk(len(positions), np.random.default_rng(step), scale=scale),),
        )
        dtype = self.spec["quantizer"].get("codebook_dtype", "float32")
        return codec.encode_step_request(request, codebook_dtype=dtype, activations_dtype=dtype)

    def evaluate_body(self) -> bytes:
        _, eval_pos = self.split
        request = codec.EvaluateRequest(
            ids_digest=batch_digest([self.aligned[p] for p in eval_pos]),
            chunks=(self.chunk(len(eval_pos)),),
        )
        return codec.encode_evaluate_request(request)

    def predict_body(self, n: int = 4) -> bytes:
        ids = [k.hex() for k in self.aligned[:n]]
        return codec.encode_predict_request(codec.PredictRequest(ids=ids, chunks=(self.chunk(n),)))


ALIGNED_IDS = [f"u{i:03d}" for i in range(0, 64, 2)] + ["stranger"]


def aligned_run(
    client: httpx.Client, ids: Sequence[str] = ALIGNED_IDS, **overrides: Any
) -> SmallRun:
    """Create a run and align it on ``ids`` (by default the even ids plus one party B does
    not hold)."""
    spec = run_spec(**overrides)
    created = client.post("/v1/runs", json=spec)
    assert created.status_code == 201, created.text
    run = created.json()
    key = bytes.fromhex(run["alignment_key"])
    answer = client.post(
        f"/v1/runs/{run['id']}/alignment",
        json={"hashed_ids": [k.hex() for k in hmac_ids(key, list(ids))]},
    )
    assert answer.status_code == 200, answer.text
    aligned = [bytes.fromhex(h) for h in answer.json()["intersection"]]
    return SmallRun(id=run["id"], alignment_key=key, aligned=aligned, spec=spec)


@dataclass
class SmallPartyB:
    """Party B in process on labels_csv's table and its own SQLite file, with two tokens.

    ``service()`` is a new party B on the same database each time: a restart.
    """

    sessions: sessionmaker[Session]
    labels: LabelSource
    caller: Caller  # TOKEN's
    other: Caller  # OTHER's

    def service(self, privacy: PrivacyPolicy | None = None) -> Service:
        return build_service(
            sessions=self.sessions,
            labels=self.labels,
            limits=Limits(),
            metrics=Metrics(),
            privacy=privacy,
        )


def small_party_b(directory: Path, labels: LabelSource | None = None) -> SmallPartyB:
    """``SmallPartyB`` in ``directory`` (its database: ``directory / "party_b.sqlite"``, what
    ``Settings(data_dir=directory)`` names), on ``labels`` or ``labels_csv``'s table."""
    directory.mkdir(parents=True, exist_ok=True)
    if labels is None:
        labels = load_label_table(
            labels_csv(directory / "labels.csv"),
            id_column="id",
            label_column="y",
            feature_columns=None,
        )
    sessions = make_session_factory(make_engine(f"sqlite:///{directory / 'party_b.sqlite'}"))
    callers = []
    with sessions() as session:
        for name, token in (("tester", TOKEN), ("other", OTHER)):
            auth.register_token(session, name, token)
            row = auth.authenticate(session, token)
            assert row is not None
            callers.append(Caller(token_id=row.id, name=row.name))
    return SmallPartyB(sessions, labels, callers[0], callers[1])


def aligned_in_process(service: Service, caller: Caller, **overrides: Any) -> SmallRun:
    """``aligned_run`` through the service in process."""
    spec = run_spec(**overrides)
    run = service.runs.create(caller, RunCreate.model_validate(spec))
    key = bytes.fromhex(run.alignment_key)
    answer = service.alignment.align(caller, run.id, [k.hex() for k in hmac_ids(key, ALIGNED_IDS)])
    aligned = [bytes.fromhex(h) for h in answer.intersection]
    return SmallRun(id=run.id, alignment_key=key, aligned=aligned, spec=spec)


def problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    """Assert ``response`` is the problem+json of ``slug`` with ``status``; return its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:fedlite:problem:{slug}", body
    assert body["status"] == status and body["title"] and body["detail"]
    return body
