"""``POST /v1/runs/{id}/alignment/keys`` over HTTP: the binary alignment aligns a run on the
same ids as the JSON one, answers a retry with the same bytes, and refuses what is malformed;
``GET /v1/psi`` advertises it."""

import httpx

from shared.alignkeys import AlignRequest, decode_align_reply, encode_align_request, request_for
from shared.alignment import hmac_ids
from tests.utils.small_runs import ALIGNED_IDS, MSGPACK, aligned_run, problem, run_spec


def _create(client: httpx.Client) -> tuple[str, bytes]:
    created = client.post("/v1/runs", json=run_spec())
    assert created.status_code == 201, created.text
    return created.json()["id"], bytes.fromhex(created.json()["alignment_key"])


def test_binary_and_json_alignments_give_the_same_run(party_b_client: httpx.Client) -> None:
    client = party_b_client
    assert client.get("/v1/psi").json()["alignment_formats"] == ["json", "keys"]
    by_json = aligned_run(client)
    run_id, key = _create(client)
    keys = hmac_ids(key, ALIGNED_IDS)
    request, ordered = request_for(keys)
    body = encode_align_request(request)

    answer = client.post(f"/v1/runs/{run_id}/alignment/keys", content=body, headers=MSGPACK)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/msgpack"
    reply = decode_align_reply(answer.content)
    id_of = dict(zip(keys, ALIGNED_IDS, strict=True))
    kept = sorted(id_of[k] for k, ok in zip(ordered, reply.mask(), strict=True) if ok)
    json_ids = dict(zip(hmac_ids(by_json.alignment_key, ALIGNED_IDS), ALIGNED_IDS, strict=True))

    assert kept == sorted(json_ids[k] for k in by_json.aligned)  # "stranger" is not kept
    assert "stranger" not in kept and reply.n == len(ALIGNED_IDS)
    shown = client.get(f"/v1/runs/{run_id}").json()
    assert shown["status"] == "training"
    assert shown["alignment"] == client.get(f"/v1/runs/{by_json.id}").json()["alignment"]
    assert (reply.train, reply.eval) == (shown["alignment"]["train"], shown["alignment"]["eval"])
    # 16 bytes and a bit per id, against 64 hex characters each way
    assert len(body) + len(answer.content) < len(ALIGNED_IDS) * 17 + 64

    again = client.post(f"/v1/runs/{run_id}/alignment/keys", content=body, headers=MSGPACK)
    assert again.status_code == 200 and again.content == answer.content  # a retry
    fewer = encode_align_request(request_for(keys[:10])[0])
    problem(
        client.post(f"/v1/runs/{run_id}/alignment/keys", content=fewer, headers=MSGPACK),
        409,
        "run-state",
    )


def test_malformed_binary_alignments_are_refused_and_change_nothing(
    party_b_client: httpx.Client,
) -> None:
    client = party_b_client
    run_id, key = _create(client)
    path = f"/v1/runs/{run_id}/alignment/keys"
    keys = sorted(k[:8] for k in hmac_ids(key, ALIGNED_IDS))
    unsorted = encode_align_request(AlignRequest(prefix=8, keys=b"".join(keys))).replace(
        keys[0] + keys[1], keys[1] + keys[0]
    )

    problem(client.post(path, content=b"\x81", headers=MSGPACK), 400, "malformed-message")
    assert (
        "ascending"
        in problem(client.post(path, content=unsorted, headers=MSGPACK), 400, "malformed-message")[
            "detail"
        ]
    )
    problem(client.post(path, json={"p": 8}), 415, "unsupported-media-type")
    problem(
        client.post("/v1/runs/nosuchrun/alignment/keys", content=b"\x81", headers=MSGPACK),
        404,
        "not-found",
    )
    assert client.get(f"/v1/runs/{run_id}").json()["status"] == "created"
