"""Party B's operator sees every evaluation on the true labels; party A never does.

A real party B (uvicorn in a thread, a SQLite file) under the default label DP: party A's
evaluation reply is on the run's randomized labels and carries their positive share; the
operator's view of the same activations is on the true labels, in ``fedlite-b evaluate``
(and against a held-out table), ``fedlite-b runs show`` and the dashboard, and goes with the
run when it is deleted.
"""

import json
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from party_b import store
from party_b.api import create_app
from party_b.privacy.label_dp import run_targets
from party_b.service import Service
from party_b.settings import Settings
from shared import codec
from tests.utils.cli import run_cli
from tests.utils.live import live_server
from tests.utils.small_runs import MSGPACK, TOKEN, aligned_run, labels_csv

OPERATOR = "operator-credential-0123456789abcdef"


def test_the_operator_sees_each_evaluation_on_the_true_labels_and_party_a_does_not(
    tmp_path: Path,
) -> None:
    # Prepare: party B with no privacy flag, a run trained three steps
    labels = labels_csv(tmp_path / "labels.csv")
    data_dir = tmp_path / "b"
    settings = Settings(
        data_dir=data_dir, labels=labels, tokens=f"t:{TOKEN}", dashboard_token=OPERATOR
    )
    app = create_app(settings)
    service: Service = app.state.service
    with (
        live_server(app) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
    ):
        run = aligned_run(client)
        for step in (1, 2, 3):
            answer = client.post(
                f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK
            )
            assert answer.status_code == 200, answer.text

        # Act: party A evaluates the held-out split twice; party A and the operator look
        replies = []
        for _ in range(2):
            answer = client.post(
                f"/v1/runs/{run.id}/evaluate", content=run.evaluate_body(), headers=MSGPACK
            )
            assert answer.status_code == 200, answer.text
            replies.append(codec.decode_evaluate_response(answer.content))
        party_a = client.get(f"/v1/runs/{run.id}/evaluations").json()
        dashboard = httpx.get(
            f"{url}/dashboard/api/runs/{run.id}", headers={"Authorization": f"Bearer {OPERATOR}"}
        ).json()
    evaluated = run_cli("b", "evaluate", run.id, "--data-dir", str(data_dir))

    # Assert: party A's reply is on the randomized labels, with their share of positives
    state = service.context.cache.peek(run.id)
    assert state is not None
    rows = state.label_rows[run.split[1]]
    source = service.context.labels
    randomized = run_targets(state.privacy, source.targets(rows), rows, 2, source)
    assert replies[0].metrics["label_rate"] == pytest.approx(float(randomized.float().mean()))
    # the operator's view: the same activations on the true labels, once per evaluation
    assert evaluated.returncode == 0, evaluated.stderr
    lines = [json.loads(x) for x in evaluated.stdout.splitlines()]
    assert len(lines) == 2 and lines[0]["party_a"]["loss"] == pytest.approx(replies[0].loss)
    truth = lines[0]["true_labels"]
    assert truth["loss"] != pytest.approx(replies[0].loss)  # the labels differ somewhere
    assert set(truth) == {"loss", "accuracy", "auc"}
    assert [e["true_metrics"] for e in dashboard["evaluations"]] == [
        {k: v for k, v in line["true_labels"].items() if k != "loss"} for line in lines
    ]
    shown = run_cli("b", "runs", "show", run.id, "--data-dir", str(data_dir))
    assert json.loads(shown.stdout)["evaluations"][1]["true_labels"] == lines[1]["true_labels"]
    # nothing party A can read holds them
    assert "true" not in json.dumps(party_a)
    assert [e["loss"] for e in party_a] == pytest.approx([r.loss for r in replies])
    # only the newest evaluation of the split keeps its scores
    with service.context.sessions() as session:
        kept = store.newest_scored(session, run.id)
        assert len(kept) == 1 and kept[0].eval_id == max(e.id for e in store.eval_results(
            session, run.id
        ))  # fmt: skip


def test_evaluate_scores_the_newest_scores_against_a_held_out_table(tmp_path: Path) -> None:
    # Prepare: a run trained and evaluated; a held-out table of some of its evaluated ids
    # with their labels, one of them changed, and ids party B never saw
    labels = labels_csv(tmp_path / "labels.csv")
    data_dir = tmp_path / "b"
    app = create_app(Settings(data_dir=data_dir, labels=labels, tokens=f"t:{TOKEN}"))
    with (
        live_server(app) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
    ):
        run = aligned_run(client)
        before = run_cli("b", "evaluate", run.id, "--data-dir", str(data_dir))
        client.post(f"/v1/runs/{run.id}/steps", content=run.step_body(1), headers=MSGPACK)
        answer = client.post(
            f"/v1/runs/{run.id}/evaluate", content=run.evaluate_body(), headers=MSGPACK
        )
        assert answer.status_code == 200, answer.text
    table = pd.read_csv(labels, dtype={"id": str})
    service: Service = app.state.service
    state = service.context.cache.peek(run.id)
    assert state is not None
    ids = [service.context.labels.ids[r] for r in state.label_rows[run.split[1]]]
    held_out = table[table["id"].isin(ids[:6])][["id", "y"]].copy()
    held_out.loc[held_out.index[0], "y"] = 1 - held_out["y"].iloc[0]
    held_out = pd.concat([held_out, pd.DataFrame({"id": ["new-1", "new-2"], "y": [0, 1]})])
    held_out.to_csv(tmp_path / "later.csv", index=False)
    three = pd.DataFrame({"id": ["a", "b", "c"], "y": ["x", "y", "z"]})
    three.to_csv(tmp_path / "three.csv", index=False)

    # Act
    scored = run_cli(
        "b", "evaluate", run.id, "--held-out", str(tmp_path / "later.csv"), "--data-dir",
        str(data_dir),
    )  # fmt: skip
    wrong = run_cli(
        "b", "evaluate", run.id, "--held-out", str(tmp_path / "three.csv"), "--data-dir",
        str(data_dir),
    )  # fmt: skip
    missing = run_cli("b", "evaluate", "no-such-run", "--data-dir", str(data_dir))

    # Assert: the six evaluated ids it shares, scored by the model's kept scores against
    # its labels (not party B's table's); the mistakes are one line each, exit code 1
    assert scored.returncode == 0, scored.stderr
    (line,) = [json.loads(x) for x in scored.stdout.splitlines()]
    assert (line["split"], line["scored"], line["held_out"]["n"]) == ("eval", len(ids), 6)
    with service.context.sessions() as session:
        (kept,) = store.newest_scored(session, run.id)
        assert kept.scores is not None
        scores = np.frombuffer(kept.scores, dtype=np.float32).reshape(-1, 2)[:6]
    expected = held_out.set_index("id").loc[ids[:6], "y"].to_numpy()
    assert line["held_out"]["accuracy"] == pytest.approx(
        float((scores.argmax(axis=1) == expected).mean())
    )
    assert before.returncode == 1 and "has no evaluation yet" in before.stderr
    assert wrong.returncode == 1 and "has 3 classes (x, y, z)" in wrong.stderr
    assert missing.returncode == 1 and "no run 'no-such-run'" in missing.stderr
    # a deleted run takes its operator evaluations with it
    with service.context.sessions() as session:
        store.delete_run(session, run.id)
        session.commit()
        assert store.operator_evaluations(session, run.id) == {}
