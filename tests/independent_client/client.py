"""Party A over the HTTP binding of docs/PROTOCOL.md section 10, with a numpy bottom model.

The bottom model (one linear layer), the quantizer's k-means and the optimizer (plain SGD) are
this party A's own choices, not part of the protocol. Alignment is PSI-free (section 10.4:
this party A sends the aligned keys of all its ids). ``Protocol`` is the seam to the derived
values and messages: ``DocProtocol`` is this package's implementation of the documents; the
test runs the same loop with our reference code in its place and compares the top models.
"""

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import numpy as np

from tests.independent_client import derived, messages

__all__ = ["DocProtocol", "IndependentPartyA", "Settings"]

Chunk = tuple[str, np.ndarray, np.ndarray | None]  # ("pq", codebook, codewords) | ("raw", x, None)


class WireProtocol(Protocol):
    def aligned_list(self, key_hex: str, common_ids: list[str]) -> list[bytes]: ...
    def split(self, n: int, seed: int, eval_fraction: float) -> tuple[list[int], list[int]]: ...
    def batch(self, step: int, n: int, batch_size: int, seed: int) -> list[int]: ...
    def digest(self, keys: list[bytes]) -> bytes: ...
    def step_request(self, step: int, h: bytes, chunks: list[Chunk]) -> bytes: ...
    def evaluate_request(self, h: bytes, chunks: list[Chunk]) -> bytes: ...
    def predict_request(self, ids_hex: list[str], chunks: list[Chunk]) -> bytes: ...
    def step_response(self, body: bytes) -> tuple[int, float, np.ndarray]: ...
    def evaluate_response(self, body: bytes) -> tuple[int, float, dict[str, float]]: ...
    def predict_response(self, body: bytes) -> tuple[list[str], np.ndarray]: ...


class DocProtocol:
    """Sections 1-4 and 9, as ``derived`` and ``messages`` implement them."""

    def __init__(self) -> None:
        self._schedules: dict[tuple[int, int, int], derived.ShuffleSchedule] = {}

    def aligned_list(self, key_hex: str, common_ids: list[str]) -> list[bytes]:
        return derived.aligned_list(key_hex, common_ids)

    def split(self, n: int, seed: int, eval_fraction: float) -> tuple[list[int], list[int]]:
        return derived.split(n, seed, eval_fraction)

    def batch(self, step: int, n: int, batch_size: int, seed: int) -> list[int]:
        schedule = self._schedules.setdefault(
            (n, batch_size, seed), derived.ShuffleSchedule(n, batch_size, seed)
        )
        return schedule.batch(step)

    def digest(self, keys: list[bytes]) -> bytes:
        return derived.digest(keys)

    def step_request(self, step: int, h: bytes, chunks: list[Chunk]) -> bytes:
        return messages.step_request(step, h, [_chunk(c) for c in chunks])

    def evaluate_request(self, h: bytes, chunks: list[Chunk]) -> bytes:
        return messages.evaluate_request(h, [_chunk(c) for c in chunks])

    def predict_request(self, ids_hex: list[str], chunks: list[Chunk]) -> bytes:
        return messages.predict_request(ids_hex, [_chunk(c) for c in chunks])

    def step_response(self, body: bytes) -> tuple[int, float, np.ndarray]:
        m = messages.decode(body, "step_res")
        return int(m["s"]), float(m["l"]), m["g"]

    def evaluate_response(self, body: bytes) -> tuple[int, float, dict[str, float]]:
        m = messages.decode(body, "eval_res")
        return int(m["n"]), float(m["l"]), dict(m["m"])

    def predict_response(self, body: bytes) -> tuple[list[str], np.ndarray]:
        m = messages.decode(body, "pred_res")
        return list(m["ids"]), m["y"]


def _chunk(chunk: Chunk) -> dict[str, Any]:
    kind, array, codewords = chunk
    return (
        messages.pq_chunk(array, codewords) if codewords is not None else messages.raw_chunk(array)
    )


@dataclass
class Settings:
    """The run: what goes into RunCreate, plus this party A's own hyper-parameters."""

    steps: int = 30
    batch_size: int = 32
    seed: int = 5
    eval_fraction: float = 0.2
    cut_dim: int = 8
    q: int = 4
    L: int = 4
    mode: str = "pq"  # or "raw"
    top_lr: float = 0.1
    bottom_lr: float = 0.05
    lam: float = 0.001  # section 10.5, the paper's units
    kmeans_iterations: int = 5
    top_hidden: list[int] = field(default_factory=lambda: [16])
    spec: dict[str, Any] | None = None  # a whole RunCreate to send instead (its name replaced)

    def run_create(self, name: str) -> dict[str, Any]:
        if self.spec is not None:
            return {**self.spec, "name": name}
        quantizer: dict[str, Any] = {"mode": "raw"}
        if self.mode == "pq":
            quantizer = {"mode": "pq", "q": self.q, "L": self.L, "R": 1}
        return {
            "name": name,
            "model": "tabular_mlp",
            "top": {"hidden": self.top_hidden},
            "cut_dim": self.cut_dim,
            "quantizer": quantizer,
            "optimizer": {"name": "sgd", "lr": self.top_lr},
            "batch_size": self.batch_size,
            "steps": self.steps,
            "seed": self.seed,
            "eval_fraction": self.eval_fraction,
            "checkpoint_interval": 10,
        }


class IndependentPartyA:
    """Creates, aligns, trains, evaluates, predicts and finishes one run over HTTP."""

    def __init__(
        self,
        client: httpx.Client,
        ids: list[str],
        features: np.ndarray,
        settings: Settings,
        protocol: WireProtocol | None = None,
    ) -> None:
        self.http, self.settings = client, settings
        self.protocol: WireProtocol = protocol or DocProtocol()
        self.row_of = {sample_id: row for row, sample_id in enumerate(ids)}
        self.features = features.astype(np.float32)
        rng = np.random.default_rng(settings.seed)  # this party A's own initialisation
        scale = np.float32(1.0 / np.sqrt(features.shape[1]))
        self.W = (rng.standard_normal((features.shape[1], settings.cut_dim)) * scale).astype(
            np.float32
        )
        self.b = np.zeros(settings.cut_dim, dtype=np.float32)
        self.losses: list[float] = []

    # ------------------------------------------------------------------ HTTP, section 10

    def create_and_align(self, name: str) -> dict[str, Any]:
        """10.3 and 10.4: a run, aligned on the keys of all our ids (no PSI)."""
        created = self._ok(
            self.http.post(
                "/v1/runs",
                json=self.settings.run_create(name),
                headers={"Idempotency-Key": uuid.uuid4().hex},
            ),
            201,
        )
        self.run_id = created["id"]
        self._align(created["alignment_key"], self._route("alignment"))
        return created

    def _align(self, key_hex: str, path: str) -> dict[str, Any]:
        """10.4: the aligned keys of all our ids; the aligned list and split from the answer."""
        mine = {derived.aligned_key(key_hex, i).hex(): i for i in self.row_of}
        answer = self._ok(self._post(path, json={"hashed_ids": list(mine)}), 200)
        common = [mine[k] for k in answer["intersection"]]
        self.aligned = self.protocol.aligned_list(key_hex, common)
        if [k.hex() for k in self.aligned] != answer["intersection"]:
            raise AssertionError("party B's aligned list is not the one section 9.1 defines")
        self.aligned_ids = sorted(common, key=lambda i: i.encode("utf-8"))
        self.train, self.eval = self.protocol.split(
            len(self.aligned), self.settings.seed, self.settings.eval_fraction
        )
        if (len(self.train), len(self.eval)) != (answer["train"], answer["eval"]):
            raise AssertionError(f"split sizes differ from party B's: {answer}")
        return answer

    def _route(self, name: str) -> str:
        """The path of one of the run's routes (10.2)."""
        return f"/v1/runs/{self.run_id}/{name}"

    def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.post(path, **kwargs)

    def step(self, t: int) -> bytes:
        """10.5: step t; returns the request body (to resend it as is)."""
        s = self.settings
        positions = [
            self.train[i] for i in self.protocol.batch(t, len(self.train), s.batch_size, s.seed)
        ]
        x = self._rows(positions)
        z = x @ self.W + self.b
        chunk, z_tilde = self._quantize(z)
        h = self.protocol.digest([self.aligned[p] for p in positions])
        body = self.protocol.step_request(t, h, [chunk])
        answer = self._post(self._route("steps"), content=body, headers=_MSGPACK)
        step, loss, g = self.protocol.step_response(self._ok_bytes(answer))
        if step != t or g.shape != z.shape:
            raise AssertionError(f"step {t}: answered step {step}, gradient {g.shape}")
        grad_z = g + np.float32(s.lam) * (z - z_tilde)  # one chunk: n_c / n = 1
        self.W -= np.float32(s.bottom_lr) * (x.T @ grad_z)
        self.b -= np.float32(s.bottom_lr) * grad_z.sum(axis=0)
        self.losses.append(loss)
        return body

    def send_step(self, t: int, chunks: list[Chunk]) -> tuple[bytes, float, np.ndarray]:
        """10.5 with activations computed elsewhere (e.g. another party A's, for the same
        rows): this client derives the batch and digest and encodes the chunks itself.
        Returns (request body, loss, gradient)."""
        s = self.settings
        batch = self.protocol.batch(t, len(self.train), s.batch_size, s.seed)
        h = self.protocol.digest([self.aligned[self.train[i]] for i in batch])
        body = self.protocol.step_request(t, h, chunks)
        answer = self._post(self._route("steps"), content=body, headers=_MSGPACK)
        step, loss, g = self.protocol.step_response(self._ok_bytes(answer))
        if step != t:
            raise AssertionError(f"step {t}: answered step {step}")
        return body, loss, g

    def resend(self, body: bytes) -> bytes:
        answer = self._post(self._route("steps"), content=body, headers=_MSGPACK)
        return self._ok_bytes(answer)

    def evaluate(self) -> tuple[int, float, dict[str, float]]:
        """10.6: the eval split in ascending position, in chunks of batch_size samples."""
        z = self._rows(self.eval) @ self.W + self.b
        chunks = [
            self._quantize(z[i : i + self.settings.batch_size])[0]
            for i in range(0, len(z), self.settings.batch_size)
        ]
        h = self.protocol.digest([self.aligned[p] for p in self.eval])
        body = self.protocol.evaluate_request(h, chunks)
        answer = self._post(self._route("evaluate?split=eval"), content=body, headers=_MSGPACK)
        return self.protocol.evaluate_response(self._ok_bytes(answer))

    def predict(self, positions: list[int]) -> tuple[list[str], np.ndarray]:
        """10.6: rows named by their aligned keys in hex."""
        z = self._rows(positions) @ self.W + self.b
        ids = [self.aligned[p].hex() for p in positions]
        body = self.protocol.predict_request(ids, [self._quantize(z)[0]])
        answer = self._post(self._route("predict"), content=body, headers=_MSGPACK)
        return self.protocol.predict_response(self._ok_bytes(answer))

    def finish(self) -> dict[str, Any]:
        self._ok(self.http.post(f"/v1/runs/{self.run_id}/finish"), 200)
        return self._ok(self.http.get(f"/v1/runs/{self.run_id}"), 200)

    # ------------------------------------------------------------------ this party A's own

    def _rows(self, positions: list[int]) -> np.ndarray:
        return self.features[[self.row_of[self.aligned_ids[p]] for p in positions]]

    def _quantize(self, z: np.ndarray) -> tuple[Chunk, np.ndarray]:
        """A (B, d) block as one chunk, and the z~ party B will rebuild from it."""
        if self.settings.mode == "raw":
            return ("raw", z, None), z
        q, L = self.settings.q, self.settings.L
        sub = z.reshape(-1, z.shape[1] // q)  # (B q, d/q): row-major sub-vectors
        centroids = sub[:L].copy()
        for _ in range(self.settings.kmeans_iterations):
            assign = ((sub[:, None, :] - centroids[None]) ** 2).sum(-1).argmin(axis=1)
            for c in range(L):
                if (assign == c).any():
                    centroids[c] = sub[assign == c].mean(axis=0)
        assign = ((sub[:, None, :] - centroids[None]) ** 2).sum(-1).argmin(axis=1)
        codewords = assign.reshape(z.shape[0], q)
        z_tilde = centroids[codewords].reshape(z.shape)  # concatenation over j (2.3)
        return ("pq", centroids[None].astype(np.float32), codewords), z_tilde

    @staticmethod
    def _ok(response: httpx.Response, status: int) -> dict[str, Any]:
        if response.status_code != status:
            raise AssertionError(f"{response.request.url}: {response.status_code} {response.text}")
        body: dict[str, Any] = response.json()
        return body

    @staticmethod
    def _ok_bytes(response: httpx.Response) -> bytes:
        if response.status_code != 200:
            raise AssertionError(f"{response.request.url}: {response.status_code} {response.text}")
        if response.headers["content-type"] != "application/msgpack":
            raise AssertionError(response.headers["content-type"])
        return response.content


_MSGPACK = {"Content-Type": "application/msgpack"}
