"""Scoring a whole table with ``fedlite-a predict`` (issue 34), against a real party B
(uvicorn in a thread, the bundled demo data) whose limit is 128 ids a request:

* ``--all`` scores every id party B holds, in requests within party B's ``max_batch`` (read
  from ``GET /v1/psi``), each score equal to that id scored alone;
* ``--out`` resumes: a scoring cut off by a party B that stops answering carries on after
  its last complete request (what a killed writer left past it is cut off), sends only the
  requests still missing, and ends byte for byte as an uninterrupted one;
* a partial file of another list of ids is started over, not continued;
* ``.parquet`` gets the same ids and scores as Parquet;
* over the limit: ``--chunk-size`` above party B's limit is exit 2 naming
  FEDLITE_B_LIMIT_MAX_BATCH, and a request over it is 422 ``limit-exceeded`` naming the
  limit and the setting (party B), never a 400 about msgpack's array length.
"""

import csv
import io
import json
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from party_b.api import create_app
from party_b.settings import Limits, Settings
from shared import codec
from tests.utils.cli import DEMO_CONFIG, TOKEN, Ran, demo_tables, run_cli
from tests.utils.live import live_server

LIMIT = 128  # party B's max_batch here: the demo's 569 ids take 5 requests

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class PredictCounter:
    """Counts the predict requests party B answers; after ``answer_only`` of them, every
    further one gets 503 (party B gone, as far as party A can tell)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.answered = 0
        self.answer_only: int | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        predict = scope["type"] == "http" and scope["path"].endswith("/predict")
        if predict and self.answer_only is not None and self.answered >= self.answer_only:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if predict:
            self.answered += 1
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def party_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Party B with a 128-id limit per request, and a run trained on it by ``fedlite-a``."""
    root = tmp_path_factory.mktemp("scoring")
    features, labels = demo_tables(root)
    settings = Settings(
        data_dir=root / "b", labels=labels, tokens=f"a:{TOKEN}", limits=Limits(max_batch=LIMIT)
    )
    counter = PredictCounter(create_app(settings))
    with live_server(counter) as url:  # type: ignore[arg-type]
        base = {"url": url, "features": features, "state": root / "a", "counter": counter}
        ran = _a(base, "train", "--config", str(DEMO_CONFIG), "--steps", "4")
        assert ran.returncode == 0, ran.stderr
        yield base


def _a(party_b: dict[str, Any], command: str, *extra: str) -> Ran:
    return run_cli(
        "a", command, "--server", party_b["url"], "--token", TOKEN,
        "--features", str(party_b["features"]), "--state-dir", str(party_b["state"]), *extra,
    )  # fmt: skip


def _predict(party_b: dict[str, Any], *extra: str) -> Ran:
    counter = party_b["counter"]
    counter.answered, counter.answer_only = 0, None
    return _a(party_b, "predict", "--name", "breast-demo", "--retry-for", "0", *extra)


def _rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _table_ids(features: Path) -> list[str]:
    with features.open(newline="") as stream:
        return [row["id"] for row in csv.DictReader(stream)]


@pytest.fixture(scope="module")
def whole(party_b: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``predict --all --out`` of the demo table, uninterrupted."""
    out = tmp_path_factory.mktemp("whole") / "scores.csv"
    ran = _predict(party_b, "--all", "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    return {"ran": ran, "out": out, "requests": party_b["counter"].answered}


def test_all_ids_are_scored_in_requests_within_party_bs_limit(
    party_b: dict[str, Any], whole: dict[str, Any]
) -> None:
    # Prepare
    ids = _table_ids(party_b["features"])

    # Execute: the file written by the uninterrupted run
    rows = _rows(whole["out"].read_text())

    # Assert: every id once, in the table's order, 128 a request
    assert rows[0] == ["id", "score_0", "score_1"]
    assert [r[0] for r in rows[1:]] == ids
    assert whole["requests"] == -(-len(ids) // LIMIT)
    assert f"at most {LIMIT} a request" in whole["ran"].stderr
    left = [p.name for p in whole["out"].parent.iterdir()]
    assert left == ["scores.csv"]  # no partial file or record left behind


def test_a_score_in_the_whole_table_is_the_score_of_that_id_alone(
    party_b: dict[str, Any], whole: dict[str, Any]
) -> None:
    # Prepare
    scored = {r[0]: r[1:] for r in _rows(whole["out"].read_text())[1:]}
    picked = ["s0000", "s0100", "s0568"]

    # Execute
    alone = [_predict(party_b, "--ids", i) for i in picked]

    # Assert
    for i, ran in zip(picked, alone, strict=True):
        assert ran.returncode == 0, ran.stderr
        assert _rows(ran.stdout)[1] == [i, *scored[i]]


def test_an_interrupted_scoring_resumes_after_its_last_complete_request(
    party_b: dict[str, Any], whole: dict[str, Any], tmp_path: Path
) -> None:
    # Prepare: party B answers three requests, then stops answering (exit 1, party B gone)
    out = tmp_path / "scores.csv"
    counter = party_b["counter"]
    counter.answered, counter.answer_only = 0, 3
    cut = _a(party_b, "predict", "--name", "breast-demo", "--retry-for", "0", "--all",
             "--out", str(out))  # fmt: skip
    assert cut.returncode == 1, cut.stderr
    partial = tmp_path / "scores.csv.partial"
    assert len(_rows(partial.read_text())) == 1 + 3 * LIMIT
    assert not out.exists()
    with partial.open("a") as stream:  # a writer killed in the middle of its next rows
        stream.write("s0999,0.5,0.5\ns1000,0.")

    # Execute: the same command again
    resumed = _predict(party_b, "--all", "--out", str(out))

    # Assert: only the missing requests went, and the file is the uninterrupted one
    assert resumed.returncode == 0, resumed.stderr
    assert f"{3 * LIMIT:,} of 569 ids scored already" in resumed.stderr
    assert counter.answered == whole["requests"] - 3
    assert out.read_bytes() == whole["out"].read_bytes()
    assert not partial.exists()


def test_a_partial_file_of_other_ids_is_started_over(
    party_b: dict[str, Any], tmp_path: Path
) -> None:
    # Prepare: an interrupted scoring of other ids
    out = tmp_path / "scores.csv"
    counter = party_b["counter"]
    counter.answered, counter.answer_only = 0, 1
    ids = _table_ids(party_b["features"])
    cut = _a(party_b, "predict", "--name", "breast-demo", "--retry-for", "0",
             "--ids", ",".join(ids[:300]), "--out", str(out))  # fmt: skip
    assert cut.returncode == 1

    # Execute: scoring another list into the same file
    ran = _predict(party_b, "--ids", ",".join(ids[300:330]), "--out", str(out))

    # Assert
    assert ran.returncode == 0, ran.stderr
    assert [r[0] for r in _rows(out.read_text())[1:]] == ids[300:330]


def test_parquet_holds_the_same_ids_and_scores(
    party_b: dict[str, Any], whole: dict[str, Any], tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    # Execute
    out = tmp_path / "scores.parquet"
    ran = _predict(party_b, "--all", "--out", str(out))

    # Assert
    assert ran.returncode == 0, ran.stderr
    table = pq.read_table(out)
    assert table.column_names == ["id", "score_0", "score_1"]
    assert str(table.schema.field("score_0").type) == "float"
    rows = _rows(whole["out"].read_text())[1:]
    assert table.column("id").to_pylist() == [r[0] for r in rows]
    from_csv = np.array([[float(v) for v in r[1:]] for r in rows])
    parquet = np.stack([table.column(c).to_numpy() for c in ("score_0", "score_1")], axis=1)
    np.testing.assert_allclose(parquet, from_csv, atol=5e-7)


def test_a_chunk_size_over_party_bs_limit_names_the_setting(party_b: dict[str, Any]) -> None:
    ran = _predict(party_b, "--ids", "s0000", "--chunk-size", str(LIMIT + 1))

    assert ran.returncode == 2
    assert "FEDLITE_B_LIMIT_MAX_BATCH" in ran.stderr
    assert f"{LIMIT}" in ran.stderr


def test_a_request_over_the_limit_is_422_naming_the_limit_and_the_setting(
    party_b: dict[str, Any],
) -> None:
    # Prepare: a predict body of 129 ids (any ids: the limit is checked before they are)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    runs = httpx.get(f"{party_b['url']}/v1/runs", headers=headers, timeout=30).json()["runs"]
    chunk = codec.RawActivations(np.zeros((LIMIT + 1, 32), dtype=np.float32))
    body = codec.encode_predict_request(
        codec.PredictRequest(ids=["0" * 64] * (LIMIT + 1), chunks=(chunk,))
    )

    # Execute
    answer = httpx.post(
        f"{party_b['url']}/v1/runs/{runs[0]['id']}/predict",
        content=body,
        headers={**headers, "Content-Type": "application/msgpack"},
        timeout=30,
    )

    # Assert
    assert answer.status_code == 422, answer.text
    problem = answer.json()
    assert problem["type"] == "urn:fedlite:problem:limit-exceeded"
    assert (problem["limit"], problem["value"]) == ("max_batch", LIMIT)
    assert "FEDLITE_B_LIMIT_MAX_BATCH" in problem["detail"]
    assert f"{LIMIT + 1} ids" in problem["detail"]


def test_the_python_api_follows_the_limit_party_b_names(party_b: dict[str, Any]) -> None:
    from party_a.api import connect

    # Prepare: 300 ids, one request of the API's default size, over party B's 128
    ids = _table_ids(party_b["features"])[:300]
    counter = party_b["counter"]
    counter.answered, counter.answer_only = 0, None
    with connect(
        party_b["url"], TOKEN, features=party_b["features"], config=DEMO_CONFIG,
        overrides={"run.steps": 4}, state_dir=party_b["state"],
    ) as run:  # fmt: skip
        # Execute
        scores = run.predict(ids)

    # Assert: refused once (422 naming max_batch = 128), then 128 + 128 + 44, every id scored
    assert scores.ids == ids and scores.scores.shape == (300, 2)
    assert counter.answered == 1 + 3


def test_a_scoring_cut_off_after_its_last_request_finishes_without_sending_any(
    party_b: dict[str, Any], whole: dict[str, Any], tmp_path: Path
) -> None:
    # Prepare: every row written and recorded, the file not yet made (a kill just before)
    out = tmp_path / "scores.csv"
    counter = party_b["counter"]
    counter.answered, counter.answer_only = 0, 1
    cut = _a(party_b, "predict", "--name", "breast-demo", "--retry-for", "0", "--all",
             "--out", str(out))  # fmt: skip
    assert cut.returncode == 1
    record = tmp_path / "scores.csv.partial.json"
    job = json.loads(record.read_text())["job"]
    complete = whole["out"].read_bytes()
    (tmp_path / "scores.csv.partial").write_bytes(complete)
    rows = len(_rows(complete.decode())) - 1
    record.write_text(json.dumps({"job": job, "rows": rows, "bytes": len(complete)}))

    # Execute
    ran = _predict(party_b, "--all", "--out", str(out))

    # Assert
    assert ran.returncode == 0, ran.stderr
    assert counter.answered == 0
    assert out.read_bytes() == complete and not record.exists()
