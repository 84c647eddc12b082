"""A party A written from the documents alone trains over real HTTP against a real party B.

``tests/independent_client`` implements docs/PROTOCOL.md (derived values, messages, bit
packing, the HTTP binding) with numpy, httpx, msgpack and the standard library only; the AST
check below keeps it from importing our code. It creates a run, aligns it without PSI, trains
on FATE's breast data (party B: the labelled guest table), resends its last step (answered
byte for byte), evaluates, predicts and finishes. Then the same loop runs a second time with
our reference code (``shared``) in place of its protocol layer: the same bottom model and
quantizer get the same gradients back only if both derive the same batches, digests and
bytes, so the two top models must end bit-identical (``model_sha256``).
"""

import ast
import csv
import gzip
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from party_b.api import create_app
from party_b.settings import Settings as PartyBSettings
from shared import codec
from shared.alignment import hmac_ids
from shared.schedule import batch_digest, batch_positions, split_train_eval
from tests.independent_client.client import Chunk, IndependentPartyA, Settings
from tests.utils.data import breast_pair
from tests.utils.live import live_server
from tests.utils.small_runs import TOKEN

pytestmark = pytest.mark.slow

PACKAGE = Path(__file__).parent / "independent_client"
ALLOWED = {"hashlib", "hmac", "math", "uuid", "dataclasses", "typing", "collections"}
ALLOWED |= {"numpy", "httpx", "msgpack", "tests"}


def test_the_independent_client_imports_nothing_of_ours() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] in ALLOWED, f"{path.name} imports {name}"
                if name.startswith("tests"):
                    assert name.startswith("tests.independent_client"), f"{path.name}: {name}"


class ReferenceProtocol:
    """The same seam, served by our reference implementation (shared/)."""

    def aligned_list(self, key_hex: str, common_ids: list[str]) -> list[bytes]:
        return hmac_ids(bytes.fromhex(key_hex), sorted(common_ids))

    def split(self, n: int, seed: int, eval_fraction: float) -> tuple[list[int], list[int]]:
        train, eval_ = split_train_eval(n, seed=seed, eval_fraction=eval_fraction)
        return train.tolist(), eval_.tolist()

    def batch(self, step: int, n: int, batch_size: int, seed: int) -> list[int]:
        return [int(p) for p in batch_positions(step, batch_size=batch_size, n=n, seed=seed)]

    def digest(self, keys: list[bytes]) -> bytes:
        return batch_digest(keys)

    def step_request(self, step: int, h: bytes, chunks: list[Chunk]) -> bytes:
        request = codec.StepRequest(step=step, batch_digest=h, chunks=_chunks(chunks))
        return codec.encode_step_request(request)

    def evaluate_request(self, h: bytes, chunks: list[Chunk]) -> bytes:
        request = codec.EvaluateRequest(ids_digest=h, chunks=_chunks(chunks))
        return codec.encode_evaluate_request(request)

    def predict_request(self, ids_hex: list[str], chunks: list[Chunk]) -> bytes:
        request = codec.PredictRequest(ids=ids_hex, chunks=_chunks(chunks))
        return codec.encode_predict_request(request)

    def step_response(self, body: bytes) -> tuple[int, float, np.ndarray]:
        answer = codec.decode_step_response(body)
        return answer.step, answer.loss, answer.grad

    def evaluate_response(self, body: bytes) -> tuple[int, float, dict[str, float]]:
        answer = codec.decode_evaluate_response(body)
        return answer.n, answer.loss, answer.metrics

    def predict_response(self, body: bytes) -> tuple[list[str], np.ndarray]:
        answer = codec.decode_predict_response(body)
        return answer.ids, answer.scores


def _chunks(chunks: list[Chunk]) -> tuple[codec.Activations, ...]:
    return tuple(
        codec.PQActivations(codebook=array, codewords=codewords)
        if codewords is not None
        else codec.RawActivations(array)
        for _kind, array, codewords in chunks
    )


def _host_table() -> tuple[list[str], np.ndarray]:
    _guest, host = breast_pair()
    with gzip.open(host, "rt", newline="") as f:
        rows = list(csv.reader(f))
    return [r[0] for r in rows[1:]], np.array([r[1:] for r in rows[1:]], dtype=np.float32)


@pytest.fixture(scope="module")
def party_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    guest, _host = breast_pair()  # skips (or fails in CI) without ../shared/data
    tmp = tmp_path_factory.mktemp("independent")
    settings = PartyBSettings(data_dir=tmp / "b", labels=guest, tokens=f"t:{TOKEN}")
    with live_server(create_app(settings)) as url:
        yield url


def _train(url: str, settings: Settings, protocol: object | None, name: str) -> dict[str, object]:
    ids, features = _host_table()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
        party_a = IndependentPartyA(http, ids, features, settings, protocol)  # type: ignore[arg-type]
        party_a.create_and_align(name)
        last = b""
        for t in range(1, settings.steps + 1):
            last = party_a.step(t)
        first_answer = party_a.resend(last)  # a resent last step: stored answer, no update
        again = party_a.resend(last)
        n, loss, metrics = party_a.evaluate()
        ids_out, scores = party_a.predict(party_a.eval[:5])
        run = party_a.finish()
    assert again == first_answer
    assert n == len(party_a.eval) and np.isfinite(loss) and "accuracy" in metrics
    assert ids_out == [party_a.aligned[p].hex() for p in party_a.eval[:5]]
    assert scores.shape == (5, 2) and np.isfinite(scores).all()
    assert run["step"] == settings.steps and run["status"] == "finished"
    return {"run": run, "losses": party_a.losses, "eval": (loss, metrics)}


@pytest.mark.parametrize("mode", ["pq", "raw"])
def test_the_independent_client_trains_like_our_reference(party_b: str, mode: str) -> None:
    settings = Settings(mode=mode)
    ours = _train(party_b, settings, None, f"independent-{mode}")
    reference = _train(party_b, settings, ReferenceProtocol(), f"reference-{mode}")
    losses = ours["losses"]
    assert isinstance(losses, list) and len(losses) == settings.steps
    assert np.mean(losses[-10:]) < np.mean(losses[:10]), losses  # it learns
    assert losses == reference["losses"]
    assert ours["eval"] == reference["eval"]
    sha = ours["run"]["model_sha256"]  # type: ignore[index]
    assert sha and sha == reference["run"]["model_sha256"]  # type: ignore[index]
