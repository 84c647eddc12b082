"""Tests for shared.models: paper sizes, shape contracts, gradient flow, training, registry."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from shared import models
from shared.models import MODEL_NAMES, build_bottom, build_top, cut_dim, task

# Small sizes per model so the training tests run in well under a second each:
# (bottom kwargs, top kwargs).
SMALL: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "femnist_cnn": ({}, {"num_classes": 5}),
    "tabular_mlp": ({"in_features": 6, "hidden": [8], "cut_dim": 4}, {"num_classes": 3}),
    "so_tag": ({"vocab_size": 50, "cut_dim": 16}, {"num_tags": 7}),
    "next_token_lstm": (
        {"vocab_size": 30, "embed_dim": 8, "hidden": 16, "cut_dim": 8},
        {"vocab_size": 30},
    ),
}

SEQ_LEN = 5

# SGD learning rates at which 30 steps on one fixed batch cut the loss by well over 10%.
LR = {"femnist_cnn": 0.1, "tabular_mlp": 0.1, "so_tag": 1.0, "next_token_lstm": 1.0}


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def make_batch(
    name: str, bottom_kw: dict[str, Any], top_kw: dict[str, Any], b: int, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """A fixed random (x, target) batch in the format each model's parties use."""
    g = torch.Generator().manual_seed(seed)
    kw = models.bottom_kwargs(name) | bottom_kw
    tkw = models.top_kwargs(name) | top_kw
    if name == "femnist_cnn":
        return torch.rand(b, 1, 28, 28, generator=g), torch.randint(
            tkw["num_classes"], (b,), generator=g
        )
    if name == "tabular_mlp":
        return torch.randn(b, kw["in_features"], generator=g), torch.randint(
            tkw["num_classes"], (b,), generator=g
        )
    if name == "so_tag":
        x = (torch.rand(b, kw["vocab_size"], generator=g) < 0.1).float()
        return x, (torch.rand(b, tkw["num_tags"], generator=g) < 0.2).float()
    if name == "next_token_lstm":
        tokens = torch.randint(kw["vocab_size"], (b, SEQ_LEN + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:].reshape(-1)  # targets (b*t,), row-major
    raise AssertionError(name)


def loss_for(name: str, logits: Tensor, target: Tensor) -> Tensor:
    if task(name) == "multilabel":
        return nn.functional.binary_cross_entropy_with_logits(logits, target)
    return nn.functional.cross_entropy(logits, target)  # classification and sequence


def build_pair(name: str, seed: int = 0) -> tuple[nn.Module, models.TopModel]:
    bottom_kw, top_kw = SMALL[name]
    torch.manual_seed(seed)
    bottom = build_bottom(name, **bottom_kw)
    top = build_top(name, cut_dim=cut_dim(name, **bottom_kw), **top_kw)
    return bottom, top


# ---------------------------------------------------------------------------------------------
# Paper sizes
# ---------------------------------------------------------------------------------------------


def test_femnist_parameter_counts_match_paper_appendix() -> None:
    bottom = build_bottom("femnist_cnn")
    top = build_top("femnist_cnn", cut_dim=cut_dim("femnist_cnn"))

    assert cut_dim("femnist_cnn") == 9216
    assert n_params(bottom) == 18_816
    assert n_params(top) == 1_187_774


def test_next_token_top_parameter_count_matches_paper_appendix() -> None:
    top = build_top("next_token_lstm", cut_dim=cut_dim("next_token_lstm"))

    assert n_params(top) == 970_388  # Dense(96 → 10,004)


def test_next_token_bottom_trains_haikus_parameter_count() -> None:
    """hk.LSTM has one bias per gate; torch's second one is there but frozen."""
    bottom = build_bottom("next_token_lstm")

    haiku_count = 10_004 * 96 + 4 * 670 * (96 + 670 + 1) + (670 * 96 + 96)
    assert haiku_count == 3_080_360
    assert sum(p.numel() for p in bottom.parameters() if p.requires_grad) == haiku_count


def test_next_token_bottom_starts_as_haiku_lstm() -> None:
    """FedJAX's model at init: forget-gate bias +1, other biases 0, weights truncated normal
    with Haiku's stddevs (embedding 1, LSTM 1/sqrt(in + hidden), projection 1/sqrt(hidden))."""
    bottom = build_bottom("next_token_lstm", vocab_size=500, embed_dim=96, hidden=670, cut_dim=96)
    lstm = bottom.lstm
    bias = lstm.bias_ih_l0.detach()

    assert bias[670:1340].eq(1.0).all() and bias[:670].eq(0).all() and bias[1340:].eq(0).all()
    assert lstm.bias_hh_l0.eq(0).all() and not lstm.bias_hh_l0.requires_grad
    expected = {
        "embedding.weight": 1.0,
        "lstm.weight_ih_l0": (96 + 670) ** -0.5,
        "lstm.weight_hh_l0": (96 + 670) ** -0.5,
        "dense.weight": 670**-0.5,
    }
    for name, std in expected.items():
        w = dict(bottom.named_parameters())[name].detach()
        assert w.abs().max() <= 2 * std + 1e-6, name  # truncated at two stddevs
        # the truncated normal's stddev is 0.88 of the untruncated one
        assert float(w.std()) == pytest.approx(0.8796 * std, rel=0.05), name
    assert bottom.dense.bias.eq(0).all()


def test_next_token_bottom_squashes_the_lstm_output_with_tanh() -> None:
    """FedJAX's DeepRNN is [LSTM, tanh, Linear]: the cut is dense(tanh(h))."""
    bottom = build_bottom("next_token_lstm", vocab_size=50, embed_dim=8, hidden=16, cut_dim=4)
    x = torch.randint(0, 50, (3, 5))

    h, _ = bottom.lstm(bottom.embedding(x))
    expected = bottom.dense(torch.tanh(h)).reshape(-1, 4)

    assert torch.equal(bottom(x), expected)


def test_so_tag_starts_as_haiku_linear() -> None:
    bottom = build_bottom("so_tag", vocab_size=1000, cut_dim=200)
    top = build_top("so_tag", cut_dim=200, num_tags=100)

    for layer, fan_in in ((bottom.dense, 1000), (top.net[0], 200)):
        w = layer.weight.detach()
        assert layer.bias.eq(0).all()
        assert w.abs().max() <= 2 * fan_in**-0.5 + 1e-6
        assert float(w.std()) == pytest.approx(0.8796 * fan_in**-0.5, rel=0.05)


# ---------------------------------------------------------------------------------------------
# Shape contracts, gradient flow, training
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_default_sizes_give_flat_cut_and_logits(name: str) -> None:
    b = 3
    x, target = make_batch(name, {}, {}, b)
    bottom = build_bottom(name).eval()
    top = build_top(name, cut_dim=cut_dim(name)).eval()

    with torch.no_grad():
        z = bottom(x)
        logits = top(z)

    rows = b * SEQ_LEN if task(name) == "sequence" else b
    assert z.shape == (rows, cut_dim(name))
    assert logits.shape[0] == rows
    assert loss_for(name, logits, target).isfinite()


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_gradients_reach_every_trainable_parameter(name: str) -> None:
    bottom, top = build_pair(name)
    x, target = make_batch(name, *SMALL[name], b=4)

    loss_for(name, top(bottom(x)), target).backward()

    for module in (bottom, top):
        for pname, p in module.named_parameters():
            if not p.requires_grad:  # next_token_lstm's frozen second LSTM bias
                assert pname == "lstm.bias_hh_l0" and p.grad is None
                continue
            assert p.grad is not None, pname
            assert p.grad.isfinite().all(), pname
            assert p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_sgd_steps_on_a_fixed_batch_reduce_the_loss(name: str) -> None:
    bottom, top = build_pair(name)
    x, target = make_batch(name, *SMALL[name], b=8)
    params = [*bottom.parameters(), *top.parameters()]
    optimizer = torch.optim.SGD(params, lr=LR[name])

    def eval_loss() -> float:
        bottom.eval()
        top.eval()
        with torch.no_grad():
            return float(loss_for(name, top(bottom(x)), target))

    before = eval_loss()
    bottom.train()
    top.train()
    for _ in range(30):
        optimizer.zero_grad()
        loss_for(name, top(bottom(x)), target).backward()
        optimizer.step()
    after = eval_loss()

    assert after < 0.9 * before, (before, after)


def test_split_step_with_detached_cut_matches_joint_backward() -> None:
    """The two-party step (B sends ∂loss/∂z̃, A calls z.backward) equals one joint backward."""
    bottom, top = build_pair("tabular_mlp")
    bottom.eval()
    top.eval()
    x, target = make_batch("tabular_mlp", *SMALL["tabular_mlp"], b=8)
    loss_for("tabular_mlp", top(bottom(x)), target).backward()
    joint = [p.grad.clone() for p in bottom.parameters() if p.grad is not None]
    bottom.zero_grad()

    z = bottom(x)
    z_tilde = z.detach().requires_grad_()  # what party B receives
    loss_for("tabular_mlp", top(z_tilde), target).backward()
    assert z_tilde.grad is not None
    z.backward(z_tilde.grad)  # party A

    split = [p.grad for p in bottom.parameters()]
    assert len(split) == len(joint)
    for g_joint, g_split in zip(joint, split, strict=True):
        assert g_split is not None
        torch.testing.assert_close(g_split, g_joint)


def test_femnist_accepts_flat_images() -> None:
    bottom = build_bottom("femnist_cnn").eval()
    x = torch.rand(2, 1, 28, 28)

    with torch.no_grad():
        torch.testing.assert_close(bottom(x.reshape(2, 784)), bottom(x))
    with pytest.raises(ValueError, match=r"\(b, 1, 28, 28\) or \(b, 784\)"):
        bottom(torch.rand(2, 3, 28, 28))


def test_next_token_rows_are_row_major_and_causal() -> None:
    """Row i*t + j is token j of sequence i and depends only on tokens 0..j of sequence i."""
    bottom, _ = build_pair("next_token_lstm")
    bottom.eval()
    x, _ = make_batch("next_token_lstm", *SMALL["next_token_lstm"], b=2)
    changed = x.clone()
    changed[1, 2] = (changed[1, 2] + 1) % 30

    with torch.no_grad():
        z, z_changed = bottom(x), bottom(changed)

    same = (z == z_changed).all(dim=1).reshape(2, SEQ_LEN)
    assert same[0].all()  # other sequence untouched
    assert same[1, :2].all()  # earlier tokens untouched
    assert not same[1, 2:].any()  # the changed token and everything after it


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_top_rejects_z_of_wrong_width(name: str) -> None:
    _, top = build_pair(name)
    d = top.cut_dim

    with pytest.raises(ValueError, match=rf"\(n, {d}\).*\(4, {d + 1}\)"):
        top(torch.zeros(4, d + 1))


# ---------------------------------------------------------------------------------------------
# Side features
# ---------------------------------------------------------------------------------------------


def test_tabular_top_with_side_features_uses_them() -> None:
    top = build_top("tabular_mlp", cut_dim=4, side_features=10).eval()
    z = torch.randn(3, 4)
    side = torch.randn(3, 10)

    logits = top(z, side)

    assert logits.shape == (3, 2)
    assert not torch.equal(logits, top(z, torch.zeros(3, 10)))


@pytest.mark.parametrize(
    ("side", "match"),
    [
        (None, r"needs side features of shape \(n, 10\), got None"),
        (torch.zeros(3, 9), r"\(3, 10\).*got \(3, 9\)"),
        (torch.zeros(2, 10), r"\(3, 10\).*got \(2, 10\)"),
        (torch.zeros(3), r"got \(3,\)"),
    ],
)
def test_tabular_top_with_side_features_rejects_missing_or_misshaped_side(
    side: Tensor | None, match: str
) -> None:
    top = build_top("tabular_mlp", cut_dim=4, side_features=10)

    with pytest.raises(ValueError, match=match):
        top(torch.zeros(3, 4), side)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tops_without_side_features_reject_side(name: str) -> None:
    _, top = build_pair(name)

    with pytest.raises(ValueError, match=r"takes no side features.*\(4, 2\)"):
        top(torch.zeros(4, top.cut_dim), torch.zeros(4, 2))


# ---------------------------------------------------------------------------------------------
# Registry: names, kwargs, seeding
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call", [build_bottom, cut_dim, task])
def test_unknown_name_lists_valid_names(call: Any) -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet'") as err:
        call("resnet")

    for name in MODEL_NAMES:
        assert name in str(err.value)


def test_build_top_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="valid names: femnist_cnn, tabular_mlp"):
        build_top("resnet", cut_dim=8)


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("tabular_mlp", {"width": 3}, r"unknown kwargs \['width'\]; valid kwargs: categ"),
        ("femnist_cnn", {"in_features": 3}, "valid kwargs: width"),
        ("tabular_mlp", {"cut_dim": 0}, "cut_dim=0 must be an int >= 1"),
        ("tabular_mlp", {"cut_dim": True}, "cut_dim=True must be an int"),
        ("tabular_mlp", {"cut_dim": 3.0}, "cut_dim=3.0 must be an int"),
        ("tabular_mlp", {"hidden": 64}, "hidden=64 must be a list of positive ints"),
        ("tabular_mlp", {"hidden": [64, -1]}, "must be a list of positive ints"),
        ("next_token_lstm", {"vocab_size": -5}, "vocab_size=-5 must be an int >= 1"),
    ],
)
def test_bad_bottom_kwargs_raise(name: str, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_bottom(name, **kwargs)
    with pytest.raises(ValueError, match=match):
        cut_dim(name, **kwargs)


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("femnist_cnn", {"num_tags": 3}, r"unknown kwargs \['num_tags'\]; valid kwargs: num_cl"),
        ("tabular_mlp", {"side_features": -1}, "side_features=-1 must be an int >= 0"),
        ("so_tag", {"num_tags": 0}, "num_tags=0 must be an int >= 1"),
    ],
)
def test_bad_top_kwargs_raise(name: str, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_top(name, cut_dim=8, **kwargs)


def test_build_top_rejects_bad_cut_dim() -> None:
    with pytest.raises(ValueError, match="cut_dim=0 must be an int >= 1"):
        build_top("so_tag", cut_dim=0)


def test_kwargs_survive_a_json_round_trip() -> None:
    config = json.loads(json.dumps({"bottom": SMALL["tabular_mlp"][0], "top": {"hidden": [5, 6]}}))

    bottom = build_bottom("tabular_mlp", **config["bottom"])
    top = build_top(
        "tabular_mlp", cut_dim=cut_dim("tabular_mlp", **config["bottom"]), **config["top"]
    )

    assert bottom(torch.zeros(2, 6)).shape == (2, 4)
    assert top(torch.zeros(2, 4)).shape == (2, 2)
    assert models.top_kwargs("tabular_mlp")["hidden"] == [32]  # defaults are not mutated


def test_tasks() -> None:
    assert {name: task(name) for name in MODEL_NAMES} == {
        "femnist_cnn": "classification",
        "tabular_mlp": "classification",
        "so_tag": "multilabel",
        "next_token_lstm": "sequence",
    }


def flat_parameters(pair: tuple[nn.Module, nn.Module]) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for m in pair for p in m.parameters()])


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_same_seed_gives_identical_parameters(name: str) -> None:
    first = flat_parameters(build_pair(name, seed=7))
    second = flat_parameters(build_pair(name, seed=7))
    other = flat_parameters(build_pair(name, seed=8))

    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_seeded_dropout_is_reproducible_and_independent_of_global_rng() -> None:
    from shared.models import seed_dropout

    torch.manual_seed(0)
    top = build_top("femnist_cnn", cut_dim=9216).train()
    z = torch.randn(4, 9216)

    seed_dropout(top, 123)
    first = top(z)
    torch.manual_seed(999)  # another thread touching the global RNG must not matter
    seed_dropout(top, 123)
    second = top(z)
    seed_dropout(top, 124)
    third = top(z)

    torch.testing.assert_close(first, second)
    assert not torch.allclose(first, third)


def test_a_femnist_bottom_on_half_images_has_the_cut_width_of_half_images() -> None:
    """A feature party holding the left (or right) 14 columns of every image: 28 x 14 ->
    two 3x3 convolutions and a 2x2 pool -> 12 x 5 x 64 = 3840, flattened channels last."""
    assert cut_dim("femnist_cnn", width=14) == 3840 and cut_dim("femnist_cnn") == 9216
    bottom = build_bottom("femnist_cnn", width=14)
    images = torch.rand(3, 28, 28)
    assert bottom(images[:, :, :14].reshape(3, 392)).shape == (3, 3840)
    with pytest.raises(ValueError, match=r"\(b, 1, 28, 14\) or \(b, 392\)"):
        bottom(images.reshape(3, 784))
