"""Label differential privacy as party B's default, its accounting and its side channels.

Real services on real SQLite files, in process or behind uvicorn over HTTP: a party B given
no privacy switch trains new runs under label DP and shows party A nothing but gradients; an
evaluation is on the run's randomized labels; each run's epsilon is recorded for its token,
kept after the run is deleted, and a token's budget refuses a creation that would pass it;
``predict`` refuses the training split's ids where no label DP covers the model; old runs
load as they were; ``/metrics`` shows nothing of any run without the operator's credential.
"""

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from sqlalchemy import delete, update

from api_schemas import ProblemType, RunCreate
from party_b import store
from party_b.api import create_app
from party_b.errors import ProblemError
from party_b.ops.cli import main as fedlite_b
from party_b.privacy import DEFAULT_PRESET, PRESETS, PrivacyPolicy, parse_policy
from party_b.privacy.accounting import spent
from party_b.privacy.label_dp import auc_bound, keep_probability, run_targets
from party_b.privacy.run import RunPrivacy
from party_b.service import activations
from party_b.settings import Settings
from shared import codec
from tests.utils.live import live_server
from tests.utils.small_runs import (
    MSGPACK,
    TOKEN,
    SmallRun,
    aligned_in_process,
    aligned_run,
    labels_csv,
    problem,
    run_spec,
    small_party_b,
)

PROTECTED = PRESETS["protected"]
AT_04 = "protected,label_epsilon=0.4"  # the accounting tests' numbers, whatever the default
OPERATOR = "operator-credential-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _settings(tmp_path: Path, **fields: object) -> Settings:
    return Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"tester:{TOKEN}",
        **fields,  # type: ignore[arg-type]
    )


def _predict(run: SmallRun, positions: np.ndarray) -> bytes:
    ids = [run.aligned[p].hex() for p in positions]
    chunk = run.chunk(len(ids))
    return codec.encode_predict_request(codec.PredictRequest(ids=ids, chunks=(chunk,)))


# ------------------------------------------------------------------ the default


def test_a_party_b_given_no_switch_trains_new_runs_under_label_dp_and_replies_gradients_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: party B from settings that name no privacy policy
    settings = _settings(tmp_path)
    assert "privacy" not in settings.model_fields_set
    assert DEFAULT_PRESET == "protected" and settings.privacy_policy() == PROTECTED

    # Act: a run over HTTP, two steps, party A reads its step log back
    with caplog.at_level(logging.INFO, logger="fedlite.party_b"):
        app = create_app(settings)
    with (
        live_server(app) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        run = aligned_run(client)
        replies = []
        for step in (1, 2):
            answer = client.post(
                f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK
            )
            assert answer.status_code == 200, answer.text
            replies.append(codec.decode_step_response(answer.content))
        log = client.get(f"/v1/runs/{run.id}/steps").json()["steps"]

    # Assert: the run stored the protected policy; the replies and the log carry the
    # gradient and the sample count, no loss and no accuracy; start-up said so
    with app.state.sessions() as session:
        stored = store.run_privacy(session, run.id)
        assert stored is not None and stored.policy == PROTECTED.to_stored()
    assert all(math.isnan(r.loss) and set(r.metrics) == {"n"} for r in replies)
    assert all(r.grad.shape == (8, 8) and np.isfinite(r.grad).all() for r in replies)
    assert [(row["loss"], row["accuracy"]) for row in log] == [(None, None), (None, None)]
    assert (
        f"label privacy of new runs: {PROTECTED.describe()} (label-DP epsilon "
        f"{PROTECTED.label_epsilon:g} for the label table's lifetime; the default)" in caplog.text
    )
    assert "OFF" not in caplog.text


def test_privacy_off_is_the_operators_explicit_choice_and_logged_as_such(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="fedlite.party_b"):
        create_app(_settings(tmp_path, privacy="off"))
    off = [r for r in caplog.records if "label privacy is OFF" in r.getMessage()]
    assert len(off) == 1 and off[0].levelno == logging.WARNING
    assert "set by FEDLITE_B_PRIVACY / --privacy" in caplog.text


def test_a_label_source_without_classes_needs_an_explicit_policy(tmp_path: Path) -> None:
    from experiments.tasks import TagLabels

    tags = TagLabels(row_ids=["a", "b"], tags=np.array([[1, 0], [0, 1]], dtype=np.uint8))
    with pytest.raises(ValueError, match="choose one for this source explicitly"):
        create_app(Settings(data_dir=tmp_path / "b", tokens=f"t:{TOKEN}"), labels=tags)
    create_app(
        Settings(data_dir=tmp_path / "b", tokens=f"t:{TOKEN}", privacy="metrics=none"), labels=tags
    )


# ------------------------------------------------------------------ the mechanism


def test_the_bound_and_the_keep_probability_are_randomized_responses() -> None:
    assert keep_probability(0.4, 2) == pytest.approx(math.exp(0.4) / (1 + math.exp(0.4)))
    assert auc_bound(0.4) == pytest.approx(0.5987, abs=1e-4) and auc_bound(0.4) <= 0.6
    assert auc_bound(2.0) == pytest.approx(0.8808, abs=1e-4)
    assert keep_probability(1.0, 10) == pytest.approx(math.e / (math.e + 9))
    # the randomized label of a coin-flip label, as a score of it, has AUC e^eps/(1+e^eps),
    # for a run that draws its own labels (before label draws) as for a table's draw
    rng = np.random.default_rng(1)
    coin = torch.from_numpy(rng.integers(0, 2, 40_000))
    table = _ClassTable([f"id{i}" for i in range(40_000)], coin.numpy())
    at_04 = parse_policy(AT_04)
    own = RunPrivacy(at_04, b"k" * 32)
    drawn = RunPrivacy(at_04, b"k" * 32 + b"d" * 32)
    from sklearn.metrics import roc_auc_score

    for privacy in (own, drawn):
        noisy = run_targets(privacy, coin, np.arange(40_000), 2, table).numpy()
        assert roc_auc_score(coin.numpy(), noisy) == pytest.approx(auc_bound(0.4), abs=0.01)
        # one draw per row: the same rows in another order, the same labels
        order = rng.permutation(40_000)
        again = run_targets(privacy, coin[order], order, 2, table).numpy()
        assert np.array_equal(again, noisy[order])
    # another run's own secret draws anew; another run on the same draw does not
    noisy = run_targets(own, coin, np.arange(40_000), 2).numpy()
    other = run_targets(RunPrivacy(at_04, b"j" * 32), coin, np.arange(40_000), 2).numpy()
    assert not np.array_equal(other, noisy)
    shared = RunPrivacy(at_04, b"j" * 32 + b"d" * 32)
    assert torch.equal(
        run_targets(shared, coin, np.arange(40_000), 2, table),
        run_targets(drawn, coin, np.arange(40_000), 2, table),
    )
    # without label DP the labels are as they are
    off = RunPrivacy(PrivacyPolicy(), b"")
    assert torch.equal(run_targets(off, coin, np.arange(40_000), 2), coin)


@dataclass(frozen=True)
class _ClassTable:
    """The two things a table draw reads of a label source: its ids and its labels."""

    ids: list[str]
    labels: np.ndarray

    def targets(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.labels[rows])


def test_a_label_dp_run_evaluates_on_its_randomized_labels(tmp_path: Path) -> None:
    # Prepare: a run under the default policy, one step trained
    party_b = small_party_b(tmp_path)
    service = party_b.service(PROTECTED)
    run = aligned_in_process(service, party_b.caller)
    service.steps.step(party_b.caller, run.id, run.step_body(1))
    train, _ = run.split
    body = codec.encode_evaluate_request(
        codec.EvaluateRequest(ids_digest=codec_digest(run, train), chunks=(run.chunk(len(train)),))
    )

    # Act: party A evaluates the training split
    reply = codec.decode_evaluate_response(
        service.serving.evaluate(party_b.caller, run.id, body, "train")
    )

    # Assert: the loss is the model's on the run's randomized labels (24 rows: at eps 0.4
    # some differ from the true ones), not on the true labels
    state = service.context.cache.owned(party_b.caller, run.id)
    rows = state.label_rows[train]
    request = codec.decode_evaluate_request(body)
    z = activations.dequantize(state.plan, 0, request.chunks, rows=len(train), allow_raw=True)
    true = service.context.labels.targets(rows)
    randomized = run_targets(state.privacy, true, rows, 2, service.context.labels)
    assert not torch.equal(randomized, true)
    side = service.context.labels.side(rows) if state.trainer.model.side_features else None
    assert reply.loss == state.trainer.evaluate(z, randomized, side).loss
    assert reply.loss != state.trainer.evaluate(z, true, side).loss


def codec_digest(run: SmallRun, positions: np.ndarray) -> bytes:
    from shared.schedule import batch_digest

    return batch_digest([run.aligned[p] for p in positions])


# ------------------------------------------------------------------ accounting


def test_a_tokens_runs_on_one_label_draw_spend_its_epsilon_once_and_each_new_draw_anew(
    tmp_path: Path,
) -> None:
    # Prepare: party B under label DP at 0.4, alice's budget 1.0
    party_b = small_party_b(tmp_path)
    service = party_b.service(parse_policy(AT_04))
    with party_b.sessions() as session:
        store.set_privacy_budget(session, party_b.caller.token_id, 1.0)
        session.commit()
    spec = RunCreate.model_validate(run_spec())

    # Act: eight runs on the table's draw, one deleted; then two redraws by the operator
    runs = [service.runs.create(party_b.caller, spec) for _ in range(8)]
    service.runs.delete(party_b.caller, runs[0].id)
    with party_b.sessions() as session:
        after_eight = spent(session, party_b.caller.token_id)
        assert store.retire_draws(session) == 1
        session.commit()
    service.runs.create(party_b.caller, spec)  # a new draw: 0.8
    with party_b.sessions() as session:
        store.retire_draws(session)
        session.commit()
    with pytest.raises(ProblemError) as refused:
        service.runs.create(party_b.caller, spec)  # a third draw would make 1.2

    # Assert: eight runs spent one draw's 0.4, still after the delete; each new draw spends
    # anew; the refusal stored nothing, says why and carries the numbers; the other token
    # spent nothing
    assert (after_eight.epsilon, after_eight.runs, len(after_eight.draws)) == (0.4, 8, 1)
    assert refused.value.type == ProblemType.PRIVACY_BUDGET_EXCEEDED and refused.value.status == 403
    assert refused.value.extensions == {
        "epsilon_spent": pytest.approx(0.8),
        "epsilon_budget": 1.0,
        "epsilon_run": 0.4,
    }
    assert "have spent 0.8 and this one would spend 0.4, 1.2 in all" in refused.value.detail
    with party_b.sessions() as session:
        alice = spent(session, party_b.caller.token_id)
        assert (alice.epsilon, alice.runs, alice.unbounded) == (pytest.approx(0.8), 9, 0)
        assert len(store.runs_of(session, party_b.caller.token_id)) == 8
        assert spent(session, party_b.other.token_id).runs == 0
    # a budget of 1.2 takes the third draw exactly, and the runs after it spend nothing
    with party_b.sessions() as session:
        store.set_privacy_budget(session, party_b.caller.token_id, 1.2)
        session.commit()
    service.runs.create(party_b.caller, spec)
    service.runs.create(party_b.caller, spec)


def test_runs_without_a_bound_spend_an_unbounded_epsilon_that_no_budget_covers(
    tmp_path: Path,
) -> None:
    party_b = small_party_b(tmp_path)
    spec = RunCreate.model_validate(run_spec())
    off = party_b.service(parse_policy("off"))
    old = off.runs.create(party_b.caller, spec)  # no budget yet: allowed
    with party_b.sessions() as session:
        # a run of the release before the ledger: no ledger row (and none for its policy)
        session.execute(delete(store.PrivacyLedger).where(store.PrivacyLedger.run_id == old.id))
        session.execute(delete(store.RunPrivacy).where(store.RunPrivacy.run_id == old.id))
        store.set_privacy_budget(session, party_b.other.token_id, 5.0)
        session.commit()
        assert spent(session, party_b.caller.token_id).unbounded == 1
        assert math.isinf(spent(session, party_b.caller.token_id).total)

    # a budget refuses a run without label DP, and any run once one was unbounded
    with pytest.raises(ProblemError, match="no budget covers"):
        off.runs.create(party_b.other, spec)
    with party_b.sessions() as session:
        store.set_privacy_budget(session, party_b.caller.token_id, 5.0)
        session.commit()
    with pytest.raises(ProblemError, match="1 of its runs had no label-DP bound"):
        party_b.service(PROTECTED).runs.create(party_b.caller, spec)


def test_the_budget_is_set_from_the_command_line_refused_over_http_and_shown_by_runs_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: party B's database, and the operator's cap for the token; the commands read
    # the policy of new runs as the server does (no serve recorded one in this database)
    monkeypatch.setenv("FEDLITE_B_PRIVACY", AT_04)
    settings = _settings(tmp_path)
    app = create_app(settings)
    data = ["--data-dir", str(tmp_path / "b")]
    assert fedlite_b(["token", "budget", "--name", "tester", "--epsilon", "0.5", *data]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon_budget"] == 0.5

    # Act: two creations over HTTP (one draw), the operator's redraw, a third creation
    with (
        live_server(app) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        first = client.post("/v1/runs", json=run_spec())
        second = client.post("/v1/runs", json=run_spec())
        assert fedlite_b(["privacy", "redraw", *data]) == 1  # it asks for --yes first
        assert "give --yes" in capsys.readouterr().err
        assert fedlite_b(["privacy", "redraw", "--yes", *data]) == 0
        assert json.loads(capsys.readouterr().out) == {"retired_draws": 1}
        third = client.post("/v1/runs", json=run_spec())

    # Assert: the first two fit (0.4 of 0.5, once), the third, a new draw, is a clear problem
    assert first.status_code == second.status_code == 201, (first.text, second.text)
    body = problem(third, 403, "privacy-budget-exceeded")
    assert (body["epsilon_spent"], body["epsilon_budget"], body["epsilon_run"]) == (0.4, 0.5, 0.4)
    assert fedlite_b(["runs", "show", first.json()["id"], *data]) == 0
    shown = json.loads(capsys.readouterr().out)
    randomized = shown["privacy"].pop("randomized_labels")
    assert shown["privacy"] == {
        "policy": parse_policy(AT_04).describe(),
        "label_dp": True,
        "epsilon": 0.4,
        "attack_auc_bound": pytest.approx(auc_bound(0.4)),
        "recorded": True,
        "predict_train_ids": True,
    }
    assert randomized["drawn"] == "once per label table" and randomized["retired"] is True
    assert shown["owner_privacy"]["epsilon_spent"] == 0.4
    assert shown["owner_privacy"]["label_draws"] == 1
    assert shown["owner_privacy"]["epsilon_budget"] == 0.5
    assert fedlite_b(["privacy", "draws", *data]) == 0
    # the retired draw with its two runs; the refused run's new draw released nothing
    first_draw, second_draw = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (first_draw["epsilon"], first_draw["runs"], first_draw["table_epsilon"]) == (0.4, 2, 0.4)
    assert first_draw["retired_at"] is not None and first_draw["generation"] == 0
    assert (second_draw["runs"], second_draw["generation"], second_draw["retired_at"]) == (
        0,
        1,
        None,
    )
    # a bad cap is one line and exit code 2; --none removes the cap
    with pytest.raises(SystemExit) as bad:
        fedlite_b(["token", "budget", "--name", "tester", "--epsilon", "-1", *data])
    assert bad.value.code == 2
    assert "the budget is a finite epsilon > 0" in capsys.readouterr().err
    # --none removes the operator's cap: party B's default, two draws at the served 0.4
    assert fedlite_b(["token", "budget", "--name", "tester", "--none", *data]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["epsilon_budget"], shown["epsilon_budget_is_default"]) == (0.8, True)


# ------------------------------------------------------------------ predict


@pytest.mark.parametrize(
    ("switch", "training_ids_answered"),
    [
        ("off", False),
        ("recommended", False),
        ("protected", True),
        ("off,predict_train_ids=true", True),
    ],
)
def test_predict_answers_for_training_ids_only_where_label_dp_covers_the_model(
    tmp_path: Path, switch: str, training_ids_answered: bool
) -> None:
    with (
        live_server(create_app(_settings(tmp_path, privacy=switch))) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        run = aligned_run(client)
        train, held_out = run.split
        path = f"/v1/runs/{run.id}/predict"
        on_train = client.post(path, content=_predict(run, train[:3]), headers=MSGPACK)
        on_held_out = client.post(path, content=_predict(run, held_out[:3]), headers=MSGPACK)
        mixed_case = _predict(run, train[:1]).replace(
            run.aligned[train[0]].hex().encode(), run.aligned[train[0]].hex().upper().encode()
        )
        upper = client.post(path, content=mixed_case, headers=MSGPACK)

    assert on_held_out.status_code == 200, on_held_out.text
    if training_ids_answered:
        assert on_train.status_code == 200, on_train.text
        return
    body = problem(on_train, 403, "privacy-refused")
    assert body["training_ids"] == 3 and "training split" in body["detail"]
    problem(upper, 403, "privacy-refused")  # the same key in capitals is the same id


def test_runs_stored_before_the_new_fields_load_as_they_were(tmp_path: Path) -> None:
    # Prepare: an off run whose stored policy predates predict_train_ids, and a run with no
    # policy row at all (before policies existed)
    party_b = small_party_b(tmp_path)
    service = party_b.service(parse_policy("off"))
    old = aligned_in_process(service, party_b.caller)
    older = aligned_in_process(service, party_b.caller)
    with party_b.sessions() as session:
        row = store.run_privacy(session, old.id)
        assert row is not None
        before = {k: v for k, v in row.policy.items() if k != "predict_train_ids"}
        session.execute(
            update(store.RunPrivacy).where(store.RunPrivacy.run_id == old.id).values(policy=before)
        )
        session.execute(delete(store.RunPrivacy).where(store.RunPrivacy.run_id == older.id))
        session.commit()

    # Act: party B restarts (under the default) and party A predicts on training ids
    restarted = party_b.service(PROTECTED)
    answers = [
        restarted.serving.predict(party_b.caller, run.id, _predict(run, run.split[0][:2]))
        for run in (old, older)
    ]

    # Assert: answered, as before; and they train as off (loss and accuracy in the reply)
    assert all(codec.decode_predict_response(a).scores.shape == (2, 2) for a in answers)
    for run in (old, older):
        reply = codec.decode_step_response(
            restarted.steps.step(party_b.caller, run.id, run.step_body(1))
        )
        assert math.isfinite(reply.loss) and set(reply.metrics) == {"n", "accuracy"}
    assert PrivacyPolicy.from_stored(before) == PrivacyPolicy(predict_train_ids=True)


# ------------------------------------------------------------------ /metrics


def _train_a_little(client: httpx.Client) -> SmallRun:
    run = aligned_run(client, name="secret-run-name")
    for step in (1, 2):
        answer = client.post(
            f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK
        )
        assert answer.status_code == 200, answer.text
    answer = client.post(
        f"/v1/runs/{run.id}/evaluate", content=run.evaluate_body(), headers=MSGPACK
    )
    assert answer.status_code == 200, answer.text
    return run


def test_metrics_without_the_operators_credential_show_nothing_run_specific(tmp_path: Path) -> None:
    # Prepare: party B with the operator's credential set, a run trained and evaluated
    settings = _settings(tmp_path, dashboard_token=OPERATOR, privacy="off")
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        run = _train_a_little(client)

        # Act: /metrics with no credential, with party A's token, with the operator's
        anonymous = httpx.get(f"{url}/metrics")
        party_a = client.get("/metrics")
        operator = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {OPERATOR}"})

    # Assert: refused twice; the operator sees the run's progress but no label-derived series
    problem(anonymous, 401, "unauthorized")
    problem(party_a, 401, "unauthorized")
    assert operator.status_code == 200
    assert f'fedlite_b_run_step{{name="secret-run-name",owner="tester",run_id="{run.id}"}} 2.0' in (
        operator.text
    )
    for label_derived in ("fedlite_b_run_loss", "fedlite_b_run_accuracy", "fedlite_b_run_eval"):
        assert f"{label_derived}{{" not in operator.text
    assert "fedlite_b_requests_total" in operator.text  # the process's metrics as well


def test_metrics_of_a_party_b_without_an_operator_credential_are_the_process_only(
    tmp_path: Path,
) -> None:
    with (
        live_server(create_app(_settings(tmp_path, privacy="off"))) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        run = _train_a_little(client)
        text = httpx.get(f"{url}/metrics").text

    assert "fedlite_b_requests_total" in text and "fedlite_b_steps_total" in text
    for run_specific in (
        run.id,
        "secret-run-name",
        "tester",
        "run_id=",
        "fedlite_b_run_",
        "fedlite_b_runs{",
    ):
        assert run_specific not in text


def test_label_derived_series_are_the_operators_opt_in(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path, dashboard_token=OPERATOR, privacy="off", metrics_label_series=True
    )
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        run = _train_a_little(client)
        text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {OPERATOR}"}).text

    assert f'fedlite_b_run_loss{{name="secret-run-name",owner="tester",run_id="{run.id}"}}' in text
    assert 'fedlite_b_run_eval_metric{metric="accuracy"' in text


# ------------------------------------------------------------------ RRWithPrior


def test_rr_with_prior_is_eps_dp_for_any_prior_and_follows_a_confident_one() -> None:
    from party_b.privacy.prior import rr_with_prior

    rng = np.random.default_rng(5)
    n, epsilon = 200_000, 0.7
    draws = (rng.random(n), rng.random(n))
    for prior_row in ([0.5, 0.3, 0.15, 0.05], [0.97, 0.01, 0.01, 0.01], [0.25] * 4):
        prior = np.tile(prior_row, (n, 1))
        # each true label's output distribution, from the same draws
        outputs = [
            np.bincount(rr_with_prior(np.full(n, y), prior, draws, epsilon), minlength=4) / n
            for y in range(4)
        ]
        for a in outputs:
            for b in outputs:
                shown = (a > 0) | (b > 0)
                assert np.all(a[shown] <= math.exp(epsilon) * b[shown] * 1.05 + 1e-3)
    # a prior sure of class 0: every label comes out 0 (k = 1: nothing left to randomize)
    sure = np.tile([0.97, 0.01, 0.01, 0.01], (n, 1))
    assert set(np.unique(rr_with_prior(rng.integers(0, 4, n), sure, draws, epsilon))) == {0}


def test_rr_with_prior_runs_draw_the_same_labels_after_a_restart(tmp_path: Path) -> None:
    from party_b.privacy import prior

    party_b = small_party_b(tmp_path)
    policy = parse_policy("protected,label_epsilon=2,prior_fraction=0.3")
    service = party_b.service(policy)
    run = aligned_in_process(service, party_b.caller)
    state = service.context.cache.owned(party_b.caller, run.id)
    rows = np.arange(64)
    first = run_targets(
        state.privacy, service.context.labels.targets(rows), rows, 2, service.context.labels
    )
    answer = service.steps.step(party_b.caller, run.id, run.step_body(1))

    prior._CACHE.clear()  # a restarted party B fits the prior again
    restarted = party_b.service(PROTECTED)
    again_state = restarted.context.cache.owned(party_b.caller, run.id)
    labels = restarted.context.labels
    again = run_targets(again_state.privacy, labels.targets(rows), rows, 2, labels)
    restarted.steps.resume(party_b.caller, run.id, 0)
    assert torch.equal(first, again)
    assert restarted.steps.step(party_b.caller, run.id, run.step_body(1)) == answer
    with pytest.raises(ValueError, match="needs label_epsilon"):
        parse_policy("prior_fraction=0.3")
    with pytest.raises(ValueError, match="from 0 to below 1"):
        parse_policy("protected,prior_fraction=1")


def test_the_dashboards_run_view_shows_the_runs_epsilon_and_its_tokens_spend(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path, dashboard_token=OPERATOR, privacy=AT_04)
    operator = {"Authorization": f"Bearer {OPERATOR}"}
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        first = aligned_run(client)
        aligned_run(client)
        report = httpx.get(f"{url}/dashboard/api/runs/{first.id}", headers=operator).json()

    assert report["privacy"]["privacy"]["epsilon"] == 0.4
    assert report["privacy"]["privacy"]["policy"] == parse_policy(AT_04).describe()
    # two runs on one label draw: the token spent its epsilon once, of a default budget
    assert report["privacy"]["owner_privacy"]["epsilon_spent"] == pytest.approx(0.4)
    assert report["privacy"]["owner_privacy"]["epsilon_budget"] == pytest.approx(0.8)
