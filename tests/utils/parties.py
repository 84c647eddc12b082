"""Runs with several feature parties on ``small_runs``' label table, driven over HTTP with
hand-made activations (party A's trainer is tested in tests/party_a and tests/e2e)."""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pandas as pd
from sqlalchemy.orm import Session, sessionmaker

from party_b.party_tokens import issue_party_token
from shared import codec
from shared.alignment import hmac_ids
from shared.schedule import batch_digest, batch_positions, split_train_eval
from tests.utils.small_runs import MSGPACK

if TYPE_CHECKING:
    from party_a.config import PartyAConfig
    from party_a.trainer import PartyATrainer

# Which of labels_csv's ids (u000 .. u063) each party holds: their common ids are the even
# ones below u048, 24 of them (18 train, 6 eval at eval_fraction 0.25).
HOLDINGS = {
    "bank": [f"u{i:03d}" for i in range(0, 64, 2)] + ["stranger"],
    "telco": [f"u{i:03d}" for i in range(48)],
    "shop": [f"u{i:03d}" for i in range(64)],
}
COMMON = [f"u{i:03d}" for i in range(0, 48, 2)]


def party_spec(widths: dict[str, int], **overrides: Any) -> dict[str, Any]:
    """A RunCreate with one party per entry of ``widths``, raw float32 both ways (exact)."""
    spec: dict[str, Any] = {
        "name": "parties",
        "model": "tabular_mlp",
        "top": {"hidden": [8]},
        "parties": [
            {"name": name, "cut_dim": d, "quantizer": {"mode": "raw"}, "downlink": "float32"}
            for name, d in widths.items()
        ],
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
class Party:
    """One feature party of a run: its token, its width, its own hand-made activations.
    ``own``: the only party of a run created without ``parties``: its creator's token, on
    the run's own routes (docs/PROTOCOL.md section 10) rather than a party's."""

    url: str
    run_id: str
    name: str
    token: str
    d: int
    spec: dict[str, Any]
    alignment_key: bytes = b""
    aligned: list[bytes] = field(default_factory=list)
    own: bool = False

    def client(self) -> httpx.Client:
        """A client of its own (one connection per request in flight)."""
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120)

    def path(self, tail: str = "") -> str:
        if self.own:
            return f"/v1/runs/{self.run_id}{tail}"
        return f"/v1/runs/{self.run_id}/parties/{self.name}{tail}"

    def post(self, tail: str, **kwargs: Any) -> httpx.Response:
        with self.client() as client:
            return client.post(self.path(tail), **kwargs)

    def align(self, ids: list[str] | None = None) -> httpx.Response:
        keys = hmac_ids(self.alignment_key, HOLDINGS[self.name] if ids is None else ids)
        answer = self.post("/alignment", json={"hashed_ids": [k.hex() for k in keys]})
        if answer.status_code == 200:
            self.aligned = [bytes.fromhex(h) for h in answer.json()["intersection"]]
        return answer

    @property
    def split(self) -> tuple[np.ndarray, np.ndarray]:
        return split_train_eval(
            len(self.aligned), seed=self.spec["seed"], eval_fraction=self.spec["eval_fraction"]
        )

    def activations(self, step: int, rows: int) -> np.ndarray:
        """This party's (rows, d) activations of ``step``: its own, seeded by name and step."""
        rng = np.random.default_rng([step, sum(map(ord, self.name)), self.d])
        return rng.standard_normal((rows, self.d)).astype(np.float32)

    def step_body(self, step: int, x: np.ndarray | None = None) -> bytes:
        train, _ = self.split
        positions = train[
            batch_positions(
                step, batch_size=self.spec["batch_size"], n=len(train), seed=self.spec["seed"]
            )
        ]
        x = self.activations(step, len(positions)) if x is None else x
        request = codec.StepRequest(
            step=step,
            batch_digest=batch_digest([self.aligned[p] for p in positions]),
            chunks=(codec.RawActivations(x),),
        )
        return codec.encode_step_request(request)

    def step(self, step: int, body: bytes | None = None) -> httpx.Response:
        return self.post("/steps", content=body or self.step_body(step), headers=MSGPACK)

    def evaluate_body(self, x: np.ndarray | None = None, split: str = "eval") -> bytes:
        train, eval_pos = self.split
        positions = eval_pos if split == "eval" else train
        x = self.evaluate_activations(split) if x is None else x
        request = codec.EvaluateRequest(
            ids_digest=batch_digest([self.aligned[p] for p in positions]),
            chunks=(codec.RawActivations(x),),
        )
        return codec.encode_evaluate_request(request)

    def evaluate_activations(self, split: str = "eval") -> np.ndarray:
        """The (rows, d) activations ``evaluate_body`` sends for ``split``."""
        train, eval_pos = self.split
        positions = eval_pos if split == "eval" else train
        return self.activations(10**6 if split == "eval" else 10**6 + 2, len(positions))

    def predict_body(
        self, n: int = 4, x: np.ndarray | None = None, positions: list[int] | None = None
    ) -> bytes:
        """A prediction of ``positions`` of the aligned list (default: the first ``n``)."""
        chosen = list(range(n)) if positions is None else positions
        ids = [self.aligned[p].hex() for p in chosen]
        n = len(ids)
        x = self.activations(10**6 + 1, n) if x is None else x
        request = codec.PredictRequest(ids=ids, chunks=(codec.RawActivations(x),))
        return codec.encode_predict_request(request)


def party_run(
    url: str,
    owner_token: str,
    sessions: sessionmaker[Session],
    widths: dict[str, int],
    **overrides: Any,
) -> list[Party]:
    """A run with one party per entry of ``widths``, created by the owner over HTTP, with a
    party token each (issued the operator's way, in the database)."""
    spec = party_spec(widths, **overrides)
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {owner_token}"}, timeout=60
    ) as owner:
        created = owner.post("/v1/runs", json=spec)
    assert created.status_code == 201, created.text
    run = created.json()
    with sessions() as session:
        tokens = {name: issue_party_token(session, run["id"], name) for name in widths}
    return [
        Party(url, run["id"], name, tokens[name], d, spec, bytes.fromhex(run["alignment_key"]))
        for name, d in widths.items()
    ]


PARTY_WIDTHS = {"bank": 4, "telco": 4, "shop": 8}


def run_of_n(
    url: str, owner_token: str, sessions: sessionmaker[Session], n: int, **overrides: Any
) -> list[Party]:
    """A run with ``n`` feature parties (the first ``n`` of PARTY_WIDTHS): for n = 1 a run
    created without ``parties`` (its creator's token, its own routes), else ``party_run``."""
    widths = dict(list(PARTY_WIDTHS.items())[:n])
    if n > 1:
        return party_run(url, owner_token, sessions, widths, **overrides)
    spec = party_spec(widths, **overrides)
    (only,) = spec.pop("parties")
    spec.update(cut_dim=only["cut_dim"], quantizer=only["quantizer"], downlink=only["downlink"])
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {owner_token}"}, timeout=60
    ) as owner:
        created = owner.post("/v1/runs", json=spec)
    assert created.status_code == 201, created.text
    run = created.json()
    key = bytes.fromhex(run["alignment_key"])
    return [Party(url, run["id"], only["name"], owner_token, only["cut_dim"], spec, key, own=True)]


def together(*calls: Callable[[], httpx.Response]) -> list[httpx.Response]:
    """Each call in a thread of its own, at once; their answers in order."""
    answers: list[httpx.Response | None] = [None] * len(calls)

    def run(i: int) -> None:
        answers[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert all(a is not None for a in answers), "a request got no answer"
    return [a for a in answers if a is not None]


# ------------------------------------------------------------------ party A's trainers

BREAST_SPLIT = {"left": (0, 10), "right": (10, 20)}  # the bundled demo's 20 columns, halved
DROPPED = {"left": range(0, 6), "right": range(6, 12), "middle": range(12, 18)}


def feature_tables(directory: Path, columns: dict[str, tuple[int, int]]) -> dict[str, Path]:
    """Each party's columns of the bundled demo, without a few ids of its own (so that the
    run aligns on the ids every party holds)."""
    from shared.demo_data import write_party_a_demo

    tables = {}
    for name, span in columns.items():
        path = write_party_a_demo(directory / f"{name}.csv", columns=span)
        frame = pd.read_csv(path)
        dropped = {f"s{i:04d}" for i in DROPPED.get(name, range(0))}
        frame[~frame["id"].isin(dropped)].to_csv(path, index=False)
        tables[name] = path
    return tables


def party_config(name: str, party: str, in_features: int, **overrides: Any) -> "PartyAConfig":
    """One feature party's config: its bottom to d = 8, PQ q=4 L=4; the run's settings."""
    from tests.utils.party_a import breast_config

    base: dict[str, Any] = {
        "run.party": party,
        "run.steps": 24,
        "run.checkpoint_interval": 8,
        "model.bottom": {"hidden": [16], "cut_dim": 8, "in_features": in_features},
        "quantizer.q": 4,
        "quantizer.L": 4,
    }
    return breast_config(name, **(base | overrides))


def run_of(configs: dict[str, "PartyAConfig"], **spec: Any) -> dict[str, Any]:
    """The RunCreate naming every party, from the parties' own configs (what they agree on)."""
    from shared.models import cut_dim

    first = next(iter(configs.values()))
    created = first.run_create(8).model_dump(mode="json", exclude={"cut_dim", "quantizer"})
    created.pop("downlink", None)
    created.pop("grad_dtype", None)
    created["parties"] = [
        {
            "name": party,
            "cut_dim": cut_dim(config.run.model, **config.model.bottom),
            "quantizer": config.quantizer.spec().model_dump(),
        }
        for party, config in configs.items()
    ]
    return created | spec


def party_trainer(
    state_dir: Path, url: str, token: str, features: Path, config: "PartyAConfig"
) -> "PartyATrainer":
    from party_a.features import load_features
    from party_a.store import LocalStore
    from party_a.trainer import PartyATrainer
    from party_a.transport.parties import PartyTransport

    assert config.run.party is not None
    return PartyATrainer(
        config=config,
        features=load_features(features, id_column="id", feature_columns=None, standardize=True),
        transport=PartyTransport(url, token, party=config.run.party, retry_for=120),
        store=LocalStore.in_directory(state_dir),
        server=url,
    )
