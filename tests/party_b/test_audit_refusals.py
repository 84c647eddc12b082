"""Refused predictions and evaluations are in the audit trail (``party_b.audit.refused``), as
refusals for scope are: who tried to score what, whether or not party B answered. Against a
real party B over HTTP, read back with ``fedlite-b audit`` as its operator would: a 403 for
training ids the run's policy does not score, a 400 body, a 404 run, a 422 over a limit,
each with its status and problem; a prediction answered is ``ok`` with its ids."""

import json
from pathlib import Path

import httpx
import numpy as np

from party_b.api import create_app
from party_b.settings import Limits, Settings
from shared import codec
from tests.utils.cli import run_cli
from tests.utils.live import live_server
from tests.utils.small_runs import MSGPACK, TOKEN, aligned_run, labels_csv


def test_every_refused_prediction_is_an_audit_entry_with_its_status(tmp_path: Path) -> None:
    # Prepare: label privacy off, whose policy refuses to score training ids (403)
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"scorer:{TOKEN}",
        privacy="off",
        limits=Limits(max_batch=40),
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=60) as client,
    ):
        run = aligned_run(client)
        over = codec.encode_predict_request(
            codec.PredictRequest(
                ids=["0" * 64] * 41,
                chunks=(codec.RawActivations(np.zeros((41, 8), dtype=np.float32)),),
            )
        )

        # Execute
        answers = {
            "training ids": client.post(
                f"/v1/runs/{run.id}/predict", content=run.predict_body(), headers=MSGPACK
            ),
            "garbage": client.post(f"/v1/runs/{run.id}/predict", content=b"\xc1", headers=MSGPACK),
            "no such run": client.post("/v1/runs/nosuchrun/predict", content=b"", headers=MSGPACK),
            "over the limit": client.post(
                f"/v1/runs/{run.id}/predict", content=over, headers=MSGPACK
            ),
        }
    audit = run_cli(
        "b", "audit", "--data-dir", str(tmp_path / "b"), "--action", "predict", "--jsonl"
    )  # fmt: skip

    # Assert
    assert [a.status_code for a in answers.values()] == [403, 400, 404, 422]
    rows = [json.loads(line) for line in audit.stdout.splitlines()]
    refused = sorted((r["status"], r["problem"], r["run"]) for r in rows)
    assert refused == [
        (400, "malformed-message", run.id),
        (403, "privacy-refused", run.id),
        (404, "not-found", "nosuchrun"),
        (422, "limit-exceeded", run.id),
    ]
    assert all(r["outcome"] == "refused" and r["actor"] == "scorer" for r in rows)
