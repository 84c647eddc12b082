"""The label-leakage benchmark: its attacks work on real training and on known gradients, the
default policy bounds them, and docs/PRIVACY.md shows what benchmarks/results/leakage.json.gz
holds.

The runs are the product's own (party A's trainer, party B's service in process with the
policy under test); the attacks read what party A decoded from the replies' bytes. Short
breast runs keep this to about a minute of CPU.
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks.leakage import report
from benchmarks.leakage.attacks import attack_run, roc_auc_score
from benchmarks.leakage.grid import BASE, DEFAULT, aggregate, grid, records_of
from benchmarks.leakage.runs import Recorded, train_recorded
from party_b.privacy import DEFAULT_PRESET, PRESETS

SHORT = replace(BASE["breast"], steps=30)


def _by_attack(records: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {str(r["attack"]): r for r in records}


def test_the_attacks_read_an_undefended_run_and_the_default_policy_shows_party_a_less(
    tmp_path: Path,
) -> None:
    # Act: the same short breast run undefended and under the default, honest and active
    off = train_recorded(SHORT, tmp_path)
    default = replace(SHORT, privacy=DEFAULT)
    protected = train_recorded(default, tmp_path)
    probing = train_recorded(replace(default, active=True), tmp_path)

    # Assert: party A reads the labels off the undefended gradients, canaries included;
    # under label DP no more than the randomized labels themselves tell of the true ones
    # (their AUC against them, about the bound); the default's replies carry the gradient
    # and n only
    off_best = _by_attack(records_of(SHORT, off, None, off.model_auc))["best"]
    best = _by_attack(records_of(default, protected, probing, off.model_auc))
    assert off_best["leak_auc"] > 0.95 and off_best["canary_auc"] > 0.95  # type: ignore[operator]
    train = protected.train_positions
    drawn = roc_auc_score(protected.labels[train], protected.randomized[train])
    # (the attacks that read the label through the gradient; smoothed ones also read what
    # breast's features predict of any row, labels aside: docs/PRIVACY.md, section 3)
    for name in ("direction", "chained", "active:probe"):
        assert best[name]["leak_auc"] < min(drawn + 0.05, 0.95), (name, best[name], drawn)
    epsilon = PRESETS[DEFAULT_PRESET].label_epsilon
    assert best["best"]["default"] is True and best["best"]["epsilon"] == epsilon
    # the honest and the active run trained on one draw: the same randomized labels
    assert np.array_equal(protected.randomized, probing.randomized)
    assert "active:probe" in best and "loss" not in best  # no loss to pool
    assert {k for m in protected.metrics for k in m} == {"n"}
    assert all(np.isnan(loss) for loss in protected.losses)
    assert sum(probing.probe) == SHORT.steps // 2 and not any(protected.probe)
    # the active probe reads the labels party B trained on, the randomized ones, exactly:
    # it is stopped by the randomization, not by any weakness of its own
    from benchmarks.leakage.attacks import _chained, _Run

    run = _Run(probing)
    probed = _chained(run, [i for i, p in enumerate(probing.probe) if p])
    seen = np.isfinite(probed)
    agreement = roc_auc_score(probing.randomized[seen], probed[seen])
    assert max(agreement, 1 - agreement) > 0.99
    assert not np.array_equal(probing.randomized, probing.labels)
    # predict scores the training rows under label DP, and needs held-out ids without it
    assert (protected.predict_ids, off.predict_ids) == ("train", "eval")
    assert protected.canary.sum() == off.canary.sum() > 0  # the same canaries, by seed
    assert len(off.grads) == len(protected.grads) == len(protected.positions) == SHORT.steps


def _synthetic(seed: int = 0, steps: int = 40, rows: int = 200) -> Recorded:
    """A run whose gradients are (label-dependent size and sign) * a slowly turning
    direction, plus noise (the sign of each batch's singular vector is the SVD's choice)."""
    rng = np.random.default_rng(seed)
    labels = (rng.random(rows) < 0.3).astype(np.int64)
    canary = rng.random(rows) < 0.2
    train = np.arange(rows)
    recorded = Recorded(train_positions=train, labels=labels, canary=canary)
    recorded.features = rng.standard_normal((rows, 4)).astype(np.float32)
    recorded.predict_scores = labels + 0.8 * rng.standard_normal(rows)  # a useful model
    direction = rng.standard_normal(16)
    for t in range(steps):
        batch = rng.choice(rows, 32, replace=False)
        turned = direction + 0.1 * t * np.eye(16)[t % 16]
        sign = np.where(labels[batch] == 1, -0.7, 0.3)[:, None]
        grad = sign * turned + 0.05 * rng.standard_normal((32, 16))
        recorded.grads.append(grad.astype(np.float32))
        recorded.positions.append(batch)
        recorded.losses.append(float(np.mean(labels[batch])))
    return recorded


def test_each_attack_reads_labelled_gradients_with_both_sign_rules() -> None:
    results = {r.attack: r for r in attack_run(_synthetic())}
    for name in ("direction", "principal", "chained", "norm"):
        assert results[name].leak_auc["oracle"] > 0.95, name
        assert results[name].leak_auc["predict"] > 0.95, name  # predict's sign is right
        assert results[name].canary_auc["oracle"] > 0.9, name
    assert results["loss"].leak_auc["oracle"] > 0.6  # batches with more positives lose more
    assert results["direction"].batch_auc is not None and results["chained"].batch_auc is None


def test_the_rank_auc_is_sklearns() -> None:
    from sklearn.metrics import roc_auc_score as sklearn_auc

    rng = np.random.default_rng(3)
    for _ in range(50):
        y = rng.integers(0, 2, 40)
        s = np.round(rng.standard_normal(40), 1)  # with ties
        if 0 < y.sum() < 40:
            assert roc_auc_score(y, s) == pytest.approx(sklearn_auc(y, s), abs=1e-12)


def test_privacy_doc_shows_what_leakage_json_holds() -> None:
    text = report.DOC.read_text()
    section = text[text.index(report.BEGIN) + len(report.BEGIN) : text.index(report.END)]
    assert section.strip() == report.render(report.load()).strip(), (
        "docs/PRIVACY.md is stale: run python -m benchmarks.leakage.report"
    )


def _run(
    defence: str, seed: int, attack: str, model: float, undefended: float, leak: float
) -> dict:
    return {
        "task": "t", "downlink": "float32", "defence": defence, "attack": attack,
        "policy": defence, "default": False, "epsilon": None, "auc_bound": None, "seed": seed,
        "leak_auc": leak, "leak_auc_signed": leak, "canary_auc": leak,
        "canary_auc_signed": leak, "batch_auc": None, "model_auc": model,
        "model_auc_undefended": undefended, "predict_auc": 0.7, "predict_canary_auc": 0.5,
        "predict_ids": "eval", "chance_auc": 0.5, "chance_canary_auc": 0.5, "rows": 10,
        "canaries": 2, "reply_loss_visible": True, "reply_metrics": ["n"],
        "auc_curve": [[10, model]], "settings": {"steps": 10},
    }  # fmt: skip


def test_records_over_seeds_pair_seeds_and_pick_the_attack_best_on_average() -> None:
    runs = [
        _run("off", 0, "norm", 0.78, 0.78, 1.0),
        _run("off", 1, "norm", 0.76, 0.76, 1.0),
        # two attacks: "a" is best on seed 0 only, "b" is best on average
        _run("marvell", 1, "a", 0.75, 0.76, 0.55),
        _run("marvell", 0, "a", 0.775, 0.78, 0.70),
        _run("marvell", 0, "b", 0.775, 0.78, 0.66),
        _run("marvell", 1, "b", 0.75, 0.76, 0.64),
    ]
    records = {(r["defence"], r["attack"]): r for r in aggregate(runs)}
    a, best = records[("marvell", "a")], records[("marvell", "best")]
    assert a["seeds"] == [0, 1] and a["model_auc_seeds"] == [0.775, 0.75]  # sorted by seed
    assert a["auc_cost"] == pytest.approx(0.0075)  # mean of 0.005 and 0.01
    assert a["auc_cost_sd"] == pytest.approx(np.std([0.005, 0.01], ddof=1))
    assert a["leak_auc"] == pytest.approx(0.625)
    assert best["leak_auc_by"] == "b" and best["leak_auc"] == pytest.approx(0.65)
    assert best["leak_auc_seeds"] == [0.66, 0.64]
    assert best["batch_auc"] is None and records[("off", "best")]["auc_cost"] == 0.0


def test_the_default_records_of_leakage_json_ran_todays_default_preset() -> None:
    records = report.load()["records"]
    default = [r for r in records if r["default"]]
    assert default, "leakage.json.gz has no run of the default policy"
    assert {r["defence"] for r in default} == {DEFAULT_PRESET}
    assert {r["policy"] for r in default} == {PRESETS[DEFAULT_PRESET].describe()}, (
        "the default preset changed since leakage.json.gz was measured: re-run "
        "python -m benchmarks.leakage --only 'protected$' --merge"
    )
    assert all(len(r["seeds"]) >= 5 for r in records)


def test_only_picks_runs_and_keeps_their_undefended_reference() -> None:
    picked = grid("default_credit", 1, smoke=False, only="recommended$")
    assert [(r.privacy, r.seed) for r in picked] == [("off", 1), ("recommended", 1)]
    assert picked[0].eval_every > 0 and picked[1].eval_every == 0  # off records its curve
    assert grid("breast", 0, smoke=False, only="nothing") == []


def test_the_multi_run_attack_reads_no_more_than_one_run_on_a_label_draw() -> None:
    """leakage.json.gz's multi-run records (benchmarks.leakage.multirun): one token's runs on
    one label draw, voted, read no more than one of them; a draw per run gives the labels
    away (what per-run secrets did before label draws)."""
    records = report.load()["multirun"]["records"]
    for task, runs in (("breast", 40), ("default_credit", 8)):
        by = {
            draws: {r["runs"]: r["leak_auc"] for r in records if r["default"]
                    and (r["task"], r["draws"]) == (task, draws)}
            for draws in ("table", "run")
        }  # fmt: skip
        assert max(by["table"]) == max(by["run"]) == runs, (task, by)
        assert by["table"][runs] <= by["table"][1] + 0.01, (task, by)
        assert by["run"][runs] > by["run"][1] + 0.1, (task, by)
