"""Every step a transaction: exactly once, for every wire option, whatever fails.

Party B computes a step's gradient and encodes its answer before it changes any state; only
then does it update the top model and record the step. The tests drive party B's real service
(in process, on a real SQLite file) and the real app over HTTP with activations that grow
until a float16 gradient no longer fits its wire dtype.
"""

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from party_b.api import create_app
from party_b.service import Caller, Service
from party_b.settings import Settings
from shared import codec
from tests.utils.live import live_server
from tests.utils.small_runs import (
    MSGPACK,
    TOKEN,
    SmallRun,
    aligned_in_process,
    aligned_run,
    labels_csv,
    small_party_b,
)

# Activations of N(0, 100^2) and top SGD at lr 1: the gradient party B sends back passes
# float16's largest value (65504) at step 3 and keeps growing, without diverging, up to step 6.
SCALE = 100.0
OVERFLOW = {"optimizer": {"name": "sgd", "lr": 1.0}, "checkpoint_interval": 2}
STEPS = 6

WIRE_OPTIONS: list[dict[str, Any]] = [
    {"downlink": "float32", "quantizer": {"mode": "pq", "q": 4, "L": 2}},
    {"grad_dtype": "float16", "quantizer": {"mode": "pq", "q": 4, "L": 2}},
    {
        "grad_dtype": "float16",
        "quantizer": {"mode": "pq", "q": 4, "L": 2, "codebook_dtype": "float16"},
    },
    {"downlink": "float32", "quantizer": {"mode": "raw"}},
    {"grad_dtype": "float16", "quantizer": {"mode": "raw"}},
    *(
        {"downlink": downlink, "quantizer": {"mode": "pq", "q": 4, "L": 2}}
        for downlink in ("bfloat16", "int8", "int4", "int2", "int1", "topk:k=3", "pq:q=4,L=2")
    ),
    {"quantizer": {"mode": "pq", "q": 4, "L": 2}},  # a new run's default (int4 at d = 8)
]


def _option_id(options: dict[str, Any]) -> str:
    downlink = options.get("downlink", options.get("grad_dtype", "default"))
    return f"{options['quantizer']['mode']}-{downlink}"


def _checksum(service: Service, caller: Caller, run_id: str) -> str | None:
    return service.runs.get(caller, run_id).model_sha256


def _reference(tmp_path: Path, options: dict[str, Any]) -> tuple[list[bytes], str | None]:
    """Every answer of an uninterrupted run, and its final top-model checksum."""
    party_b = small_party_b(tmp_path)
    service, caller = party_b.service(), party_b.caller
    run = aligned_in_process(service, caller, **{**OVERFLOW, **options})
    answers = [
        service.steps.step(caller, run.id, run.step_body(t, scale=SCALE)) for t in range(1, 7)
    ]
    return answers, _checksum(service, caller, run.id)


@pytest.mark.parametrize("options", WIRE_OPTIONS, ids=_option_id)
def test_every_wire_option_applies_each_step_once_and_resumes_bit_identically(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    # Prepare: the answers of an uninterrupted run
    expected, checksum = _reference(tmp_path / "reference", options)

    # Act: every step sent twice (a lost answer), and party B restarted after step 5 on its
    # database: it comes back at its checkpoint of step 4 and step 5 is sent again
    party_b = small_party_b(tmp_path / "interrupted")
    service, caller = party_b.service(), party_b.caller
    run = aligned_in_process(service, caller, **OVERFLOW, **options)
    answers: dict[int, bytes] = {}
    step, restarted = 1, False
    while step <= STEPS:
        body = run.step_body(step, scale=SCALE)
        first = service.steps.step(caller, run.id, body)
        assert service.steps.step(caller, run.id, body) == first  # the stored answer, no new update
        answers[step] = first
        if step == 5 and not restarted:
            assert service.runs.get(caller, run.id).checkpoints[-1] == 4
            restarted, service = True, party_b.service()
            service.runs.recover()
            step = service.runs.get(caller, run.id).step
        step += 1

    # Assert: the same bytes at every step, the same model, and each step logged once
    assert [answers[t] for t in range(1, STEPS + 1)] == expected
    assert _checksum(service, caller, run.id) == checksum
    assert [row.step for row in service.runs.step_log(caller, run.id, 0, 100)] == list(range(1, 7))


def test_a_float16_gradient_beyond_its_range_goes_as_float32_and_is_applied_once(
    tmp_path: Path,
) -> None:
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"t:{TOKEN}",
        # the plain loss, whose gradients reach float16's range (a forward-corrected one
        # pulls less on the rows its model contradicts)
        privacy="protected,forward_loss=false",
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=60) as client,
    ):
        run: SmallRun = aligned_run(client, grad_dtype="float16", **OVERFLOW)
        dtypes = []
        for step in range(1, 5):
            body = run.step_body(step, scale=SCALE)
            answer = client.post(f"/v1/runs/{run.id}/steps", content=body, headers=MSGPACK)
            assert answer.status_code == 200, answer.text
            before = client.get(f"/v1/runs/{run.id}").json()["model_sha256"]
            again = client.post(f"/v1/runs/{run.id}/steps", content=body, headers=MSGPACK)
            assert again.content == answer.content
            assert client.get(f"/v1/runs/{run.id}").json()["model_sha256"] == before
            grad = codec.decode_step_response(answer.content).grad
            dtypes.append(np.float16 if np.abs(grad).max() <= 65504 else np.float32)
        assert dtypes[:2] == [np.float16, np.float16] and np.float32 in dtypes
        assert client.get(f"/v1/runs/{run.id}").json()["step"] == 4


# Stages of a step after the request decoded, and where each can be made to fail.
STAGES = {
    "dequantize": ("party_b.service.activations.dequantize", False),
    "compute": ("party_b.top.TopTrainer.compute_step", False),
    "encode": ("party_b.service.answer.step_response", False),
    "record": ("party_b.store.log_step", True),  # inside the commit: rolls back to a checkpoint
}


@pytest.mark.parametrize("stage", STAGES)
def test_a_failure_at_any_stage_of_a_step_changes_nothing(
    tmp_path: Path, stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the answers of an uninterrupted float16 run, and a run to break at step 3
    expected, _ = _reference(tmp_path / "reference", WIRE_OPTIONS[1])  # float16 gradients
    party_b = small_party_b(tmp_path / "broken")
    service, caller = party_b.service(), party_b.caller
    run = aligned_in_process(service, caller, **{**OVERFLOW, **WIRE_OPTIONS[1]})
    for step in (1, 2):
        assert (
            service.steps.step(caller, run.id, run.step_body(step, scale=SCALE))
            == expected[step - 1]
        )
    before = service.runs.get(caller, run.id)

    # Act: step 3 fails at the stage
    target, in_commit = STAGES[stage]

    def fail(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError(f"injected failure: {stage}")

    with monkeypatch.context() as patch:
        patch.setattr(target, fail)
        with pytest.raises(RuntimeError, match="injected"):
            service.steps.step(caller, run.id, run.step_body(3, scale=SCALE))
    after = service.runs.get(caller, run.id)

    # Assert: as if step 3 never arrived (in the commit: back at the checkpoint of step 2,
    # which is where party B is after a crash), and the run goes on exactly as the reference
    assert after.step == before.step == 2 and after.model_sha256 == before.model_sha256
    if in_commit:
        assert after.checkpoints[-1] == 2
    for step in range(3, STEPS + 1):
        assert (
            service.steps.step(caller, run.id, run.step_body(step, scale=SCALE))
            == expected[step - 1]
        )
