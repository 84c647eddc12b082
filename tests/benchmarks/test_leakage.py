"""The label-leakage benchmark: its attacks work on real training, the recommended defence
works against them, and docs/PRIVACY.md shows what benchmarks/results/leakage.json holds.

The runs are the product's own (party A's trainer, party B's service in process with the
policy under test); the attacks read the gradients party A decoded from the replies' bytes.
Short breast runs keep this to about a minute of CPU.
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks.leakage import report
from benchmarks.leakage.attacks import ATTACKS, chance_auc, leak_auc
from benchmarks.leakage.grid import BASE, aggregate, grid, records_of
from benchmarks.leakage.runs import train_recorded
from party_b.privacy import PRESETS

SHORT = replace(BASE["breast"], steps=30)


def _best(records: list[dict[str, object]]) -> float:
    (best,) = [r["leak_auc"] for r in records if r["attack"] == "best"]
    assert isinstance(best, float)
    return best


def test_the_attacks_read_the_labels_of_an_undefended_run_and_the_recommended_setting_hides_them(
    tmp_path: Path,
) -> None:
    # Act: the same short breast run, undefended and under the recommended policy
    off = train_recorded(SHORT, tmp_path)
    defended = train_recorded(replace(SHORT, privacy="recommended"), tmp_path)

    # Assert: party A reads the labels off the undefended gradients (near-perfect AUC, far
    # above what the free sign flip gives), and much less off the defended ones
    off_records = records_of(SHORT, off, off.model_auc)
    defended_records = records_of(replace(SHORT, privacy="recommended"), defended, off.model_auc)
    chance = chance_auc(off.labels)
    assert _best(off_records) > 0.95 > chance + 0.3
    assert _best(defended_records) < _best(off_records) - 0.15
    # and the recommended replies carry the loss but no accuracy, undefended ones both
    assert {k for m in off.metrics for k in m} == {"n", "accuracy"}
    assert {k for m in defended.metrics for k in m} == {"n"}
    assert all(np.isfinite(loss) for loss in defended.losses)
    assert len(off.grads) == len(defended.grads) == SHORT.steps


def test_each_attack_separates_labelled_gradients_up_to_a_sign_per_batch() -> None:
    rng = np.random.default_rng(0)
    direction = rng.standard_normal(16)
    grads, labels = [], []
    for batch in range(6):
        y = (rng.random(64) < 0.3).astype(np.int64)
        size = np.where(y == 1, 0.8, 0.2) * (1 if batch % 2 else -1)  # sign flips by batch
        jitter = 0.05 * rng.standard_normal((64, 16))
        grads.append(
            ((size * np.where(y == 1, -1, 1))[:, None] * direction + jitter).astype(np.float32)
        )
        labels.append(y)
    for name, attack in ATTACKS.items():
        assert leak_auc([attack(g) for g in grads], labels) > 0.95, name
    with pytest.raises(ValueError, match="no batch holds both classes"):
        leak_auc([np.zeros(3)], [np.zeros(3, dtype=np.int64)])


def test_privacy_doc_shows_what_leakage_json_holds() -> None:
    text = report.DOC.read_text()
    section = text[text.index(report.BEGIN) + len(report.BEGIN) : text.index(report.END)]
    assert section.strip() == report.render(report.load()).strip(), (
        "docs/PRIVACY.md is stale: run python -m benchmarks.leakage.report"
    )


def test_records_over_seeds_pair_each_seed_with_its_own_undefended_run() -> None:
    def run(defence: str, seed: int, model: float, undefended: float, leak: float) -> dict:
        return {
            "task": "t", "downlink": "float32", "defence": defence, "attack": "best",
            "policy": defence, "seed": seed, "leak_auc": leak, "model_auc": model,
            "model_auc_undefended": undefended, "chance_auc": 0.5,
            "downlink_bytes_per_step": 1.0, "reply_loss_visible": True, "reply_metrics": [],
            "auc_curve": [[10, model]], "settings": {"steps": 10},
        }  # fmt: skip

    runs = [
        run("off", 0, 0.78, 0.78, 1.0),
        run("off", 1, 0.76, 0.76, 1.0),
        run("marvell=4", 1, 0.75, 0.76, 0.62),
        run("marvell=4", 0, 0.775, 0.78, 0.58),
    ]
    (off, marvell) = aggregate(runs)
    assert off["defence"] == "off" and off["auc_cost"] == 0.0
    assert marvell["seeds"] == [0, 1]  # sorted by seed
    assert marvell["model_auc_seeds"] == [0.775, 0.75]
    assert marvell["auc_cost"] == pytest.approx(0.0075)  # mean of 0.005 and 0.01
    assert marvell["auc_cost_sd"] == pytest.approx(np.std([0.005, 0.01], ddof=1))
    assert marvell["leak_auc"] == pytest.approx(0.6)
    assert marvell["leak_auc_sd"] == pytest.approx(np.std([0.58, 0.62], ddof=1))


def test_the_recommended_runs_of_leakage_json_ran_todays_recommended_preset() -> None:
    recommended = [r for r in report.load()["records"] if r["defence"] == "recommended"]
    assert recommended, "leakage.json has no run of the recommended setting"
    assert {r["policy"] for r in recommended} == {PRESETS["recommended"].describe()}, (
        "the recommended preset changed since leakage.json was measured: re-run "
        "python -m benchmarks.leakage --only recommended --merge"
    )


def test_only_picks_runs_and_keeps_their_undefended_references() -> None:
    picked = grid("default_credit", 1, smoke=False, only="marvell=4$")
    assert [(r.downlink, r.privacy, r.seed) for r in picked] == [
        ("float32", "off", 1),
        ("float32", "marvell=4", 1),
    ]
    assert picked[0].eval_every > 0 and picked[1].eval_every == 0  # off records its curve
    compressed = grid("breast", 0, smoke=False, only="int2")
    assert [(r.downlink, r.privacy) for r in compressed] == [("int2", "off")]
    assert grid("breast", 1, smoke=False, only="int2") == []  # one seed only
