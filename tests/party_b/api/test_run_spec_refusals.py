"""``POST /v1/runs`` refuses a top-model size party B derives from its own data when the
caller set it to something else (it used to overwrite ``top.num_classes`` and
``top.side_features`` silently); the same value, or none, is accepted."""

from typing import Any

import httpx
import pytest

from tests.utils.small_runs import problem, run_spec


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            {"top": {"hidden": [8], "num_classes": 5}},
            "top.num_classes=5, but party B's labels make it 2",
        ),
        (
            {"top": {"hidden": [8], "side_features": 1}},
            "top.side_features=1, but party B's feature columns (use_side_features) make it 3",
        ),
        (
            {"top": {"hidden": [8], "side_features": 3}, "use_side_features": False},
            "top.side_features=3, but use_side_features=false make it 0",
        ),
    ],
)
def test_a_size_party_b_would_overwrite_is_refused(
    party_b_client: httpx.Client, overrides: dict[str, Any], says: str
) -> None:
    before = party_b_client.get("/v1/runs").json()["runs"]
    body = problem(
        party_b_client.post("/v1/runs", json=run_spec(**overrides)), 422, "invalid-request"
    )
    assert says in body["detail"] and "leave top." in body["detail"]
    assert party_b_client.get("/v1/runs").json()["runs"] == before  # nothing created


@pytest.mark.parametrize(
    "overrides",
    [
        {"top": {"hidden": [8], "num_classes": 2}},
        {"top": {"hidden": [8], "side_features": 3}},
        {"top": {"hidden": [8], "side_features": 0}, "use_side_features": False},
        {"top": {"hidden": [8]}},
    ],
)
def test_the_values_party_b_would_choose_are_accepted(
    party_b_client: httpx.Client, overrides: dict[str, Any]
) -> None:
    created = party_b_client.post("/v1/runs", json=run_spec(**overrides))
    assert created.status_code == 201, created.text
    assert created.json()["num_classes"] == 2
