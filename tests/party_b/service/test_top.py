"""Party B's metrics and losses per task: the definitions the paper's numbers use."""

import numpy as np
import pytest
import torch

from experiments.tasks import BOS, EOS, OOV, PAD, TagLabels, TokenLabels
from party_b.top import IGNORE, TopTrainer


def _top(name: str, task: str, **kwargs: object) -> TopTrainer:
    return TopTrainer(
        model=name,
        top_kwargs=dict(kwargs),
        cut_dim=4,
        optimizer={"name": "sgd", "lr": 0.1},
        task=task,  # type: ignore[arg-type]
        seed=0,
    )


def test_recall_at_5_is_keras_micro_recall_over_all_true_tags() -> None:
    """Keras's Recall(top_k=5): true tags among the top 5, over all true tags of all rows."""
    top = _top("so_tag", "multilabel", num_tags=8)
    logits = torch.tensor([[8.0, 7, 6, 5, 4, 3, 2, 1], [1.0, 2, 3, 4, 5, 6, 7, 8]])
    targets = torch.zeros(2, 8)
    targets[0, [0, 7]] = 1  # row 0: one of its 2 tags in its top 5
    targets[1, [3, 4, 5, 6]] = 1  # row 1: all 4 in its top 5

    metrics = top._batch_metrics(logits, targets)

    assert metrics["recall_at_5"] == pytest.approx(5 / 6)  # per-row mean would be 0.75


def test_multilabel_loss_is_mean_bce_over_tags_and_rows() -> None:
    top = _top("so_tag", "multilabel", num_tags=3)
    logits = torch.tensor([[0.0, 1.0, -1.0], [2.0, 0.0, 0.0]])
    targets = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])

    loss, n = top._loss(logits, targets)

    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, targets, reduction="none"
    )
    assert n == 2
    assert float(loss) == pytest.approx(float(expected.mean()))


def test_sequence_accuracy_leaves_out_padding_and_oov_but_loss_keeps_oov() -> None:
    top = TopTrainer(
        model="next_token_lstm",
        top_kwargs={"vocab_size": 6},
        cut_dim=4,
        optimizer={"name": "sgd", "lr": 0.1},
        task="sequence",
        seed=0,
        accuracy_excludes=(OOV,),
    )
    logits = torch.full((5, 6), -5.0)
    for row, predicted in enumerate([4, 5, OOV, 4, 2]):
        logits[row, predicted] = 5.0
    targets = torch.tensor([4, 4, OOV, IGNORE, OOV])  # right, wrong, OOV (right), pad, OOV

    metrics = top._batch_metrics(logits, targets)
    loss, n = top._loss(logits, targets)

    assert metrics["accuracy"] == pytest.approx(1 / 2)  # rows 0 and 1 only
    assert n == 4  # only padding is left out of the loss
    per_token = torch.nn.functional.cross_entropy(logits[[0, 1, 2, 4]], targets[[0, 1, 2, 4]])
    assert float(loss) == pytest.approx(float(per_token))


def test_token_labels_flatten_row_major_with_padding_ignored() -> None:
    next_tokens = np.array([[5, 6, IGNORE], [7, OOV, 8]])
    labels = TokenLabels(row_ids=["a", "b"], next_tokens=next_tokens, vocab_size=9)

    targets = labels.targets(np.array([1, 0]))

    assert targets.tolist() == [7, OOV, 8, 5, 6, IGNORE]
    assert PAD != IGNORE
    assert labels.accuracy_excludes == (EOS,)  # FedJAX's accuracy_in_vocab
    assert labels.prediction_excludes == (PAD, OOV, BOS, EOS)


def test_sequence_accuracy_in_vocab_is_fedjaxs() -> None:
    """FedJAX's accuracy_in_vocab: EOS and pad targets left out; pad / oov / bos / eos never
    predicted (logits masked), so an OOV target is always a mistake; the loss keeps OOV and
    EOS."""
    top = TopTrainer(
        model="next_token_lstm",
        top_kwargs={"vocab_size": 7},
        cut_dim=4,
        optimizer={"name": "sgd", "lr": 0.1},
        task="sequence",
        seed=0,
        accuracy_excludes=(EOS,),
        prediction_excludes=(PAD, OOV, BOS, EOS),
    )
    logits = torch.full((6, 7), -5.0)
    logits[:, 6] = 0.0  # the best in-vocabulary word of every row, unless another is higher
    for row, predicted in enumerate([4, OOV, OOV, EOS, 5, 4]):
        logits[row, predicted] = 5.0
    # right; masked OOV -> 6 (right); OOV target (wrong); EOS target (out); wrong; pad (out)
    targets = torch.tensor([4, 6, OOV, EOS, 4, IGNORE])

    metrics = top._batch_metrics(logits, targets)
    loss, n = top._loss(logits, targets)

    assert metrics["accuracy"] == pytest.approx(2 / 4)
    assert n == 5  # only padding is left out of the loss


def test_tag_labels_are_float_multi_hot() -> None:
    tags = np.array([[1, 0, 1], [0, 1, 0]], dtype=np.uint8)
    labels = TagLabels(row_ids=["a", "b"], tags=tags)

    targets = labels.targets(np.array([1]))

    assert targets.dtype == torch.float32 and targets.tolist() == [[0.0, 1.0, 0.0]]
    assert labels.num_outputs == 3 and labels.task == "multilabel"
