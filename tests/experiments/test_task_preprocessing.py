"""The experiments' preprocessing as the paper's FedJAX / TFF pipeline does it, on real data."""

from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from experiments.tasks import (
    _SO_TOKEN,
    EOS,
    IGNORE,
    OOV,
    PAD,
    TokenLabels,
    load_task,
    so_bag_of_words,
)
from party_b.labels import LabelTable
from shared.schedule import SCHEDULE_VERSION, split_train_eval
from shared.training import make_optimizer
from tests.utils.data import shared_data


def _titles(n: int) -> list[list[str]]:
    path = shared_data("stackoverflow_tags_hse", "validation.tsv.gz")
    df = pd.read_csv(path, sep="\t", keep_default_na=False, nrows=n)
    return [_SO_TOKEN.findall(t.lower()) for t in df["title"]]


def test_so_bag_is_term_frequency_with_oov_in_the_denominator() -> None:
    """TFF's tag preprocessing: mean of one-hot rows over vocabulary + OOV, OOV column
    dropped: x[i, w] = count(w in title i) / words of title i."""
    docs = _titles(300)
    x, vocab = so_bag_of_words(docs, 50)

    assert x.shape == (300, 50) and x.dtype == np.float32
    for row, doc in enumerate(docs):
        in_vocab = [w for w in doc if w in vocab]
        assert x[row].sum() == pytest.approx(len(in_vocab) / len(doc), abs=1e-6)
        for w in set(in_vocab):
            assert x[row, vocab[w]] == pytest.approx(doc.count(w) / len(doc))
    # some titles have OOV words, so their rows sum below 1; none above
    assert (x.sum(1) < 1 - 1e-6).any() and (x.sum(1) <= 1 + 1e-6).all()


def test_so_bag_counts_repeated_words_and_binary_does_not() -> None:
    docs = [*_titles(20), ["java", "java", "xyzzy-not-a-word"], []]
    x, vocab = so_bag_of_words(docs, 30)
    binary, same_vocab = so_bag_of_words(docs, 30, binary=True)

    assert same_vocab == vocab and "java" in vocab
    assert x[-2, vocab["java"]] == pytest.approx(2 / 3)
    assert binary[-2, vocab["java"]] == 1.0
    assert not x[-1].any() and not binary[-1].any()  # an empty title is all zeros
    assert set(np.unique(binary)) <= {0.0, 1.0}


def test_so_vocabulary_is_the_most_frequent_words() -> None:
    docs = _titles(500)
    _, vocab = so_bag_of_words(docs, 20)
    counts: dict[str, int] = {}
    for doc in docs:
        for w in doc:
            counts[w] = counts.get(w, 0) + 1

    least_kept = min(counts[w] for w in vocab)
    assert all(c <= least_kept for w, c in counts.items() if w not in vocab)


def _adagrad_steps(spec: dict[str, Any], grads: list[float]) -> list[float]:
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = make_optimizer([w], {"name": "adagrad", "lr": 0.3, **spec})
    out = []
    for g in grads:
        w.grad = torch.tensor([g])
        opt.step()
        out.append(float(w.detach()))
    return out


def test_fedjax_adagrad_is_optax_update() -> None:
    """optax.adagrad(initial_accumulator_value=0.1, eps=1e-6), FedJAX's defaults:
    acc += g^2; w -= lr * g / sqrt(acc + eps)."""
    grads = [0.01, -0.02, 0.5]
    got = _adagrad_steps({"initial_accumulator": 0.1, "eps": 1e-6}, grads)
    w, acc, expected = 1.0, 0.1, []
    for g in grads:
        acc += g * g
        w -= 0.3 * g / np.sqrt(acc + 1e-6)
        expected.append(w)

    assert got == pytest.approx(expected, rel=1e-6)


def test_torch_adagrad_moves_lr_times_sign_on_its_first_step() -> None:
    """torch's default (accumulator 0): the first step is lr * sign(g) whatever |g| -- the
    reason the paper's 10^-0.5 is far too large for it."""
    assert _adagrad_steps({}, [1e-4])[0] == pytest.approx(1.0 - 0.3, rel=1e-5)


def test_shakespeare_targets_shift_inputs_and_carry_what_accuracy_masks() -> None:
    """Real roles: target j is input j + 1 (padding targets ignored), and the data holds the
    EOS and OOV targets that FedJAX's accuracy_in_vocab treats specially."""
    shared_data("shakespeare_tff", "shakespeare_train.jsonl.gz")
    task = load_task("shakespeare", max_clients=3, vocab_words=100, hidden=8)
    x = task.features.x
    assert isinstance(task.labels, TokenLabels)
    y = task.labels.next_tokens

    assert (y[:, :-1][x[:, 1:] != PAD] == x[:, 1:][x[:, 1:] != PAD]).all()
    assert (y[x == PAD] == IGNORE).all()
    assert (y == EOS).any() and (y == OOV).any()
    assert task.labels.accuracy_excludes == (EOS,)
    legacy = load_task("shakespeare", max_clients=3, vocab_words=100, hidden=8, accuracy="legacy")
    assert legacy.labels.accuracy_excludes == (OOV,) and legacy.labels.prediction_excludes == ()


def test_fate_standardization_refit_on_the_runs_training_rows() -> None:
    """standardize="train": both parties' columns have mean 0 / std 1 over exactly the rows a
    run with that seed trains on (aligned = sorted common ids, split_train_eval)."""
    shared_data("fate_hetero", "breast_hetero_host.csv.gz")
    task = load_task("breast", standardize="train", split_seed=3, eval_fraction=0.2)
    whole = load_task("breast")
    aligned = sorted(set(task.features.ids) & set(task.labels.ids))
    train_pos, eval_pos = split_train_eval(
        len(aligned), seed=3, eval_fraction=0.2, version=SCHEDULE_VERSION
    )
    train = {aligned[p] for p in train_pos}
    assert isinstance(task.labels, LabelTable) and isinstance(whole.labels, LabelTable)

    for x, ids in ((task.features.x, task.features.ids), (task.labels.features, task.labels.ids)):
        rows = np.array([i in train for i in ids])
        assert len(eval_pos) > 0 and not rows.all()
        np.testing.assert_allclose(x[rows].mean(0), 0.0, atol=1e-5)
        np.testing.assert_allclose(x[rows].std(0), 1.0, atol=1e-4)
        assert np.abs(x[~rows].mean(0)).max() > 1e-3  # the held-out rows are not fitted
    # the whole-table default is the product loaders' behaviour
    np.testing.assert_allclose(whole.features.x.mean(0), 0.0, atol=1e-5)
