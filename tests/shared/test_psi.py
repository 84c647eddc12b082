"""Private set intersection: exact intersections, nothing of party B's other ids in its
answers, the cache per pair of dataset versions, and the endpoint's limits."""

import hashlib
import hmac
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgpack
import numpy as np
import pandas as pd
import private_set_intersection.python as psi_library
import pytest

from party_a.cli import main as main_a
from party_a.errors import ConfigError, problem_from_body
from party_a.features import load_features
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_b import auth
from party_b.inprocess import InProcessTransport
from party_b.labels import load_label_table
from party_b.metrics import Metrics
from party_b.privacy import parse_policy
from party_b.service import Caller, Service, build_service
from party_b.settings import Limits
from party_b.store import make_engine, make_session_factory
from shared.codec import WIRE_VERSION, CodecError
from shared.psi import (
    PsiClient,
    PsiError,
    PsiReply,
    PsiRequest,
    PsiServer,
    dataset_digest,
    decode_psi_reply,
    decode_psi_request,
    encode_psi_reply,
    encode_psi_request,
    new_server_key,
    psi_request_bytes,
)
from tests.utils.party_a import breast_config
from tests.utils.servers import PartyBProcess

TOKEN = "alice-token-0123456789"


def _ids(prefix: str, numbers: range) -> list[str]:
    return [f"{prefix}-{n:06d}" for n in numbers]


# ============================================================================ the protocol


@pytest.mark.parametrize(
    ("a_ids", "b_ids"),
    [
        (range(0, 40), range(25, 400)),  # small A, large B
        (range(0, 900), range(850, 870)),  # large A, small B, B inside A
        (range(0, 300), range(300, 500)),  # disjoint
        (range(0, 1), range(0, 1)),  # one id each, equal
        (range(0, 257), range(0, 257)),  # identical sets
    ],
    ids=["small-a", "b-inside-a", "disjoint", "single", "identical"],
)
def test_overlapping_sets_of_different_sizes_give_exactly_the_intersection(
    a_ids: range, b_ids: range
) -> None:
    a, b = _ids("id", a_ids), _ids("id", b_ids)
    server = PsiServer(b, new_server_key())
    client = PsiClient(a)

    response, count = server.respond(client.request(), max_ids=10_000)
    common = client.intersection(server.setup, response)

    assert count == len(a)
    assert common == sorted(set(a) & set(b))


def test_party_b_setup_depends_only_on_its_ids_and_key() -> None:
    key = new_server_key()
    ids = _ids("id", range(50))

    same = PsiServer(list(reversed(ids)), key).setup
    other_key = PsiServer(ids, new_server_key()).setup

    assert PsiServer(ids, key).setup == same  # sorted: party B's row order does not show
    assert other_key != same


def test_the_dataset_digest_is_a_function_of_the_id_set_only() -> None:
    assert dataset_digest(["b", "a"]) == dataset_digest(["a", "b", "a"])
    assert dataset_digest(["a", "b"]) != dataset_digest(["a", "bc"])
    assert dataset_digest(["ab", "c"]) != dataset_digest(["a", "bc"])  # length-prefixed


def test_psi_messages_round_trip_and_refuse_anything_else() -> None:
    request = PsiRequest(request=b"\x01\x02")
    reply = PsiReply(dataset_version="0123abcd", setup=b"s" * 40, response=b"r" * 33)

    assert decode_psi_request(encode_psi_request(request)) == request
    assert decode_psi_reply(encode_psi_reply(reply)) == reply
    for bad in [
        b"",
        b"\xc1",
        msgpack.packb([1, 2]),
        msgpack.packb({"v": WIRE_VERSION + 1, "t": "psi_request", "request": b""}),
        msgpack.packb({"v": WIRE_VERSION, "t": "psi_reply", "request": b""}),
        msgpack.packb({"v": WIRE_VERSION, "t": "psi_request", "request": "text"}),
        msgpack.packb({"v": WIRE_VERSION, "t": "psi_request", "request": b"", "x": 1}),
    ]:
        with pytest.raises(CodecError):
            decode_psi_request(bad)


def test_party_b_refuses_requests_that_are_not_points_or_too_many() -> None:
    server = PsiServer(_ids("id", range(10)), new_server_key())
    request = PsiClient(_ids("id", range(20))).request()

    with pytest.raises(PsiError, match="over this server's limit 19"):
        server.respond(request, max_ids=19)
    with pytest.raises(PsiError, match="not a PSI request"):
        server.respond(b"\xff\xff\xff", max_ids=100)
    # a well-formed request whose last "point" has an impossible SEC1 prefix
    parsed = psi_library.Request.FromString(request)
    parsed.encrypted_elements[-1] = b"\x05" + parsed.encrypted_elements[-1][1:]
    with pytest.raises(PsiError, match="invalid point"):
        server.respond(parsed.SerializeToString(), max_ids=100)


# ============================================================================ through party B


def _write_tables(tmp_path: Path, a_ids: list[str], b_ids: list[str]) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    tmp_path.mkdir(parents=True, exist_ok=True)
    a_path, b_path = tmp_path / "a.csv", tmp_path / "b.csv"
    pd.DataFrame({"id": a_ids, **{f"f{j}": rng.normal(size=len(a_ids)) for j in range(4)}}).to_csv(
        a_path, index=False
    )
    pd.DataFrame(
        {"id": b_ids, "y": rng.integers(0, 2, len(b_ids)), "g0": rng.normal(size=len(b_ids))}
    ).to_csv(b_path, index=False)
    return a_path, b_path


class _CountingTransport(InProcessTransport):
    psi_requests = 0

    def psi(self, body: bytes) -> bytes:
        self.psi_requests += 1
        return super().psi(body)


@pytest.fixture
def party_b_service(tmp_path: Path) -> Iterator[tuple[Service, Caller, Path]]:
    a_ids = _ids("p", range(0, 400))
    b_ids = _ids("p", range(150, 700))
    a_path, b_path = _write_tables(tmp_path, a_ids, b_ids)
    engine = make_engine(f"sqlite:///{tmp_path / 'b.sqlite'}")
    sessions = make_session_factory(engine)
    with sessions() as session:
        auth.register_token(session, "alice", TOKEN)
        row = auth.authenticate(session, TOKEN)
        assert row is not None
    labels = load_label_table(b_path, id_column="id", label_column="y", feature_columns=None)
    # predict answers for training ids: the test predicts on rows the run may have trained
    # on, and is about party A's intersection check, not party B's privacy policy
    service = build_service(
        sessions=sessions,
        labels=labels,
        limits=Limits(),
        metrics=Metrics(),
        privacy=parse_policy("off,predict_train_ids=true"),
    )
    yield service, Caller(token_id=row.id, name="alice"), a_path
    engine.dispose()


def _trainer(
    tmp_path: Path, transport: InProcessTransport, features: Path, name: str
) -> PartyATrainer:
    config = breast_config(name, **{"run.steps": 4, "run.batch_size": 16})
    return PartyATrainer(
        config=config,
        features=load_features(features, id_column="id", feature_columns=None, standardize=True),
        transport=transport,
        store=LocalStore.in_directory(tmp_path / "a-state"),
        server="in-process",
    )


def test_runs_align_on_the_psi_intersection_and_reuse_the_cached_result(
    party_b_service: tuple[Service, Caller, Path], tmp_path: Path
) -> None:
    service, caller, a_path = party_b_service
    transport = _CountingTransport(service, caller, problem=problem_from_body)
    expected = _ids("p", range(150, 400))

    first = _trainer(tmp_path, transport, a_path, "first")
    remote = first.prepare()
    first.train()
    second = _trainer(tmp_path, transport, a_path, "second")
    second.prepare()

    assert remote.alignment is not None and remote.alignment.aligned == len(expected)
    assert transport.psi_requests == 1  # the second run reused the cached intersection
    key = bytes.fromhex(remote.alignment_key)
    assert set(first.data.aligned) == {
        hmac.new(key, i.encode(), hashlib.sha256).digest() for i in expected
    }
    result, cached = first.psi()
    assert cached and result.intersection == expected
    assert (result.own_size, result.peer_size) == (400, 550)
    first.close()
    second.close()


def test_a_new_label_table_at_party_b_means_a_new_psi(
    party_b_service: tuple[Service, Caller, Path], tmp_path: Path
) -> None:
    service, caller, a_path = party_b_service
    transport = _CountingTransport(service, caller, problem=problem_from_body)
    trainer = _trainer(tmp_path, transport, a_path, "before")
    before, _ = trainer.psi()
    _a, b_path = _write_tables(tmp_path / "v2", [], _ids("p", range(0, 100)))
    labels = load_label_table(b_path, id_column="id", label_column="y", feature_columns=None)
    changed = build_service(
        sessions=service.context.sessions, labels=labels, limits=Limits(), metrics=Metrics()
    )
    trainer.transport = _CountingTransport(changed, caller, problem=problem_from_body)

    after, cached = trainer.psi()

    assert not cached
    assert after.peer_version != before.peer_version
    assert after.intersection == _ids("p", range(0, 100))
    trainer.close()


def test_predict_refuses_ids_outside_the_intersection(
    party_b_service: tuple[Service, Caller, Path], tmp_path: Path
) -> None:
    service, caller, a_path = party_b_service
    trainer = _trainer(
        tmp_path, InProcessTransport(service, caller, problem=problem_from_body), a_path, "serve"
    )
    trainer.prepare()
    trainer.train()

    scores = trainer.predict(["p-000200", "p-000399"])
    with pytest.raises(ConfigError, match="not in the private set intersection"):
        trainer.predict(["p-000200", "p-000010"])  # p-000010: party A's alone

    assert scores.scores.shape[0] == 2
    trainer.close()


# ============================================================================ over HTTP


@pytest.fixture(scope="module")
def http_party_b(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[httpx.Client, list[str], list[str]]]:
    """``fedlite-b serve`` in its own process (one for this module), at most 250 ids per PSI."""
    tmp_path = tmp_path_factory.mktemp("http-party-b")
    a_ids = _ids("secret-a", range(0, 120)) + _ids("shared", range(0, 80))
    b_ids = _ids("shared", range(0, 80)) + _ids("secret-b", range(0, 300))
    _a, b_path = _write_tables(tmp_path, a_ids, b_ids)
    server = PartyBProcess(
        tmp_path / "b", b_path, {"alice": TOKEN}, env={"FEDLITE_B_LIMIT_MAX_ALIGNED_IDS": "250"}
    )
    server.start()
    client = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    )
    yield client, a_ids, b_ids
    client.close()
    server.stop()


def test_party_b_answers_contain_no_id_of_its_own_outside_the_intersection(
    http_party_b: tuple[httpx.Client, list[str], list[str]],
) -> None:
    """Everything party B sends during alignment, searched for every form of its other ids
    that party A could compute from a guess: the id, its SHA-256, its HMAC under the run key."""
    client, a_ids, b_ids = http_party_b
    spec = breast_config("psi").run_create(32).model_dump(mode="json")
    spec["top"] = {"hidden": [8]}
    msgpack_type = {"Content-Type": "application/msgpack"}
    psi_client = PsiClient(a_ids)

    info = client.get("/v1/psi")
    reply = client.post(
        "/v1/psi",
        content=encode_psi_request(PsiRequest(psi_client.request())),
        headers=msgpack_type,
    )
    answer = decode_psi_reply(reply.content)
    common = psi_client.intersection(answer.setup, answer.response)
    run = client.post("/v1/runs", json=spec)
    key = bytes.fromhex(run.json()["alignment_key"])
    offered = [hmac.new(key, i.encode(), hashlib.sha256).hexdigest() for i in common]
    aligned = client.post(f"/v1/runs/{run.json()['id']}/alignment", json={"hashed_ids": offered})

    assert (info.status_code, reply.status_code, run.status_code) == (200, 200, 201)
    assert aligned.status_code == 200
    assert reply.headers["content-type"] == "application/msgpack"
    assert common == sorted(set(a_ids) & set(b_ids)) == _ids("shared", range(80))
    assert sorted(aligned.json()["intersection"]) == sorted(offered)
    sent = b"".join(
        [info.content, reply.content, answer.setup, answer.response, run.content, aligned.content]
    )
    outside = sorted(set(b_ids) - set(a_ids))
    for i in outside:
        raw = i.encode()
        for form in (
            raw,
            hashlib.sha256(raw).digest(),
            hashlib.sha256(raw).hexdigest().encode(),
            hmac.new(key, raw, hashlib.sha256).digest(),
            hmac.new(key, raw, hashlib.sha256).hexdigest().encode(),
        ):
            assert form not in sent, i
    assert json.loads(info.content)["size"] == len(b_ids)  # |Y| is what party A does learn


def test_the_psi_endpoint_refuses_bad_bodies_with_problem_details(
    http_party_b: tuple[httpx.Client, list[str], list[str]],
) -> None:
    client, _a_ids, _b_ids = http_party_b
    msgpack_type = {"Content-Type": "application/msgpack"}
    too_many = encode_psi_request(PsiRequest(PsiClient(_ids("x", range(251))).request()))

    over = client.post("/v1/psi", content=too_many, headers=msgpack_type)
    garbage = client.post("/v1/psi", content=b"\x93\x01\x02\x03", headers=msgpack_type)
    as_json = client.post("/v1/psi", json={"ids": ["a"]})
    anonymous = client.get("/v1/psi", headers={"Authorization": ""})

    assert over.status_code == 422
    assert over.json()["type"] == "urn:fedlite:problem:limit-exceeded"
    assert garbage.status_code == 400
    assert garbage.json()["type"] == "urn:fedlite:problem:malformed-message"
    assert as_json.status_code == 415
    assert anonymous.status_code == 401


def test_fedlite_a_align_prints_the_intersection_and_caches_it(
    http_party_b: tuple[httpx.Client, list[str], list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, a_ids, _b_ids = http_party_b
    features, _b = _write_tables(tmp_path / "cli", a_ids, [])
    flags = ["--server", str(client.base_url), "--token", TOKEN, "--features", str(features)]
    flags += ["--state-dir", str(tmp_path / "state")]

    first = main_a(["align", *flags, "--ids-out", str(tmp_path / "common.txt")])
    first_report = json.loads(capsys.readouterr().out)
    second = main_a(["align", *flags])
    second_report = json.loads(capsys.readouterr().out)

    assert first == second == 0
    assert first_report["intersection"] == 80 and not first_report["cached"]
    assert (first_report["party_a_ids"], first_report["party_b_ids"]) == (200, 380)
    assert second_report["cached"]
    assert second_report["party_b_version"] == first_report["party_b_version"]
    assert (tmp_path / "common.txt").read_text().split() == _ids("shared", range(80))


def test_party_a_reports_a_reply_that_does_not_fit_its_request() -> None:
    server = PsiServer(_ids("id", range(5)), new_server_key())
    response, _count = server.respond(PsiClient(_ids("id", range(3))).request(), max_ids=10)

    with pytest.raises(PsiError, match="answered 3 points for 4 ids"):
        PsiClient(_ids("id", range(4))).intersection(server.setup, response)
    with pytest.raises(PsiError, match="not a PSI reply"):
        PsiClient(_ids("id", range(3))).intersection(b"\xff\xff", response)


@pytest.mark.parametrize("n", [1, 7, 8, 569, 1872, 1873])
def test_a_psi_requests_size_is_known_before_its_work(n: int) -> None:
    """Party A checks the request against party B's body limit before blinding a million
    ids: the size it computes is the encoded request's, across the msgpack bin headers
    (bin8 up to 7 ids, bin16 up to 1,872, bin32 above)."""
    request = PsiClient([f"id-{i}" for i in range(n)]).request()
    assert psi_request_bytes(n) == len(encode_psi_request(PsiRequest(request=request)))
