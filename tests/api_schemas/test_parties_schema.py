"""RunCreate with and without ``parties`` (docs/PROTOCOL.md section 12.1): a run without them
is stored and shown exactly as before the member existed, so today's clients read it."""

from typing import Any

import pytest
from pydantic import ValidationError

from api_schemas import RunCreate

# RunOut.config of a run created before parties existed: these members, no others
BEFORE = {
    "name", "model", "top", "cut_dim", "quantizer", "optimizer", "batch_size", "schedule",
    "steps", "seed", "schedule_version", "checkpoint_interval", "eval_fraction",
    "use_side_features", "grad_dtype", "downlink",
}  # fmt: skip
BASE: dict[str, Any] = {
    "name": "x",
    "model": "tabular_mlp",
    "optimizer": {"name": "sgd", "lr": 0.1},
    "batch_size": 8,
    "steps": 10,
    "seed": 1,
}


def _party(name: str, d: int, **more: Any) -> dict[str, Any]:
    return {"name": name, "cut_dim": d, "quantizer": {"mode": "pq", "q": 4, "L": 4}, **more}


def test_a_run_without_parties_is_stored_and_shown_as_before() -> None:
    spec = RunCreate.model_validate({**BASE, "cut_dim": 8, "quantizer": {"mode": "raw"}})
    stored = spec.model_dump(mode="json")
    assert set(stored) == BEFORE
    assert set(RunCreate.model_validate_json(spec.model_dump_json()).model_dump()) == BEFORE
    assert RunCreate.from_stored(stored) == spec
    assert [p.name for p in spec.feature_parties()] == ["a"]  # one feature party


def test_a_run_with_parties_fills_in_fusion_widths_and_downlinks() -> None:
    spec = RunCreate.model_validate({**BASE, "parties": [_party("telco", 8), _party("shop", 4)]})
    stored = spec.model_dump(mode="json")
    assert (stored["fusion"], stored["cut_dim"]) == ("concat", 12)
    assert "quantizer" not in stored and "downlink" not in stored
    assert [p["downlink"] for p in stored["parties"]] == ["int4", "int4"]
    assert RunCreate.from_stored(stored) == spec
    same = RunCreate.model_validate(
        {**BASE, "fusion": "mean", "parties": [_party("a", 8), _party("b", 8)]}
    )
    assert same.width == 8


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"quantizer": {"mode": "raw"}}, "give each party its own"),
        ({"downlink": "int8"}, "give each party its own"),
        ({"grad_dtype": "float16"}, "give each party its own"),
        ({"cut_dim": 5}, "not the fused width 12"),
        ({"fusion": "sum"}, "needs one cut_dim for all parties"),
        ({"parties": [_party("a", 8), _party("a", 4)]}, "party names must be unique"),
        ({"parties": [_party("A", 8)]}, "should match pattern"),
        ({"parties": [_party("a", 6)]}, "q=4 must divide cut_dim=6"),
        ({"parties": []}, "at least 1 item"),
        ({"parties": [_party(f"p{i}", 4) for i in range(17)]}, "at most 16 items"),
    ],
)
def test_a_run_with_parties_that_do_not_fit_together_is_refused(
    change: dict[str, Any], message: str
) -> None:
    given = {**BASE, "parties": [_party("telco", 8), _party("shop", 4)], **change}
    with pytest.raises(ValidationError, match=message):
        RunCreate.model_validate(given)


def test_fusion_without_parties_is_refused() -> None:
    with pytest.raises(ValidationError, match="give parties"):
        RunCreate.model_validate(
            {**BASE, "cut_dim": 8, "quantizer": {"mode": "raw"}, "fusion": "sum"}
        )
