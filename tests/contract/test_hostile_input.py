"""Hostile and broken input against a live party B: fuzzing, limits, untrusted bytes on disk.

Every answer to a request a caller can make is < 500 and problem+json when it is an error, no
request hangs (every call has a timeout), and a refused request changes nothing: the run's
step counter and top-model checksum (``model_sha256``) are the same before and after.
"""

import pickle
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from party_b.api import create_app
from party_b.settings import Limits, Settings
from shared.training import state_from_bytes
from tests.utils.live import live_server
from tests.utils.small_runs import (
    MSGPACK,
    PROBLEM,
    TOKEN,
    SmallRun,
    aligned_run,
    labels_csv,
    problem,
    run_spec,
)

LIMITS = Limits(
    max_body_bytes=64 * 1024,
    max_batch=64,
    max_dim=64,
    max_q=16,
    max_L=16,
    max_steps=100_000,
    max_runs_per_token=8,
    max_aligned_ids=100,
    max_top_params=20_000,
    max_top_layers=8,
    max_top_activations=2000,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Settings]]:
    tmp = tmp_path_factory.mktemp("hostile")
    settings = Settings(
        data_dir=tmp / "b",
        labels=labels_csv(tmp / "labels.csv"),
        tokens=f"tester:{TOKEN}",
        limits=LIMITS,
    )
    with live_server(create_app(settings)) as url:
        yield url, settings


@pytest.fixture(scope="module")
def client(server: tuple[str, Settings]) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server[0], headers=headers, timeout=60.0) as c:
        yield c


@pytest.fixture(scope="module")
def fuzz_run(client: httpx.Client) -> SmallRun:
    """One aligned run that every fuzz test hits (a step applied, so all endpoints work)."""
    run = aligned_run(client, name="fuzz")
    assert client.post(
        f"/v1/runs/{run.id}/steps", content=run.step_body(1), headers=MSGPACK
    ).is_success
    return run


def _snapshot(client: httpx.Client, run_id: str) -> tuple[int, str]:
    out = client.get(f"/v1/runs/{run_id}").json()
    assert out["model_sha256"], out
    return out["step"], out["model_sha256"]


def _send_and_check(client: httpx.Client, run: SmallRun, route: str, body: bytes) -> int:
    """POST ``body``; assert no 5xx, problem+json errors, and nothing changed if refused."""
    before = _snapshot(client, run.id)
    response = client.post(f"/v1/runs/{run.id}/{route}", content=body, headers=MSGPACK)
    if currently_in_test_context():
        event(f"{route} {response.status_code}")  # see --hypothesis-show-statistics
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"] == PROBLEM
        assert response.json()["status"] == response.status_code
        assert _snapshot(client, run.id) == before, f"refused {route} changed the run"
    return response.status_code


# ------------------------------------------------------------------------ payload strategies

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=64)
)
msgpack_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=6)
    ),
    max_leaves=30,
)
# Values that look like what the decoder expects, to get past its first checks.
_plausible = st.sampled_from([0, 1, 2, 3, 4, 8, 16, 17, 64, 65, 2**16, 2**31, 2**63 - 1, -1])
_field_values = (
    _plausible
    | _scalars
    | st.sampled_from(["f4", "f2", "f8", "pq", "raw", "step_req", "eval_req", "pred_req"])
    | st.lists(msgpack_values, max_size=3)
)


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """A valid body broken in one of several ways: bytes, structure or field values."""
    how = draw(st.sampled_from(["flip", "truncate", "insert", "field", "drop", "chunk-field"]))
    data = bytearray(valid)
    if how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
        return bytes(data)
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if how == "insert":
        i = draw(st.integers(0, len(data)))
        return bytes(data[:i]) + draw(st.binary(min_size=1, max_size=16)) + bytes(data[i:])
    message: dict[str, Any] = msgpack.unpackb(valid, raw=False)
    if how == "field":
        message[draw(st.sampled_from([*message, "x"]))] = draw(_field_values)
    elif how == "drop":
        del message[draw(st.sampled_from(sorted(message)))]
    else:
        chunk = message["a"][0]
        chunk[draw(st.sampled_from([*chunk, "x"]))] = draw(_field_values)
    return msgpack.packb(message, use_bin_type=True)


def _f32(values: Any) -> Any:
    import numpy as np

    return np.clip(values, -3.4e38, 3.4e38).astype(np.float32)  # finite, possibly huge


@st.composite
def well_formed_steps(draw: st.DrawFn, run: SmallRun, applied: int) -> bytes:
    """Step requests the codec accepts, each of the things party B checks (step number, digest,
    rows, d, q, L, raw vs pq) right or, with probability 1/4 each, wrong; plus chunking, dtype
    and value range (huge values make the top model diverge)."""
    import numpy as np

    from shared import codec

    def pick(right: Any, wrong: list[Any]) -> Any:
        return right if draw(st.integers(0, 3)) else draw(st.sampled_from(wrong))

    step = pick(applied + 1, [applied, applied + 2, 0, 2**63 - 1])
    right = msgpack.unpackb(run.step_body(max(step, 1)), raw=False)["h"]
    digest = pick(right, [b"\0" * 8, right[::-1]])
    batch = run.spec["batch_size"]
    rows = pick(batch, [batch - 1, batch + 1, 1])
    parts = draw(st.integers(1, min(3, rows)))
    sizes = [rows // parts + (i < rows % parts) for i in range(parts)]
    d = pick(8, [4, 16])
    q = pick(4, [2]) if d % 4 == 0 else 2
    L = pick(2, [3, 16])
    raw = pick(False, [True])
    scale = draw(st.sampled_from([1.0, 1.0, 1e-30, 1e30, 3e38, 0.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    chunks: tuple[codec.Activations, ...]
    if raw:
        chunks = tuple(
            codec.RawActivations(_f32(scale * rng.standard_normal((n, d)))) for n in sizes
        )
    else:
        chunks = tuple(
            codec.PQActivations(
                codebook=_f32(scale * rng.standard_normal((1, L, d // q))),
                codewords=rng.integers(0, L, (n, q)),
            )
            for n in sizes
        )
    dtype = draw(st.sampled_from(["float32", "float16"]))
    try:
        return codec.encode_step_request(
            codec.StepRequest(step=step, batch_digest=digest, chunks=chunks), codebook_dtype=dtype
        )
    except ValueError:  # e.g. 3e38 does not fit float16: not sendable, draw again
        from hypothesis import reject

        reject()


FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # the same examples on every CI run
)


# ------------------------------------------------------------------------ fuzzing msgpack routes


@FUZZ
@given(data=st.data())
def test_fuzzed_step_bodies_never_500_and_refusals_change_nothing(
    client: httpx.Client, fuzz_run: SmallRun, data: st.DataObject
) -> None:
    step, _ = _snapshot(client, fuzz_run.id)
    kind = data.draw(st.sampled_from(["well-formed", "next", "replay", "msgpack", "bytes"]))
    if kind == "well-formed":
        body = data.draw(well_formed_steps(fuzz_run, step))
    elif kind == "next":
        body = data.draw(mutated(fuzz_run.step_body(step + 1)))
    elif kind == "replay":  # the applied step again, altered
        body = data.draw(mutated(fuzz_run.step_body(step)))
    elif kind == "msgpack":
        body = msgpack.packb(data.draw(msgpack_values), use_bin_type=True)
    else:
        body = data.draw(st.binary(max_size=256))
    _send_and_check(client, fuzz_run, "steps", body)


@FUZZ
@given(data=st.data())
def test_fuzzed_evaluate_and_predict_bodies_never_500_and_change_nothing(
    client: httpx.Client, fuzz_run: SmallRun, data: st.DataObject
) -> None:
    route = data.draw(st.sampled_from(["evaluate", "predict"]))
    valid = fuzz_run.evaluate_body() if route == "evaluate" else fuzz_run.predict_body()
    if data.draw(st.integers(0, 3)):
        body = data.draw(mutated(valid))
    else:
        body = msgpack.packb(data.draw(msgpack_values), use_bin_type=True)
    before = _snapshot(client, fuzz_run.id)
    _send_and_check(client, fuzz_run, route, body)
    assert _snapshot(client, fuzz_run.id) == before  # serving never moves the model


@pytest.fixture
def fresh_run(client: httpx.Client, request: pytest.FixtureRequest) -> SmallRun:
    """A run of its own, one step in: the fuzzed run's model may have been trained into
    overflow by the huge (finite, valid) activations the fuzzer sends."""
    run = aligned_run(client, name=request.node.name[:100])
    first = client.post(f"/v1/runs/{run.id}/steps", content=run.step_body(1), headers=MSGPACK)
    assert first.is_success, first.text
    return run


def test_a_diverging_step_is_refused_and_changes_nothing(
    client: httpx.Client, fresh_run: SmallRun
) -> None:
    """Finite but huge activations overflow the top model: 422, model untouched."""
    fuzz_run = fresh_run
    step, _ = _snapshot(client, fuzz_run.id)
    message = msgpack.unpackb(fuzz_run.step_body(step + 1), raw=False)
    chunk = message["a"][0]
    # -3.4e38 (float32's lowest) everywhere: both logits -inf, so the loss is NaN
    chunk["cb"] = b"\xff\xff\x7f\xff" * (len(chunk["cb"]) // 4)
    body = msgpack.packb(message, use_bin_type=True)

    status = _send_and_check(client, fuzz_run, "steps", body)

    assert status == 422
    assert client.post(
        f"/v1/runs/{fuzz_run.id}/steps", content=fuzz_run.step_body(step + 1), headers=MSGPACK
    ).is_success  # and the same step, sane, is then applied


def test_a_stalled_upload_does_not_block_other_callers(
    server: tuple[str, Settings], client: httpx.Client, fresh_run: SmallRun
) -> None:
    """A caller that announces a body and stops sending holds only its own connection: the
    body is read before any run lock is taken, so the same run keeps training meanwhile."""
    import socket

    fuzz_run = fresh_run
    from urllib.parse import urlsplit

    url = urlsplit(server[0])
    step, _ = _snapshot(client, fuzz_run.id)
    with socket.create_connection((url.hostname, url.port), timeout=10) as stalled:
        stalled.sendall(
            f"POST /v1/runs/{fuzz_run.id}/steps HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/msgpack\r\n"
            "Content-Length: 1000\r\n\r\n".encode()
            + fuzz_run.step_body(step + 1)[:10]
        )
        answer = client.post(
            f"/v1/runs/{fuzz_run.id}/steps", content=fuzz_run.step_body(step + 1), headers=MSGPACK
        )
        assert answer.status_code == 200, answer.text
        assert _snapshot(client, fuzz_run.id)[0] == step + 1


# ------------------------------------------------------------------------ limits


@pytest.mark.parametrize(
    ("override", "slug"),
    [
        ({"batch_size": 65}, "limit-exceeded"),
        ({"cut_dim": 128, "quantizer": {"mode": "pq", "q": 4, "L": 2}}, "limit-exceeded"),
        ({"quantizer": {"mode": "pq", "q": 32, "L": 2}, "cut_dim": 32}, "limit-exceeded"),
        ({"quantizer": {"mode": "pq", "q": 4, "L": 17}}, "limit-exceeded"),
        ({"steps": 100_001}, "limit-exceeded"),
        ({"top": {"hidden": [10**6, 10**6]}}, "limit-exceeded"),  # 10^12 parameters: no alloc
        ({"top": {"hidden": [10**4]}}, "limit-exceeded"),
        ({"top": {"hidden": [2**62]}}, "limit-exceeded"),  # overflows torch's size arithmetic
        ({"top": {"hidden": [10**30]}}, "limit-exceeded"),  # past 64 bits (was a 500)
        ({"top": {"hidden": [1] * 9}}, "limit-exceeded"),  # a long list takes long to build
        ({"top": {"hidden": [64] * 4}}, "limit-exceeded"),  # few parameters, big activations
        ({"top": {"hidden": [-3]}}, "invalid-request"),
        (
            {"optimizer": {"name": "sgd", "lr": 0.1, "weight_decay": float("inf")}},
            "invalid-request",
        ),
        (
            {"optimizer": {"name": "adagrad", "lr": 0.1, "initial_accumulator": -1.0}},
            "invalid-request",
        ),
        ({"optimizer": {"name": "adagrad", "lr": 0.1, "eps": 0.0}}, "invalid-request"),
        ({"top": {"hidden": [8], "dropout": float("nan")}}, "invalid-request"),
        ({"seed": 2**63}, "invalid-request"),
    ],
)
def test_run_configs_over_a_limit_get_a_clear_problem(
    client: httpx.Client, override: dict[str, Any], slug: str
) -> None:
    import json

    # json.dumps writes NaN / Infinity literals, which Python's JSON parser on the server reads
    body = json.dumps(run_spec(**override)).encode()
    response = client.post("/v1/runs", content=body, headers={"Content-Type": "application/json"})
    detail = problem(response, 422, slug)["detail"]
    if slug == "limit-exceeded":
        assert "limit" in detail


def test_messages_over_the_server_limits_get_a_clear_problem(
    client: httpx.Client, fuzz_run: SmallRun
) -> None:
    from shared import codec

    step, _ = _snapshot(client, fuzz_run.id)
    url = f"/v1/runs/{fuzz_run.id}/steps"
    too_many_rows = codec.encode_step_request(
        codec.StepRequest(step=step + 1, batch_digest=b"\0" * 8, chunks=(fuzz_run.chunk(65),))
    )
    too_wide = msgpack.unpackb(fuzz_run.step_body(step + 1), raw=False)
    too_wide["a"][0]["d"] = 128
    too_many_codewords = msgpack.unpackb(fuzz_run.step_body(step + 1), raw=False)
    too_many_codewords["a"][0]["L"] = 17

    # the answer names the field, this server's bound for it and the setting that raises it
    for body, field, bound, setting in [
        (too_many_rows, "a[0].B", "64", "FEDLITE_B_LIMIT_MAX_BATCH"),
        (msgpack.packb(too_wide, use_bin_type=True), "a[0].d", "64", "FEDLITE_B_LIMIT_MAX_DIM"),
        (
            msgpack.packb(too_many_codewords, use_bin_type=True),
            "a[0].L",
            "16",
            "FEDLITE_B_LIMIT_MAX_L",
        ),
    ]:
        detail = problem(client.post(url, content=body, headers=MSGPACK), 422, "limit-exceeded")
        assert field in detail["detail"] and bound in detail["detail"], detail
        assert setting in detail["detail"], detail
    problem(
        client.post(url, content=b"\0" * (64 * 1024 + 1), headers=MSGPACK),
        413,
        "payload-too-large",
    )
    problem(
        client.post(
            f"/v1/runs/{fuzz_run.id}/alignment",
            content=b'{"hashed_ids": ["' + b"a" * 70_000 + b'"]}',
            headers={"Content-Type": "application/json"},
        ),
        413,
        "payload-too-large",
    )


def test_alignment_over_the_id_limit_gets_a_clear_problem(client: httpx.Client) -> None:
    run = client.post("/v1/runs", json=run_spec(name="too-many-ids")).json()
    ids = [f"{i:064x}" for i in range(101)]
    detail = problem(
        client.post(f"/v1/runs/{run['id']}/alignment", json={"hashed_ids": ids}),
        422,
        "limit-exceeded",
    )["detail"]
    assert "101" in detail and "100" in detail


def test_steps_and_checkpoints_out_of_the_64_bit_range_are_refused(
    client: httpx.Client, fuzz_run: SmallRun
) -> None:
    problem(
        client.get(f"/v1/runs/{fuzz_run.id}/steps", params={"start": 2**63}), 422, "invalid-request"
    )
    problem(
        client.post(f"/v1/runs/{fuzz_run.id}/resume", json={"from_step": 2**64}),
        422,
        "invalid-request",
    )
    assert client.get(f"/v1/runs/{fuzz_run.id}/steps", params={"start": 2**63 - 1}).is_success


# ------------------------------------------------------------------------ untrusted bytes on disk


class _Exploit:
    """Unpickling this runs ``Path(marker).touch()``: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("form", ["pickle", "torch.save"])
def test_a_checkpoint_replaced_by_a_malicious_pickle_is_refused_and_never_runs(
    tmp_path: Path, form: str
) -> None:
    import io

    import torch

    marker = tmp_path / "pwned"
    if form == "pickle":
        payload = pickle.dumps(_Exploit(marker), protocol=2)  # torch.load's own protocol
    else:
        buffer = io.BytesIO()
        torch.save({"weight": _Exploit(marker)}, buffer)
        payload = buffer.getvalue()
    settings = Settings(
        data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "labels.csv"), tokens=f"t:{TOKEN}"
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=60) as c,
    ):
        run = aligned_run(c)
    # the operator's database is tampered with while party B is down
    database = Path(settings.resolved_database_url().removeprefix("sqlite:///"))
    with sqlite3.connect(database) as db:
        db.execute("UPDATE checkpoints SET model_state = ? WHERE run_id = ?", (payload, run.id))

    with (
        live_server(create_app(settings)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=60) as c,
    ):
        refused = c.post(f"/v1/runs/{run.id}/steps", content=run.step_body(1), headers=MSGPACK)
        shown = c.get(f"/v1/runs/{run.id}")

    assert not marker.exists(), "unpickling the checkpoint ran code"
    body = problem(refused, 500, "internal")
    assert "checkpoint" in body["detail"]
    assert shown.status_code == 200 and shown.json()["model_sha256"] is None
    with pytest.raises(pickle.UnpicklingError):
        state_from_bytes(payload)
    assert not marker.exists()
    # ...while the payload is live: loading it the unsafe way does run it
    if form == "pickle":
        pickle.loads(payload)
    else:
        torch.load(io.BytesIO(payload), weights_only=False)
    assert marker.exists()


# ------------------------------------------------------------------------ retried creates


def test_a_repeated_create_with_the_same_idempotency_key_gets_the_same_run(
    client: httpx.Client,
) -> None:
    spec = run_spec(name="idempotent")
    key = {"Idempotency-Key": "k-0123456789"}

    first = client.post("/v1/runs", json=spec, headers=key)
    again = client.post("/v1/runs", json=spec, headers=key)
    other = client.post("/v1/runs", json={**spec, "seed": 4}, headers=key)

    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert [r["name"] for r in client.get("/v1/runs").json()["runs"]].count("idempotent") == 1
    problem(other, 422, "idempotency-key-reused")


def test_a_database_from_before_idempotency_keys_is_upgraded_at_start_up(tmp_path: Path) -> None:
    from party_b import store

    settings = Settings(
        data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "labels.csv"), tokens=f"t:{TOKEN}"
    )
    (tmp_path / "b").mkdir()
    engine = store.make_engine(settings.resolved_database_url())
    store.IdempotencyKey.__table__.drop(engine)  # type: ignore[attr-defined]
    engine.dispose()

    headers = {"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": "k-0123456789"}
    with live_server(create_app(settings)) as url, httpx.Client(base_url=url, timeout=60) as c:
        first = c.post("/v1/runs", json=run_spec(), headers=headers)
        again = c.post("/v1/runs", json=run_spec(), headers=headers)
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
