"""The JSON API is strictly typed: ``"10"``, ``true`` and ``10.0`` are not the integer 10."""

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from api_schemas import AlignmentIn, ResumeIn, RunCreate
from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.live import live_server
from tests.utils.small_runs import MSGPACK, TOKEN, aligned_run, labels_csv, problem, run_spec


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch_size", "8"),
        ("batch_size", True),
        ("batch_size", 8.0),
        ("steps", "100"),
        ("seed", False),
        ("use_side_features", 1),
        ("use_side_features", "true"),
        ("eval_fraction", "0.2"),
        ("name", 5),
        ("top", {"hidden": [True]}),
        ("top", {"hidden": ["8"]}),
        ("quantizer", {"mode": "pq", "q": "4", "L": 2}),
        ("optimizer", {"name": "sgd", "lr": "0.1"}),
        ("schedule", {"kind": "clients", "clients_per_step": "2"}),
    ],
)
def test_a_run_config_with_a_value_of_the_wrong_json_type_is_refused(
    field: str, value: Any
) -> None:
    valid = RunCreate.model_validate(run_spec()).model_dump(mode="json")
    RunCreate.model_validate_json(json.dumps(valid))  # the valid config itself passes
    with pytest.raises(ValidationError):
        RunCreate.model_validate_json(json.dumps({**valid, field: value}))
    with pytest.raises(ValidationError):  # as FastAPI validates a parsed body
        RunCreate.model_validate({**valid, field: value})


def test_numbers_of_the_right_json_type_are_accepted() -> None:
    spec = RunCreate.model_validate({**run_spec(), "eval_fraction": 0, "top": {"hidden": [8]}})
    assert spec.eval_fraction == 0.0 and spec.optimizer.lr == 0.1
    assert ResumeIn.model_validate({"from_step": 10}).from_step == 10
    for value in ("10", True, 10.0):
        with pytest.raises(ValidationError):
            ResumeIn.model_validate({"from_step": value})
    with pytest.raises(ValidationError):
        AlignmentIn.model_validate({"hashed_ids": [1]})


def test_party_b_refuses_strings_and_bools_for_integers(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "labels.csv"), tokens=f"t:{TOKEN}"
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=60) as client,
    ):
        run = aligned_run(client)
        for step in (1, 2):
            client.post(f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK)
        for value in ("0", True, 0.0):  # {"from_step": "0"} once rolled a run back
            refused = client.post(f"/v1/runs/{run.id}/resume", json={"from_step": value})
            problem(refused, 422, "invalid-request")
        assert client.get(f"/v1/runs/{run.id}").json()["step"] == 2
        for field, value in [("batch_size", "8"), ("steps", True), ("seed", 3.0)]:
            refused = client.post("/v1/runs", json={**run_spec(), field: value})
            problem(refused, 422, "invalid-request")
