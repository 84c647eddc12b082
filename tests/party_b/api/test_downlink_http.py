"""The run's downlink over real HTTP: chosen at creation, refused when unknown, replayed
byte for byte, and read as the original representation for runs stored before it existed."""

from collections.abc import Iterator

import httpx
import msgpack
import numpy as np
import pytest

from api_schemas import RunCreate, default_downlink
from party_b.api import create_app
from party_b.settings import Settings
from shared import codec
from shared.wire.downlink import DownlinkSpec
from tests.utils.live import live_server
from tests.utils.small_runs import MSGPACK, TOKEN, aligned_run, labels_csv, problem, run_spec

DOWNLINKS = [
    "float32",
    "float16",
    "bfloat16",
    "int8",
    "int4",
    "int2",
    "int1",
    "topk:k=3",
    "pq:q=4,L=2",
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    tmp_path = tmp_path_factory.mktemp("downlink")
    # privacy off: each step's reply is read for its loss too, which label DP (the default)
    # withholds
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"t:{TOKEN}",
        privacy="off",
    )
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        ) as http,
    ):
        yield http


@pytest.mark.parametrize("downlink", DOWNLINKS)
def test_each_downlink_trains_and_a_replayed_step_gets_the_same_bytes(
    client: httpx.Client, downlink: str
) -> None:
    run = aligned_run(client, downlink=downlink, steps=3, quantizer={"mode": "raw"})
    assert client.get(f"/v1/runs/{run.id}").json()["config"]["downlink"] == downlink
    compressed = DownlinkSpec.from_string(downlink).kind not in ("float32", "float16")
    checksums = [client.get(f"/v1/runs/{run.id}").json()["model_sha256"]]
    for step in (1, 2, 3):
        body = run.step_body(step)
        answer = client.post(f"/v1/runs/{run.id}/steps", content=body, headers=MSGPACK)
        assert answer.status_code == 200, answer.text
        checksums.append(client.get(f"/v1/runs/{run.id}").json()["model_sha256"])
        again = client.post(f"/v1/runs/{run.id}/steps", content=body, headers=MSGPACK)
        assert again.content == answer.content  # the stored answer, and no second update
        assert client.get(f"/v1/runs/{run.id}").json()["model_sha256"] == checksums[-1]
        decoded = codec.decode_step_response(answer.content)
        assert decoded.grad.shape == (8, 8) and np.isfinite(decoded.loss)
        assert ("gr" in msgpack.unpackb(answer.content)) == compressed
    assert len(set(checksums)) == 4  # every step moved the top model once
    assert client.get(f"/v1/runs/{run.id}").json()["step"] == 3


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"downlink": "gzip"}, "unknown downlink 'gzip'"),
        ({"downlink": "int3"}, "bits"),
        ({"downlink": "pq:q=3,L=2"}, "q=3 must divide d=8"),
        ({"downlink": "topk:k=9"}, "keeps more than the d=8"),
        ({"downlink": "pq:q=4,L=100000"}, "L"),
        ({"downlink": ""}, "at least 1 character"),
        ({"downlink": "int8", "grad_dtype": "float16"}, "disagree"),
    ],
)
def test_an_unknown_or_unfitting_downlink_gets_422(
    client: httpx.Client, overrides: dict[str, str], fragment: str
) -> None:
    body = problem(client.post("/v1/runs", json=run_spec(**overrides)), 422, "invalid-request")
    assert fragment in str(body), body


def test_a_new_run_without_a_downlink_gets_the_rule_of_its_cut_dim() -> None:
    expected = {1: "int4", 8: "int4", 32: "int4", 96: "int4", 9180: "int4"}
    expected |= {9181: "topk:k=256", 9216: "topk:k=256", 36 * 1000: "topk:k=1000"}
    for d, downlink in expected.items():
        assert default_downlink(d) == downlink
        spec = RunCreate.model_validate(run_spec(cut_dim=d, quantizer={"mode": "raw"}))
        assert spec.downlink == default_downlink(d)
        DownlinkSpec.from_string(spec.downlink).check_width(d)  # the rule always fits
    # an explicit null is "not given"; grad_dtype "float16" alone still means float16
    assert RunCreate.model_validate(run_spec(downlink=None)).downlink == default_downlink(8)
    assert RunCreate.model_validate(run_spec(grad_dtype="float16")).downlink == "float16"


def test_a_run_created_without_a_downlink_stores_the_resolved_one(client: httpx.Client) -> None:
    """Party B stores the rule's choice with the run: a later default never reaches it."""
    run = aligned_run(client, steps=2, quantizer={"mode": "raw"})
    assert client.get(f"/v1/runs/{run.id}").json()["config"]["downlink"] == "int4"
    answer = client.post(f"/v1/runs/{run.id}/steps", content=run.step_body(1), headers=MSGPACK)
    assert answer.status_code == 200, answer.text
    assert msgpack.unpackb(answer.content)["gr"]["b"] == 4
    stored = client.get(f"/v1/runs/{run.id}").json()["config"]
    assert RunCreate.from_stored(stored | {"downlink": "float32"}).downlink == "float32"


def test_a_run_stored_before_the_downlink_field_keeps_its_representation() -> None:
    stored = RunCreate.model_validate(run_spec()).model_dump(mode="json")
    for grad_dtype in ("float32", "float16"):
        old = {k: v for k, v in stored.items() if k != "downlink"} | {"grad_dtype": grad_dtype}
        assert RunCreate.from_stored(old).downlink == grad_dtype


def test_a_resolved_spec_validates_to_itself() -> None:
    # party B stores model_dump(); an idempotent create compares a new spec with it
    spec = RunCreate.model_validate(run_spec(downlink="int2"))
    assert RunCreate.model_validate(spec.model_dump(mode="json")) == spec
