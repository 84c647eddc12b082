"""Party B's label-privacy policy: set by party B, kept by the run, exactly once, over HTTP.

The service is real (in process on a real SQLite file, or the real app behind uvicorn); the
defences are checked for what they promise: a run keeps the policy it was created with
across a restart under another switch, a defended step is answered with the same bytes when
resent or recomputed, the metrics policy hides what it says on the wire and in the step log,
and a wrong switch is a clear error.
"""

import math
from pathlib import Path

import httpx
import numpy as np
import pydantic
import pytest
import torch

from experiments.tasks import TagLabels
from party_b.api import create_app
from party_b.metrics import Metrics
from party_b.privacy import PRESETS, PrivacyPolicy, parse_policy
from party_b.privacy.defences import perturb_gradient, randomized_labels
from party_b.privacy.marvell import MarvellCovariance, marvell_noise, solve_marvell, sum_kl
from party_b.service import build_service
from party_b.settings import Limits, Settings
from shared import codec
from tests.utils.live import live_server
from tests.utils.small_runs import (
    MSGPACK,
    TOKEN,
    aligned_in_process,
    aligned_run,
    labels_csv,
    small_party_b,
)

DEFENDED = parse_policy("recommended,label_epsilon=1,directional=0.5")
MARVELL = parse_policy("metrics=loss,max_norm=true,marvell=2")
STEPS = 6  # checkpoints every 2 steps (small_runs.run_spec)


@pytest.mark.parametrize("policy", [DEFENDED, MARVELL], ids=["directional", "marvell"])
def test_a_defended_run_replays_and_resumes_bit_identically_under_its_own_policy(
    tmp_path: Path, policy: PrivacyPolicy
) -> None:
    # Prepare: a defended run of six steps, each step sent twice (a lost answer)
    party_b = small_party_b(tmp_path / "defended")
    service = party_b.service(policy)
    run = aligned_in_process(service, party_b.caller)
    answers = []
    for step in range(1, STEPS + 1):
        body = run.step_body(step)
        answers.append(service.steps.step(party_b.caller, run.id, body))
        assert service.steps.step(party_b.caller, run.id, body) == answers[-1]  # stored, not redone

    # Act: party B restarts with the switch now "off", and party A rolls the run back to the
    # checkpoint of step 2 and sends steps 3..6 again: party B computes them anew
    service = party_b.service(PRESETS["off"])
    service.runs.recover()
    service.steps.resume(party_b.caller, run.id, 2)
    again = [service.steps.step(party_b.caller, run.id, run.step_body(t)) for t in range(3, 7)]

    # Assert: the same bytes (the run kept its policy and its secret), and the defence is on:
    # the gradients are not an undefended run's, and the reply hides the accuracy
    assert again == answers[2:]
    plain = small_party_b(tmp_path / "plain")
    plain_service = plain.service()
    plain_run = aligned_in_process(plain_service, plain.caller)
    undefended = plain_service.steps.step(plain.caller, plain_run.id, plain_run.step_body(1))
    defended = codec.decode_step_response(answers[0])
    assert not np.array_equal(defended.grad, codec.decode_step_response(undefended).grad)
    assert set(defended.metrics) == {"n"} and math.isfinite(defended.loss)


OFF_ALL, LOSS_ONLY = {"n", "accuracy"}, {"n"}


@pytest.mark.parametrize(
    ("switch", "loss_shown", "metrics_shown"),
    [
        ("off", True, {"n", "accuracy"}),
        ("recommended", True, {"n"}),
        ("metrics=none", False, {"n"}),
    ],
)
def test_the_metrics_policy_hides_what_it_says_over_http(
    tmp_path: Path, switch: str, loss_shown: bool, metrics_shown: set[str]
) -> None:
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"t:{TOKEN}",
        privacy=switch,
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=60) as client,
    ):
        run = aligned_run(client)
        for step in (1, 2):
            answer = client.post(
                f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK
            )
            assert answer.status_code == 200, answer.text
            reply = codec.decode_step_response(answer.content)
            assert math.isfinite(reply.loss) is loss_shown
            assert set(reply.metrics) == metrics_shown and reply.metrics["n"] == 8
        log = client.get(f"/v1/runs/{run.id}/steps").json()["steps"]

    assert [row["step"] for row in log] == [1, 2]
    assert all((row["loss"] is not None) is loss_shown for row in log)
    assert all((row["accuracy"] is not None) is ("accuracy" in metrics_shown) for row in log)


@pytest.mark.parametrize(
    ("switch", "message"),
    [
        ("", "empty privacy policy"),
        ("recomended", "unknown privacy preset 'recomended'"),
        ("recommended,metrics=some", "metrics must be one of all, loss, none"),
        ("noise=-1", "noise must be a finite number >= 0"),
        ("noise=lots", "noise must be a number"),
        ("max_norm=yes", "max_norm is true or false"),
        ("label_epsilon=0", "label_epsilon must be a finite number > 0"),
        ("directions=0", "directions must be an integer from 1 to 64"),
        ("metrics=loss,recommended", "unknown privacy preset"),
        ("colour=red", "unknown privacy field 'colour'"),
    ],
)
def test_a_wrong_switch_is_a_clear_error_at_start_up(switch: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_policy(switch)
    with pytest.raises(pydantic.ValidationError, match=message):
        Settings(privacy=switch)


def test_the_switch_reads_presets_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDLITE_B_PRIVACY", "recommended,metrics=none")
    policy = Settings().privacy_policy()
    assert policy == PrivacyPolicy(**{**PRESETS["recommended"].to_stored(), "metrics": "none"})
    assert parse_policy(policy.describe()) == policy  # the description is a valid switch
    assert parse_policy("off") == PrivacyPolicy()


def test_max_norm_gives_every_row_the_batch_max_norm_in_expectation() -> None:
    rows = torch.cat([torch.full((200, 16), 0.01), torch.full((200, 16), 1.0)])  # norms 0.04, 4
    noisy = perturb_gradient(rows, PrivacyPolicy(max_norm=True), seed=1)
    norms = noisy.norm(dim=1)
    assert abs(float(norms[:200].pow(2).mean()) - 16.0) < 1.5  # E||g+n||^2 = max^2 = 16
    assert torch.equal(norms[200:], rows[200:].norm(dim=1))  # the largest rows get no noise
    assert torch.equal(noisy, perturb_gradient(rows, PrivacyPolicy(max_norm=True), seed=1))


def test_directional_noise_lies_along_the_top_principal_direction() -> None:
    direction = torch.zeros(16)
    direction[3] = 1.0
    rows = torch.randn(64, 1, generator=torch.Generator().manual_seed(0)) * direction
    noise = perturb_gradient(rows, PrivacyPolicy(directional=1.0, directions=1), seed=2) - rows
    assert float(noise[:, 3].abs().mean()) > 0.1 * float(rows.norm(dim=1).max())
    assert float(noise[:, [i for i in range(16) if i != 3]].abs().max()) < 1e-6


def test_randomized_response_flips_at_its_rate_the_same_way_every_time() -> None:
    labels = torch.zeros(20000, dtype=torch.int64)
    rows = np.arange(20000)
    once = randomized_labels(labels, rows, epsilon=1.0, num_classes=2, seed=5)
    flip_rate = float(once.float().mean())
    assert abs(flip_rate - 1 / (1 + math.e)) < 0.015  # P(flip) = 1 / (e^eps + 1)
    # the same rows in another batch order get the same labels (one draw per row and run)
    order = np.random.default_rng(0).permutation(20000)
    again = randomized_labels(labels[order], rows[order], epsilon=1.0, num_classes=2, seed=5)
    assert torch.equal(again, once[order])


def test_randomized_response_needs_class_labels(tmp_path: Path) -> None:
    party_b = small_party_b(tmp_path)
    tags = TagLabels(row_ids=["a", "b"], tags=np.array([[1, 0], [0, 1]], dtype=np.uint8))
    with pytest.raises(ValueError, match="needs class labels; this label source is a multilabel"):
        build_service(
            sessions=party_b.sessions,
            labels=tags,
            limits=Limits(),
            metrics=Metrics(),
            privacy=parse_policy("label_epsilon=1"),
        )


def test_two_runs_of_the_same_seed_get_different_noise_from_party_bs_secret(
    tmp_path: Path,
) -> None:
    # Prepare: one party B, Marvell on; two runs with the same spec (party A's seed)
    party_b = small_party_b(tmp_path)
    service = party_b.service(MARVELL)
    first = aligned_in_process(service, party_b.caller)
    second = aligned_in_process(service, party_b.caller)
    assert first.id != second.id

    # Act: the same first step in each
    a = codec.decode_step_response(service.steps.step(party_b.caller, first.id, first.step_body(1)))
    b = codec.decode_step_response(
        service.steps.step(party_b.caller, second.id, second.step_body(1))
    )

    # Assert: the same model and batch (same loss), but not the same noise: party A's seed
    # does not fix party B's draws
    assert a.loss == b.loss
    assert not np.array_equal(a.grad, b.grad)


def _two_class_batch(rows: int = 4000, d: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, d) float64 gradients of two classes: class 1 (30 %) around +e_0 with a wide
    spread, class 0 around -0.2 e_0 with a narrow one."""
    generator = torch.Generator().manual_seed(3)
    labels = (torch.rand(rows, generator=generator) < 0.3).long()
    mean = torch.zeros(rows, d, dtype=torch.float64)
    mean[:, 0] = torch.where(labels == 1, 1.0, -0.2).double()
    spread = torch.where(labels == 1, 0.3, 0.05).double()[:, None]
    return mean + spread * torch.randn(rows, d, generator=generator, dtype=torch.float64), labels


def test_marvell_solution_spends_its_budget_and_lowers_the_kl() -> None:
    u, v, d, g, p = 0.0025, 0.09, 8, 1.44, 0.3
    for budget in (0.25, 1.0, 4.0):
        cov = solve_marvell(u, v, d, g, p, budget * g)
        spent = sum(
            share * (cov.along[c] + (d - 1) * cov.across[c]) for c, share in ((0, 1 - p), (1, p))
        )
        assert spent == pytest.approx(budget * g, rel=1e-9)
        assert cov.across[1] == 0.0  # class 1 has the larger spread: no noise across it
        none = sum_kl(u, v, d, g, MarvellCovariance((0.0, 0.0), (0.0, 0.0), 0.0))
        assert cov.sum_kl < none
        # no point of the budget's boundary found by a coarse search does better
        for share in np.linspace(0.0, 1.0, 21):
            for across in np.linspace(0.0, min(v - u, budget * g / ((1 - p) * (d - 1))), 11):
                left = budget * g - (1 - p) * (d - 1) * across
                other = MarvellCovariance(
                    (share * left / (1 - p), (1 - share) * left / p), (across, 0.0), 0.0
                )
                assert cov.sum_kl <= sum_kl(u, v, d, g, other) + 1e-9
    with pytest.raises(ValueError, match="both classes"):
        solve_marvell(u, v, d, g, 1.0, g)


def test_marvell_noise_has_each_classs_optimized_covariance() -> None:
    g, labels = _two_class_batch()
    noise, cov = marvell_noise(g, labels, 2.0, torch.Generator().manual_seed(4))
    assert cov is not None
    diff = g[labels == 1].mean(dim=0) - g[labels == 0].mean(dim=0)
    unit = diff / diff.norm()
    for c in (0, 1):
        rows = noise[labels == c]
        along = rows @ unit
        across = rows - along[:, None] * unit[None, :]
        # the sample variances match the solver's covariance (within sampling error)
        assert float(along.var()) == pytest.approx(cov.along[c], rel=0.1, abs=1e-12)
        per_direction = float(across.pow(2).sum(dim=1).mean()) / (g.shape[1] - 1)
        assert per_direction == pytest.approx(cov.across[c], rel=0.1, abs=1e-12)
    # the noisy classes are much closer in distribution than the true ones
    u = float((g[labels == 0] - g[labels == 0].mean(dim=0)).pow(2).mean())
    v = float((g[labels == 1] - g[labels == 1].mean(dim=0)).pow(2).mean())
    zero_cov = MarvellCovariance((0.0, 0.0), (0.0, 0.0), 0.0)
    assert cov.sum_kl < 0.05 * sum_kl(u, v, g.shape[1], float(diff.pow(2).sum()), zero_cov)
    # a batch of one class gets no noise; the same seed gives the same noise
    zero, none = marvell_noise(g, torch.zeros_like(labels), 2.0, torch.Generator())
    assert none is None and not zero.any()
    again, _ = marvell_noise(g, labels, 2.0, torch.Generator().manual_seed(4))
    assert torch.equal(again, noise)


def test_marvell_hides_the_labels_from_the_attacks_on_a_two_class_batch() -> None:
    g, labels = _two_class_batch()
    policy = PrivacyPolicy(marvell=4.0)
    noisy = perturb_gradient(g.float(), policy, seed=9, labels=labels).double()
    y = labels.numpy()

    def auc(scores: torch.Tensor) -> float:
        from sklearn.metrics import roc_auc_score

        value = float(roc_auc_score(y, scores.numpy()))
        return max(value, 1 - value)

    unit = torch.zeros(g.shape[1], dtype=torch.float64)
    unit[0] = 1.0
    assert auc(g @ unit) > 0.99 and auc(g.norm(dim=1)) > 0.99  # readable undefended
    assert auc(noisy @ unit) < 0.75 and auc(noisy.norm(dim=1)) < 0.75
    with pytest.raises(ValueError, match="needs the batch's labels"):
        perturb_gradient(g.float(), policy, seed=9)


def test_marvell_needs_binary_class_labels(tmp_path: Path) -> None:
    party_b = small_party_b(tmp_path)
    tags = TagLabels(row_ids=["a", "b"], tags=np.array([[1, 0], [0, 1]], dtype=np.uint8))
    with pytest.raises(ValueError, match="marvell needs binary class labels"):
        build_service(
            sessions=party_b.sessions,
            labels=tags,
            limits=Limits(),
            metrics=Metrics(),
            privacy=parse_policy("marvell=1"),
        )
