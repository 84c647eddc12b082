"""Randomized labels drawn once per label table: every run on a table trains on the same ones.

Real services on real SQLite files, in process or behind uvicorn over HTTP. Under label DP
party B's runs take each id's randomized label from its label table's draw: any number of
runs, subsets, deletions, re-creations, tokens and restarts see one randomized response per
label, so a token spends the draw's epsilon once and an averaging attack over many runs
reads no more than one run does; a changed table or an operator's redraw is a new draw,
which the ledger counts and a default budget stops after two; runs stored before draws
existed draw their own labels by row, as they did.
"""

from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from sqlalchemy import delete, update

from api_schemas import ProblemType, RunCreate
from party_b import store
from party_b.api import create_app
from party_b.errors import ProblemError
from party_b.labels import LabelTable, load_label_table
from party_b.metrics import Metrics
from party_b.privacy import PRESETS, PrivacyPolicy, parse_policy
from party_b.privacy.accounting import spent
from party_b.privacy.defences import randomized_labels
from party_b.privacy.label_dp import auc_bound, run_targets
from party_b.privacy.run import RunPrivacy
from party_b.service import Caller, Service, build_service
from party_b.settings import Limits, Settings
from shared import codec
from shared.alignment import hmac_ids
from tests.utils.live import live_server
from tests.utils.small_runs import (
    OTHER,
    TOKEN,
    SmallPartyB,
    SmallRun,
    aligned_in_process,
    aligned_run,
    labels_csv,
    run_spec,
    small_party_b,
)

DEFAULT = PRESETS["protected"]


def _randomized(service: Service, run_id: str) -> np.ndarray:
    """The randomized label of every row of party B's table, as the run's stored privacy
    draws it (what its steps and evaluations train and score on)."""
    with service.context.sessions() as session:
        row = store.run_privacy(session, run_id)
        assert row is not None
        privacy = RunPrivacy(PrivacyPolicy.from_stored(row.policy), row.secret)
    labels = service.context.labels
    rows = np.arange(len(labels.ids))
    out: np.ndarray = run_targets(
        privacy, labels.targets(rows), rows, labels.num_outputs, labels
    ).numpy()
    return out


def _by_id(service: Service, run_id: str) -> dict[str, int]:
    return dict(zip(service.context.labels.ids, _randomized(service, run_id).tolist(), strict=True))


def _spend(service: Service, token_id: int) -> float:
    with service.context.sessions() as session:
        return spent(session, token_id).epsilon


# ------------------------------------------------------------------ one draw per table


def test_eight_runs_of_a_token_over_the_same_ids_train_on_one_draw_and_spend_it_once(
    tmp_path: Path,
) -> None:
    # Prepare: party B started with no privacy flag (the default), two tokens
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"tester:{TOKEN},other:{OTHER}",
    )
    app = create_app(settings)
    service: Service = app.state.service
    with service.context.sessions() as session:
        tester, other = (store.token_named(session, n) for n in ("tester", "other"))
        assert tester is not None and other is not None

    # Act: eight runs of one token over HTTP: on the even ids, on a subset of them, one
    # deleted and made again; a run of another token
    runs, spends = [], []
    with (
        live_server(app) as url,
        httpx.Client(base_url=url, headers=_bearer(TOKEN), timeout=60) as client,
        httpx.Client(base_url=url, headers=_bearer(OTHER), timeout=60) as others,
    ):
        for i in range(8):
            subset = [f"u{j:03d}" for j in range(0, 40, 2)]  # twenty of the even ids
            if i == 3:  # a subset of the ids: the same draw
                run = aligned_run(client, subset)
                assert len(run.aligned) == len(subset)
            else:
                run = aligned_run(client, seed=i)
            runs.append(run.id)
            spends.append(_spend(service, tester.id))
        assert client.delete(f"/v1/runs/{runs[0]}").status_code == 204
        again = aligned_run(client, seed=0)
        theirs = aligned_run(others)
    restarted: Service = create_app(settings).state.service  # a restart, on the same database
    late = aligned_in_process(restarted, Caller(token_id=tester.id, name="tester"))

    # Assert: the token's ledger stays where the first run left it (one draw, the default's
    # epsilon); every run, whatever its subset, token or process, has the same randomized
    # label for an id (the subset's ids among them), and it is not the true one everywhere
    epsilon = DEFAULT.label_epsilon
    assert spends == [epsilon] * 8 and _spend(service, tester.id) == epsilon
    assert _spend(service, other.id) == epsilon
    first = _by_id(service, runs[1])
    for run_id in [*runs[1:], again.id, theirs.id]:
        assert _by_id(service, run_id) == first
    assert _by_id(restarted, late.id) == first
    truth = service.context.labels.targets(np.arange(64)).numpy()
    assert 0 < int((np.array(list(first.values())) != truth).sum()) < 32
    with service.context.sessions() as session:
        assert len(store.draws(session)) == 1 and store.runs_per_draw(session) == {1: 11}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_same_table_in_another_order_is_the_same_draw_and_a_changed_one_a_new_draw(
    tmp_path: Path,
) -> None:
    # Prepare: party B's table, the same rows shuffled, and the table with one label changed
    party_b = small_party_b(tmp_path)
    table = party_b.labels
    assert isinstance(table, LabelTable)
    order = np.random.default_rng(7).permutation(len(table.ids))
    shuffled = replace(
        table,
        row_ids=[table.row_ids[i] for i in order],
        labels=table.labels[order],
        features=table.features[order],
    )
    changed_labels = table.labels.copy()
    changed_labels[5] = 1 - changed_labels[5]
    changed = replace(table, labels=changed_labels)

    # Act: a run on each, one token
    runs = {}
    for name, labels in (("table", table), ("shuffled", shuffled), ("changed", changed)):
        service = _service(party_b, labels)
        run = aligned_in_process(service, party_b.caller)
        runs[name] = (service, run.id)
        if name == "shuffled":
            shuffled_spend = _spend(service, party_b.caller.token_id)

    # Assert: the shuffled table is the same table: same labels by id, nothing more spent;
    # the changed table is a new draw (independent coins: a copy of the old ones would show
    # party A which label changed), and the token has spent two draws
    epsilon = DEFAULT.label_epsilon
    assert epsilon is not None
    assert _by_id(*runs["shuffled"]) == _by_id(*runs["table"])
    assert shuffled_spend == epsilon
    assert _spend(runs["changed"][0], party_b.caller.token_id) == 2 * epsilon
    old, new = _by_id(*runs["table"]), _by_id(*runs["changed"])
    truth = dict(zip(table.ids, table.labels.tolist(), strict=True))
    kept_old = [old[i] == truth[i] for i in table.ids]
    kept_new = [new[i] == truth[i] for i in table.ids if i != table.ids[5]]
    assert kept_old[:5] + kept_old[6:] != kept_new  # other flips: new coins


def _service(party_b: SmallPartyB, labels: LabelTable, **limits: float) -> Service:
    return build_service(
        sessions=party_b.sessions,
        labels=labels,
        limits=Limits(**limits),  # type: ignore[arg-type]
        metrics=Metrics(),
        privacy=DEFAULT,
    )


def test_redraws_are_counted_and_the_default_budget_stops_the_third_draw(tmp_path: Path) -> None:
    # Prepare: party B under the default, a token's first run
    party_b = small_party_b(tmp_path)
    service = party_b.service(DEFAULT)
    spec = RunCreate.model_validate(run_spec())
    first = service.runs.create(party_b.caller, spec)

    # Act: the operator redraws twice, the token creates a run after each; then party B is
    # told no default budget; a party B serving without label DP
    outcomes: list[str | ProblemError] = []
    for _ in range(2):
        with party_b.sessions() as session:
            store.retire_draws(session)
            session.commit()
        try:
            outcomes.append(service.runs.create(party_b.caller, spec).id)
        except ProblemError as exc:
            outcomes.append(exc)
    unlimited = _service(party_b, party_b.labels, epsilon_budget=0)
    third = unlimited.runs.create(party_b.caller, spec)
    off = party_b.service(parse_policy("off")).runs.create(party_b.caller, spec)

    # Assert: the second draw fits the default budget (two draws), the third is refused
    # with the numbers and the way out; without a default it passes; a run without label
    # DP is the operator's choice, which the default budget does not refuse
    epsilon = DEFAULT.label_epsilon
    assert epsilon is not None
    assert isinstance(outcomes[0], str)
    refused = outcomes[1]
    assert isinstance(refused, ProblemError)
    assert refused.type == ProblemType.PRIVACY_BUDGET_EXCEEDED
    assert refused.extensions == {
        "epsilon_spent": 2 * epsilon,
        "epsilon_budget": 2 * epsilon,
        "epsilon_run": epsilon,
    }
    assert "FEDLITE_B_LIMIT_EPSILON_BUDGET" in refused.detail
    assert "fedlite-b token budget" in refused.detail
    with party_b.sessions() as session:
        mine = spent(session, party_b.caller.token_id)
        assert (mine.epsilon, len(mine.draws), mine.unbounded) == (3 * epsilon, 3, 1)
        assert {first.id, outcomes[0], third.id, off.id} <= {
            r.id for r in store.runs_of(session, party_b.caller.token_id)
        }


# ------------------------------------------------------------------ runs from before


def test_a_run_stored_before_label_draws_draws_its_own_labels_by_row_as_before(
    tmp_path: Path,
) -> None:
    # Prepare: a run whose stored privacy is what the release before draws stored: the
    # protected policy of then (no forward_loss field), its own 32-byte secret, no draw
    party_b = small_party_b(tmp_path)
    service = party_b.service(DEFAULT)
    run = aligned_in_process(service, party_b.caller)
    before = {k: v for k, v in DEFAULT.to_stored().items() if k != "forward_loss"}
    before["label_epsilon"] = 0.4
    own = bytes(range(32))
    with party_b.sessions() as session:
        session.execute(
            update(store.RunPrivacy)
            .where(store.RunPrivacy.run_id == run.id)
            .values(policy=before, secret=own)
        )
        session.execute(delete(store.RunLabelDraw).where(store.RunLabelDraw.run_id == run.id))
        session.commit()

    # Act: party B restarts and trains a step, twice across a restart
    restarted = party_b.service(DEFAULT)
    answer = restarted.steps.step(party_b.caller, run.id, run.step_body(1))
    again = party_b.service(DEFAULT)
    again.steps.resume(party_b.caller, run.id, 0)
    replayed = again.steps.step(party_b.caller, run.id, run.step_body(1))

    # Assert: its labels are randomized response by row from its own secret, the formula of
    # the release before (not the table's draw), its loss the plain one, its step the same
    # bytes after a restart; and its ledger row counts on its own
    labels = restarted.context.labels
    rows = np.arange(64)
    old = RunPrivacy(PrivacyPolicy.from_stored(before), own)
    expected = randomized_labels(
        labels.targets(rows), rows, epsilon=0.4, num_classes=2, seed=old.seed(0, "label-dp")
    )
    assert torch.equal(torch.from_numpy(_randomized(restarted, run.id)), expected)
    assert old.label_key is None and old.policy.forward_loss is False
    assert replayed == answer
    with party_b.sessions() as session:
        mine = spent(session, party_b.caller.token_id)
        assert (mine.epsilon, len(mine.draws)) == (DEFAULT.label_epsilon, 0)


# ------------------------------------------------------------------ the averaging attack


ROWS, RUNS, STEPS, BATCH = 600, 40, 6, 100


def test_an_averaging_attack_over_forty_runs_reads_no_more_than_one_run_does(
    tmp_path: Path,
) -> None:
    """The attack of the outside audit: each run's gradients read by the top singular
    direction (the best label-free attack on one step, with the oracle's sign: an upper
    bound), a row's score averaged over its visits, then the runs' guesses majority-voted.
    With one draw per table it converges on the randomized labels, which a single run reads
    as well; with a new draw before every run (what per-run secrets did, and what a redraw
    before every run still does: the ledger counts 40 draws), it reads the true labels."""
    party_b = small_party_b(tmp_path)
    labels = load_label_table(
        labels_csv(tmp_path / "many.csv", n=ROWS), id_column="id", label_column="y",
        feature_columns=None,
    )  # fmt: skip
    service = _service(party_b, labels, epsilon_budget=0)  # type: ignore[arg-type]
    ids = [f"u{i:03d}" for i in range(ROWS)]
    truth = labels.labels

    one_draw = [_attacked_run(service, party_b.caller, ids, seed=i) for i in range(RUNS)]
    redrawn = []
    for i in range(RUNS):
        with party_b.sessions() as session:
            store.retire_draws(session)
            session.commit()
        redrawn.append(_attacked_run(service, party_b.caller, ids, seed=i))

    bound = auc_bound(DEFAULT.label_epsilon or 0.0)
    single = _auc(truth, [one_draw[0]])
    voted = _auc(truth, one_draw)  # measured: 0.883 for one run, 0.891 for forty
    assert single > 0.75  # the attack reads one run's randomized labels
    assert voted <= max(single, bound) + 0.02  # forty runs read no more than one
    assert _auc(truth, redrawn) > 0.97  # forty independent draws give the labels away
    with party_b.sessions() as session:
        assert len(spent(session, party_b.caller.token_id).draws) == RUNS + 1


def _attacked_run(service: Service, caller: Caller, ids: list[str], *, seed: int) -> np.ndarray:
    """One run over every id, STEPS steps of random activations; the attack's guess (+1,
    -1, 0 unseen) for each label row, signed by the oracle."""
    spec = run_spec(batch_size=BATCH, seed=seed, eval_fraction=0.1, downlink="float32")
    out = service.runs.create(caller, RunCreate.model_validate(spec))
    key = bytes.fromhex(out.alignment_key)
    answer = service.alignment.align(caller, out.id, [k.hex() for k in hmac_ids(key, ids)])
    run = SmallRun(out.id, key, [bytes.fromhex(h) for h in answer.intersection], spec)
    state = service.context.cache.owned(caller, run.id)
    sums, visits = np.zeros(ROWS), np.zeros(ROWS)
    for step in range(1, STEPS + 1):
        grad = codec.decode_step_response(
            service.steps.step(caller, run.id, run.step_body(step))
        ).grad.astype(np.float64)
        rows = state.label_rows[state.batch(step).positions]
        _, _, vt = np.linalg.svd(grad, full_matrices=False)
        projection = grad @ vt[0]
        truth = service.context.labels.targets(rows).numpy()
        # the oracle's sign, per step: an attacker's upper bound
        if roc_auc_score(truth, projection) < 0.5:
            projection = -projection
        sums[rows] += projection / max(float(np.std(projection)), 1e-12)
        visits[rows] += 1
    service.runs.delete(caller, run.id)  # (a token's unfinished runs are limited; spent stays)
    guess: np.ndarray = np.sign(sums) * (visits > 0)
    return guess


def _auc(truth: np.ndarray, guesses: list[np.ndarray]) -> float:
    """AUC against the true labels of the runs' summed guesses, over the rows seen."""
    votes = np.sum(guesses, axis=0)
    seen = np.any(np.stack(guesses) != 0, axis=0)
    return float(roc_auc_score(truth[seen], votes[seen]))
