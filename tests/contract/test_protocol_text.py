"""docs/PROTOCOL.md states what the code does where a client would otherwise guess: the table
of valid ``top`` keys (section 10.7) is the model registry's, and what a PredictResponse's
``y`` holds (section 4.6) is what party B computes."""

import re
from pathlib import Path

import numpy as np
import torch

from party_b.top import TopTrainer
from shared.models import MODEL_NAMES, output_kwarg, task, top_kwargs

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"


def top_keys_table() -> str:
    """The table between the TOP KEYS markers, from the registry."""
    rows = [
        "| `model` | task | keys a client may set (default) | filled in by party B |",
        "|---|---|---|---|",
    ]
    for name in sorted(MODEL_NAMES):
        filled = [output_kwarg(name)] + (
            ["side_features"] if "side_features" in top_kwargs(name) else []
        )
        settable = {k: v for k, v in top_kwargs(name).items() if k not in filled}
        keys = ", ".join(f"`{k}` (`{v}`)".replace("'", "") for k, v in settable.items()) or "none"
        rows.append(f"| `{name}` | {task(name)} | {keys} | {', '.join(f'`{k}`' for k in filled)} |")
    return "\n".join(rows)


def test_the_valid_top_keys_in_the_text_are_the_registrys() -> None:
    text = PROTOCOL.read_text()
    found = re.search(r"<!-- BEGIN TOP KEYS -->\n(.*?)\n<!-- END TOP KEYS -->", text, re.S)
    assert found is not None
    assert found.group(1) == top_keys_table()


def test_predicted_scores_are_probabilities_with_one_column_per_class() -> None:
    """Section 4.6: softmax rows for classification, a sigmoid per tag for multilabel."""
    torch.manual_seed(0)
    z = torch.randn(5, 8)
    for model, kwargs, task_ in [
        ("tabular_mlp", {"hidden": [4], "num_classes": 3, "side_features": 0}, "classification"),
        ("so_tag", {"num_tags": 6}, "multilabel"),
    ]:
        trainer = TopTrainer(
            model=model,
            top_kwargs=kwargs,
            cut_dim=8,
            optimizer={"name": "sgd", "lr": 0.1},
            task=task_,  # type: ignore[arg-type]
            seed=0,
        )
        scores = trainer.predict(z, None).numpy()
        logits = trainer.model(z, None).detach()
        assert ((scores >= 0) & (scores <= 1)).all()
        if task_ == "classification":
            assert scores.shape == (5, 3)
            np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-6)
            np.testing.assert_allclose(scores, torch.softmax(logits, 1).numpy(), rtol=1e-6)
        else:
            np.testing.assert_allclose(scores, torch.sigmoid(logits).numpy(), rtol=1e-6)
