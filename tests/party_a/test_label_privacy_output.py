"""Model quality under party B's default label DP, as each party sees it.

``fedlite-a train`` against a party B started with no privacy flag (uvicorn in a thread, the
bundled demo data, the example's 100 steps) says that label DP is on and its epsilon, shows
its held-out metrics as on randomized labels and beside them debiased estimates of the
true-label ones with an interval; party B's operator sees the true-label metrics of the same
evaluation (``fedlite-b evaluate``, ``runs show``), which no route of party A's returns.
The estimators themselves are checked on simulated randomized labels.
"""

import json
import math
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from party_a.debiased import true_accuracy, true_auc
from party_b.api import create_app
from party_b.privacy import PRESETS
from party_b.privacy.label_dp import auc_bound, keep_probability
from party_b.settings import Settings
from tests.utils.cli import DEMO_CONFIG, TOKEN, demo_tables, run_cli
from tests.utils.live import live_server

DEFAULT = PRESETS["protected"]


def test_train_under_the_default_says_label_dp_is_on_and_estimates_the_true_metrics(
    tmp_path: Path,
) -> None:
    # Prepare: party B as a new operator starts it (no privacy flag), the demo tables
    features, labels = demo_tables(tmp_path)
    data_dir = tmp_path / "b"
    settings = Settings(data_dir=data_dir, labels=labels, tokens=f"a:{TOKEN}")

    # Act: party A trains the example's 100 steps; party A reads the run's evaluations back
    with live_server(create_app(settings)) as url:
        ran = run_cli(
            "a", "train", "--server", url, "--token", TOKEN, "--features", str(features),
            "--config", str(DEMO_CONFIG), "--state-dir", str(tmp_path / "a"),
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        run_id = re.search(r"run (\w{32}) ", ran.stderr)
        assert run_id is not None
        evaluated = run_cli(
            "a", "evaluate", "--server", url, "--token", TOKEN, "--features", str(features),
            "--config", str(DEMO_CONFIG), "--state-dir", str(tmp_path / "a"),
        )  # fmt: skip
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            party_a_view = client.get(f"/v1/runs/{run_id[1]}/evaluations").json()
            run = client.get(f"/v1/runs/{run_id[1]}").json()
    operator = run_cli("b", "evaluate", run_id[1], "--data-dir", str(data_dir))
    shown = run_cli("b", "runs", "show", run_id[1], "--data-dir", str(data_dir))

    # Assert: party A is told, in words, that label DP is on and its epsilon, at the start
    # and in the summary; its metrics read as on randomized labels, with estimates
    epsilon = DEFAULT.label_epsilon
    assert epsilon is not None
    text = " ".join(ran.stderr.split())  # the console wraps lines
    assert (
        f"label privacy: party B gives this run label differential privacy, epsilon "
        f"{epsilon:g} (any test of one label from what this run sends reaches an AUC of at "
        f"most {auc_bound(epsilon):.3f})" in text
    )
    assert "evaluations are on the randomized labels" in text
    assert re.search(f"│ label privacy +│ label DP on, epsilon {epsilon:g} per party B", text)
    randomized = float(re.findall(r"eval auc \(randomized labels\)\s+│ ([0-9.]+)", ran.stderr)[0])
    estimate = re.search(
        r"eval auc, true labels \(estimate\)\s+│ ([0-9.]+) \(95 % interval ([0-9.]+) to", ran.stderr
    )
    assert estimate is not None, ran.stderr
    # ... and party B's operator sees the true-label metrics of that evaluation
    assert operator.returncode == 0, operator.stderr
    # train's evaluation, then fedlite-a evaluate's, of the same model
    line, repeated = [json.loads(x) for x in operator.stdout.splitlines()]
    assert repeated["party_a"] == line["party_a"]
    truth = line["true_labels"]["auc"]
    assert line["party_a"]["auc"] == pytest.approx(randomized, abs=1e-4)
    assert truth > randomized  # the randomized labels understate the model
    assert float(estimate[2]) <= truth  # the interval's low end holds the truth
    # fedlite-a evaluate says the same: randomized labels, and the estimate beside them
    assert evaluated.returncode == 0, evaluated.stderr
    again = json.loads(evaluated.stdout)
    assert again["labels"] == "randomized" and again["auc"] == pytest.approx(randomized, abs=1e-4)
    assert again["true_label_estimates"]["auc"]["value"] == pytest.approx(
        float(estimate[1]), abs=1e-4
    )
    assert again["true_label_estimates"]["auc"]["low"] <= truth
    assert json.loads(shown.stdout)["evaluations"][0]["true_labels"]["auc"] == truth
    # what party A can read of the run is on the randomized labels only
    assert party_a_view[0]["metrics"]["auc"] == line["party_a"]["auc"]
    assert "true_labels" not in json.dumps(party_a_view) + json.dumps(run)
    assert run["privacy"]["label_keep"] == pytest.approx(keep_probability(epsilon, 2))


@pytest.mark.parametrize("epsilon", [0.4, 1.0, 2.0])
def test_the_estimates_recover_the_true_metrics_from_randomized_labels(epsilon: float) -> None:
    # Prepare: a model's scores on 4,000 held-out rows (22 % positives), known true metrics
    rng = np.random.default_rng(int(epsilon * 10))
    n = 4000
    truth = (rng.random(n) < 0.22).astype(np.int64)
    scores = truth * 1.2 + rng.standard_normal(n)
    keep = keep_probability(epsilon, 2)

    # Act: randomized response on the labels, as party B's draw; the metrics party A gets
    flipped = rng.random(n) >= keep
    randomized = np.where(flipped, 1 - truth, truth)
    predicted = (scores > 0.6).astype(np.int64)
    auc = true_auc(
        float(roc_auc_score(randomized, scores)),
        keep=keep,
        label_rate=float(randomized.mean()),
        n=n,
    )
    accuracy = true_accuracy(float((predicted == randomized).mean()), keep=keep, classes=2, n=n)

    # Assert: each interval holds the true metric, the estimate is close to it
    true_auc_value = float(roc_auc_score(truth, scores))
    true_acc_value = float((predicted == truth).mean())
    assert auc is not None and accuracy is not None
    assert auc.low <= true_auc_value <= auc.high
    assert accuracy.low <= true_acc_value <= accuracy.high
    assert abs(auc.value - true_auc_value) < (auc.high - auc.low) / 2
    # no estimate where the randomized labels carry nothing to invert
    assert true_auc(0.6, keep=0.5001, label_rate=0.5, n=n) is None
    assert true_accuracy(math.nan, keep=keep, classes=2, n=n) is None
