"""A party A written from the documents alone trains over real HTTP against a real party B.

``tests/independent_client`` implements docs/PROTOCOL.md (derived values, messages, bit
packing, the HTTP binding) with numpy, httpx, msgpack and the standard library only; the AST
check below keeps it from importing our code. It creates a run, aligns it without PSI, trains
on FATE's breast data (party B: the labelled guest table), resends its last step (answered
byte for byte), evaluates, predicts and finishes. Then the same loop runs a second time with
our reference code (``shared``) in place of its protocol layer: the same bottom model and
quantizer get the same gradients back only if both derive the same batches, digests and
bytes, so the two top models must end bit-identical (``model_sha256``).

Last, against ``fedlite-a`` itself: its bottom model and k-means are party A's own business
(torch, not in the documents), so the independent client takes fedlite-a's activations
(decoded from fedlite-a's requests with its own decoder) and does everything else itself in a
run of the same config: derives every batch and digest, encodes the requests (byte for byte
fedlite-a's, apart from the digest under its own run key), decodes the gradients (equal to
fedlite-a's), and ends with fedlite-a's top-model checksum.
"""

import ast
import csv
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from party_b.api import create_app
from party_b.settings import Settings as PartyBSettings
from shared import codec
from shared.alignment import hmac_ids
from shared.schedule import batch_digest, batch_positions, split_train_eval
from tests.independent_client import messages
from tests.independent_client.client import Chunk, IndependentPartyA, Settings
from tests.utils.data import breast_pair
from tests.utils.live import live_server
from tests.utils.party_a import breast_config, make_trainer
from tests.utils.small_runs import TOKEN

PACKAGE = Path(__file__).resolve().parents[1] / "independent_client"
ALLOWED = {"hashlib", "hmac", "math", "uuid", "dataclasses", "typing", "collections", "time"}
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
    # privacy off: the tests compare one run's losses, evaluations and model with another
    # run's, byte for byte; label DP (the default) randomizes each run's labels afresh and
    # sends no loss
    settings = PartyBSettings(data_dir=tmp / "b", labels=guest, tokens=f"t:{TOKEN}", privacy="off")
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


class _Recording:
    """fedlite-a's transport, keeping every step request it sent and the answer it got."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.steps: list[tuple[bytes, bytes]] = []

    def step(self, run_id: str, body: bytes) -> bytes:
        answer: bytes = self._transport.step(run_id, body)
        self.steps.append((body, answer))
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def test_the_independent_client_ends_with_fedlite_as_top_model(
    party_b: str, tmp_path: Path
) -> None:
    """fedlite-a trains a run; the independent client sends the same activations (decoded from
    fedlite-a's requests with its own decoder, re-encoded with its own encoder) in a run of
    the same config, with batches and digests of its own: same gradients, same top model."""
    _guest, host = breast_pair()
    config = breast_config("fedlite-a-reference", **{"run.steps": 30})
    trainer = make_trainer(tmp_path / "a", party_b, TOKEN, host, config)
    recording = _Recording(trainer.transport)
    trainer.transport = recording
    try:
        trainer.prepare(create=True)
        trainer.train()
        spec = trainer.transport.get_run(trainer.run_id).config.model_dump(mode="json")
    finally:
        trainer.close()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=party_b, headers=auth, timeout=60) as http:
        expected = http.get(f"/v1/runs/{trainer.run_id}").json()["model_sha256"]
        ids, features = _host_table()
        settings = Settings(
            steps=spec["steps"],
            batch_size=spec["batch_size"],
            seed=spec["seed"],
            eval_fraction=spec["eval_fraction"],
            spec=spec,
        )
        party_a = IndependentPartyA(http, ids, features, settings)
        party_a.create_and_align("independent-replay")
        for t, (body, answer) in enumerate(recording.steps, start=1):
            step, theirs, chunks = messages.read_step_request(body)
            assert step == t
            sent, _loss, g = party_a.send_step(t, [("pq", cb, cw) for cb, cw in chunks])
            ours = messages.read_step_request(sent)[1]  # the digest under this run's own key
            assert sent.replace(ours, theirs, 1) == body  # otherwise byte for byte the same
            assert np.array_equal(g, codec.decode_step_response(answer).grad)
        run = party_a.finish()
    assert len(recording.steps) == 30
    assert run["model_sha256"] == expected


# ------------------------------------------------------------------ several feature parties

THIRDS = {"left": slice(0, 7), "middle": slice(7, 14), "right": slice(14, 20)}
WIDTHS = {"left": 4, "middle": 4, "right": 8}


def _finish_first(me: Any) -> dict[str, Any]:  # fedlite-a's order
    run = me.finish()
    return {"run": run, "eval": me.evaluate(), "pred": me.predict(me.eval[:5])}


def _finish_last(me: Any) -> dict[str, Any]:
    evaluation, prediction = me.evaluate(), me.predict(me.eval[:5])
    return {"eval": evaluation, "pred": prediction, "run": me.finish()}


def _finish_between(me: Any) -> dict[str, Any]:
    evaluation, run = me.evaluate(), me.finish()
    return {"eval": evaluation, "run": run, "pred": me.predict(me.eval[:5])}


# each party's last calls in another order (PROTOCOL.md 12.7)
LAST_CALLS = {"left": _finish_first, "middle": _finish_last, "right": _finish_between}


def _three_parties(
    url: str, name: str, protocol: object | None
) -> tuple[dict[str, Any], dict[str, list[float]], dict[str, Any]]:
    """A run of three independent parties (the host's columns in thirds, each its own width
    and bottom model), created by the owner, its party tokens issued by party B's operator
    (the CLI); every party aligns and trains at once, then makes its last calls in an order
    of its own (PROTOCOL.md 12.7: every order completes)."""
    import subprocess
    import sys
    import threading

    from tests.independent_client.parties import (
        IndependentParty,
        PartySettings,
        parties_run_create,
    )

    ids, features = _host_table()
    settings = {p: PartySettings(party=p, cut_dim=d, q=d // 2, L=4) for p, d in WIDTHS.items()}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as owner:
        run = owner.post("/v1/runs", json=parties_run_create(name, list(settings.values())))
    assert run.status_code == 201, run.text
    run_id = run.json()["id"]
    data_dir = Path(url_data[url])
    issued = subprocess.run(
        [sys.executable, "-m", "party_b.ops.cli", "parties", "tokens", "--run", run_id,
         "--data-dir", str(data_dir)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    tokens = json.loads(issued.stdout)["tokens"]
    out: dict[str, Any] = {}
    losses: dict[str, list[float]] = {}
    errors: list[BaseException] = []

    def party(p: str) -> None:
        try:
            auth = {"Authorization": f"Bearer {tokens[p]}"}
            with httpx.Client(base_url=url, headers=auth, timeout=120) as http:
                me = IndependentParty(http, ids, features[:, THIRDS[p]], settings[p], protocol)  # type: ignore[arg-type]
                me.join_and_align()
                for t in range(1, settings[p].steps + 1):
                    last = me.step(t)
                assert me.resend(last) == me.resend(last)  # stored bytes, per party
                out[p] = LAST_CALLS[p](me)
                losses[p] = me.losses
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=party, args=(p,)) for p in WIDTHS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    if errors:
        raise errors[0]
    return out, losses, run.json()


url_data: dict[str, str] = {}  # party B's URL -> its data directory (the operator's CLI)


@pytest.fixture(scope="module")
def party_b_with_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    guest, _host = breast_pair()
    tmp = tmp_path_factory.mktemp("independent-parties")
    # two runs compared to the bit: no per-run randomized labels (label DP is per run)
    settings = PartyBSettings(data_dir=tmp / "b", labels=guest, tokens=f"t:{TOKEN}", privacy="off")
    with live_server(create_app(settings)) as url:
        url_data[url] = str(tmp / "b")
        yield url


def test_three_independent_parties_train_one_run_like_our_reference(
    party_b_with_data: str,
) -> None:
    """docs/PROTOCOL.md section 12 alone is enough for a three-party run: three parties
    written from the documents (each its own columns, width, bottom model and token) train,
    evaluate, predict and finish one run; with our reference code in their place the top
    model ends bit-identical."""
    url = party_b_with_data
    ours, losses, _run = _three_parties(url, "independent-parties", None)
    theirs, reference_losses, _ = _three_parties(url, "reference-parties", ReferenceProtocol())

    steps = len(losses["left"])
    assert steps == 30 and all(v == losses["left"] for v in losses.values())  # one loss a step
    assert np.mean(losses["left"][-10:]) < np.mean(losses["left"][:10])  # it learns
    assert losses == reference_losses
    evaluations = {p: o["eval"] for p, o in ours.items()}
    assert all(e == evaluations["left"] for e in evaluations.values())
    assert "accuracy" in evaluations["left"][2]
    scores = [o["pred"][1] for o in ours.values()]
    assert all(np.array_equal(s, scores[0]) for s in scores) and scores[0].shape == (5, 2)
    runs = [o["run"] for o in (*ours.values(), *theirs.values())]
    assert {r["status"] for r in runs} == {"finished"} and {r["step"] for r in runs} == {30}
    assert {r["model_sha256"] for r in runs[:3]} == {r["model_sha256"] for r in runs[3:]}
