"""Evaluate and predict at party B: extreme input is a clear 4xx, never a 5xx."""

import math
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from party_b.api import create_app
from party_b.settings import Settings
from party_b.top import OutputNotFinite, TopTrainer
from shared import codec
from shared.schedule import batch_digest
from tests.utils.live import live_server
from tests.utils.small_runs import MSGPACK, TOKEN, aligned_run, labels_csv, problem

# Codebooks at the edge of float32 (its largest value is 3.4e38): the top model's outputs
# stay finite for some (then they are computed) and overflow for others (then refused).
EXTREMES = {
    "positive": np.full((1, 2, 2), 3e38),
    "negative": np.full((1, 2, 2), -3e38),
    "mixed": np.array([[[3e38, -3e38], [-3e38, 3e38]]]),
}


def _chunk(codebook: np.ndarray, rows: int) -> codec.PQActivations:
    return codec.PQActivations(
        codebook=codebook.astype(np.float32),
        codewords=np.random.default_rng(0).integers(0, 2, (rows, 4)),
    )


def test_extreme_but_finite_activations_are_computed_or_get_a_clear_4xx(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "labels.csv"), tokens=f"t:{TOKEN}"
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=60) as client,
    ):
        run = aligned_run(client)
        client.post(f"/v1/runs/{run.id}/steps", content=run.step_body(1), headers=MSGPACK)
        _, eval_pos = run.split
        digest = batch_digest([run.aligned[p] for p in eval_pos])
        ids = [k.hex() for k in run.aligned[:4]]
        refused, logged = 0, 0
        for codebook in EXTREMES.values():
            evaluate = codec.EvaluateRequest(digest, (_chunk(codebook, len(eval_pos)),))
            predict = codec.PredictRequest(ids, (_chunk(codebook, 4),))
            for route, body in [
                ("evaluate", codec.encode_evaluate_request(evaluate)),
                ("predict", codec.encode_predict_request(predict)),
            ]:
                answer = client.post(f"/v1/runs/{run.id}/{route}", content=body, headers=MSGPACK)
                if answer.status_code == 200:  # computed: a valid message
                    if route == "evaluate":
                        # a computed evaluation is a number, never inf (stored as null)
                        assert math.isfinite(codec.decode_evaluate_response(answer.content).loss)
                        logged += 1
                    else:
                        codec.decode_predict_response(answer.content)
                    continue
                problem(answer, 422, "activations-out-of-range")
                assert "not finite" in answer.json()["detail"]
                refused += 1
        assert refused >= 2  # the negative codebook overflows both routes

        # only computed evaluations are logged, and sane input is served as before
        assert len(client.get(f"/v1/runs/{run.id}/evaluations").json()) == logged
        sane_body = run.evaluate_body()
        sane = client.post(f"/v1/runs/{run.id}/evaluate", content=sane_body, headers=MSGPACK)
        assert sane.status_code == 200, sane.text


def test_an_evaluation_whose_loss_overflows_is_refused_not_answered_as_inf() -> None:
    """Outputs can be finite while the loss is not (logits +3e38 and -3e38: the cross-entropy
    of the wrong class is 6e38, beyond float32). That evaluation was answered 200 with loss
    inf, stored as null; it is refused like outputs that overflow."""
    top = TopTrainer(
        model="tabular_mlp",
        top_kwargs={"hidden": [], "num_classes": 2, "side_features": 0},
        cut_dim=2,
        optimizer={"name": "sgd", "lr": 0.1},
        task="classification",
        seed=0,
    )
    with torch.no_grad():  # logits = z, so the activations choose the logits exactly
        layer = next(m for m in top.model.modules() if isinstance(m, torch.nn.Linear))
        layer.weight.copy_(torch.eye(2))
        layer.bias.zero_()
    z = torch.tensor([[3e38, -3e38], [1.0, 0.0]])
    targets = torch.tensor([1, 0])

    assert bool(torch.isfinite(top.predict(z, None)).all())  # the outputs are finite
    with pytest.raises(OutputNotFinite, match="the loss is not finite"):
        top.evaluate(z, targets, None)
    sane = top.evaluate(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]), None)
    assert math.isfinite(sane.loss)


def test_predict_ids_are_aligned_keys_in_lowercase_hex_as_written(tmp_path: Path) -> None:
    """PROTOCOL.md 4.5: ids are 64 lowercase hex characters. The same key in uppercase, or
    with a prefix, is not an aligned key: 422 unknown-ids (it once passed bytes.fromhex)."""
    settings = Settings(
        data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "labels.csv"), tokens=f"t:{TOKEN}"
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=60) as client,
    ):
        run = aligned_run(client)
        lower = [k.hex() for k in run.aligned[:2]]
        chunk = run.chunk(2)
        for ids, status in [
            (lower, 200),
            ([lower[0].upper(), lower[1]], 422),
            ([lower[0], " " + lower[1]], 422),
            ([lower[0], "0x" + lower[1][2:]], 422),
        ]:
            body = codec.encode_predict_request(codec.PredictRequest(ids=ids, chunks=(chunk,)))
            answer = client.post(f"/v1/runs/{run.id}/predict", content=body, headers=MSGPACK)
            if status == 200:
                assert answer.status_code == 200, answer.text
                assert codec.decode_predict_response(answer.content).ids == ids
            else:
                assert "1 of 2 ids" in problem(answer, 422, "unknown-ids")["detail"]
