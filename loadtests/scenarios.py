"""What a load-test user sends: run configs, the label table, and real step requests.

No locust here (importing locust monkey-patches the process with gevent), so the tests and
the in-process benchmarks import this module freely.

Party B accepts a step only in order (step t after t-1) and only with the batch digest it
computes itself from the aligned ids, the run seed and the batch size. A load-test user is
therefore a real party A without a model: it creates a run, aligns all of the label table's
ids, and then computes every step's digest with the product's own schedule
(``shared.schedule``) and encodes it with the product's codec. The activations are one
realistic batch per scenario, quantized once with the product's quantizer: the load
generator must not spend on k-means the CPU the server it measures needs.
"""

import csv
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from api_schemas import RunCreate
from shared import codec
from shared.alignment import hmac_ids
from shared.pq import GroupedProductQuantizer, PQConfig
from shared.schedule import batch_digest, batch_positions, split_train_eval

__all__ = [
    "CLASSES",
    "DEFAULT_IDS",
    "SCENARIOS",
    "Scenario",
    "StepSchedule",
    "read_ids",
    "write_label_table",
]

CLASSES = 62  # FEMNIST's classes; the label table's y column cycles through them
DEFAULT_IDS = 20_000  # enough for a next-token batch of 3840 rows plus the eval split


@dataclass(frozen=True)
class Scenario:
    """One kind of run a load-test user trains, at one of the paper's wire shapes."""

    name: str  # short label, used in request names and on the command line
    model: str  # party B's top model
    cut_dim: int  # d
    batch: int  # B, rows per step
    quantizer: dict[str, Any]  # QuantizerSpec fields: mode "pq" (FedLite) or "raw" (SplitFed)
    top: dict[str, Any] = field(default_factory=dict)  # top-model kwargs
    note: str = ""

    def run_create(self, name: str, *, steps: int, seed: int) -> RunCreate:
        """A run config as party A would post it (realistic: Adam, checkpoints every 50)."""
        return RunCreate.model_validate(
            {
                "name": name,
                "model": self.model,
                "top": self.top,
                "cut_dim": self.cut_dim,
                "quantizer": self.quantizer,
                "optimizer": {"name": "adam", "lr": 0.001},
                "batch_size": self.batch,
                "steps": steps,
                "seed": seed,
                "checkpoint_interval": 50,
                "eval_fraction": 0.2,
                "use_side_features": False,
            }
        )

    @property
    def pq(self) -> bool:
        return bool(self.quantizer["mode"] == "pq")

    @functools.cached_property
    def chunk(self) -> codec.Activations:
        """The activations every step of this scenario carries (computed once per process)."""
        z = _activations(self.batch, self.cut_dim, seed=0)
        if not self.pq:
            return codec.RawActivations(z.numpy())
        config = PQConfig(q=self.quantizer["q"], L=self.quantizer["L"], R=self.quantizer["R"])
        code = GroupedProductQuantizer(self.cut_dim, config).encode(z, seed=0)
        return codec.PQActivations(code.codebook.numpy(), code.codewords.numpy())


def _activations(rows: int, d: int, *, seed: int) -> torch.Tensor:
    """ReLU-like activations (about 40 % exact zeros, like the FEMNIST CNN's): (rows, d)."""
    g = torch.Generator().manual_seed(seed)
    return torch.relu(torch.randn(rows, d, generator=g) + 0.25)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "femnist-fedlite",
            "femnist_cnn",
            9216,
            20,
            {"mode": "pq", "q": 1152, "L": 2, "R": 1},
            note="the paper's FEMNIST point: 3,022-byte requests, 737 KB gradients",
        ),
        Scenario(
            "femnist-splitfed",
            "femnist_cnn",
            9216,
            20,
            {"mode": "raw"},
            note="SplitFed baseline: raw float32 activations, 737 KB each way",
        ),
        Scenario(
            "nwp-fedlite",
            "tabular_mlp",
            96,
            3840,
            {"mode": "pq", "q": 12, "L": 240, "R": 1},
            top={"hidden": []},
            note="the next-token wire shape (3840 token rows of d=96, q=12, L=240); party B "
            "serves one 62-class label table, so the top is Linear(96 -> 62) where the "
            "paper's next-token top is Linear(96 -> 10004)",
        ),
        Scenario(
            "credit-fedlite",
            "tabular_mlp",
            32,
            256,
            {"mode": "pq", "q": 8, "L": 16, "R": 1},
            top={"hidden": [32]},
            note="a small tabular step (default_credit's shape: B=256, d=32, q=8, L=16): the "
            "per-step floor of issue 27, where fixed costs are most of a step",
        ),
    ]
}


def write_label_table(path: Path, *, n: int = DEFAULT_IDS) -> Path:
    """Party B's table for load tests: ids u000000 ... and a label y in 0..61, CSV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "y"])
        for i in range(n):
            writer.writerow([f"u{i:06d}", i % CLASSES])
    return path


def read_ids(path: Path) -> list[str]:
    """The id column of a table written by :func:`write_label_table`."""
    with path.open(newline="") as f:
        return [row["id"] for row in csv.DictReader(f)]


class StepSchedule:
    """Party A's view of one aligned run: the digest and body of every step.

    ``intersection`` is party B's alignment answer (hex aligned keys in raw-id order), the
    order both parties use for the split and the batches.
    """

    def __init__(self, scenario: Scenario, spec: RunCreate, intersection: Sequence[str]) -> None:
        self.scenario = scenario
        self.spec = spec
        self.aligned = [bytes.fromhex(h) for h in intersection]
        self.train_pos, _ = split_train_eval(
            len(self.aligned), seed=spec.seed, eval_fraction=spec.eval_fraction
        )
        self._epoch_cache: dict[int, np.ndarray] = {}

    def digest(self, step: int) -> bytes:
        positions = self.train_pos[
            batch_positions(
                step, batch_size=self.spec.batch_size, n=len(self.train_pos), seed=self.spec.seed
            )
        ]
        return batch_digest([self.aligned[p] for p in positions])

    def body(self, step: int) -> bytes:
        """The encoded StepRequest of ``step`` (1-based)."""
        request = codec.StepRequest(
            step=step, batch_digest=self.digest(step), chunks=(self.scenario.chunk,)
        )
        return codec.encode_step_request(request)


def hashed_ids(alignment_key_hex: str, ids: Sequence[str]) -> list[str]:
    """What party A posts to /alignment: HMAC-SHA256(run key, id) of its ids, hex."""
    return [k.hex() for k in hmac_ids(bytes.fromhex(alignment_key_hex), ids)]
