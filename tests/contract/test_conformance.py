"""The conformance kit (docs/conformance/): the text, the vectors and the code cannot drift.

* the vector files are exactly what the reference code in shared/ computes now;
* an implementation written from docs/PROTOCOL.md alone (tests/utils/from_the_doc.py: hashlib
  and hmac, nothing from shared/) reproduces every vector;
* the worked examples printed in PROTOCOL.md are the vectors' first cases.
"""

import hashlib
import json
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from tests.utils import codewords_from_the_doc, gradient_from_the_doc
from tests.utils import conformance_vectors as vectors
from tests.utils import from_the_doc as doc

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"
KIT_FILES = sorted(vectors.KIT_DIR.glob("*.json"))


def _cases(topic: str) -> list[dict[str, Any]]:
    data = json.loads((vectors.KIT_DIR / f"{topic}.json").read_text(encoding="utf-8"))
    cases: list[dict[str, Any]] = data["cases"]
    return cases


@pytest.mark.parametrize("topic", list(vectors.TOPICS))
def test_the_vector_files_are_what_the_code_computes(topic: str) -> None:
    path = vectors.KIT_DIR / f"{topic}.json"
    assert path.read_text(encoding="utf-8") == vectors.text(topic), (
        f"{path.name} is stale: run python -m tests.utils.conformance_vectors"
    )


@pytest.mark.parametrize("path", KIT_FILES, ids=[p.name for p in KIT_FILES])
def test_every_kit_file_has_the_common_structure(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))

    assert data["kit"] == vectors.KIT and data["format"] == vectors.FORMAT
    assert data["topic"] == path.stem
    assert data["spec"].startswith("docs/PROTOCOL.md")
    assert isinstance(data["about"], str) and data["about"]
    assert data["cases"], "a topic without cases tests nothing"
    names = [case["name"] for case in data["cases"]]
    assert len(set(names)) == len(names)
    for case in data["cases"]:
        assert set(case) == {"name", "input", "output"}


def test_every_derived_values_spec_names_a_section_of_the_text() -> None:
    headings = [line for line in PROTOCOL.read_text().splitlines() if line.startswith("#")]
    for topic in vectors.TOPICS:
        spec = json.loads((vectors.KIT_DIR / f"{topic}.json").read_text())["spec"]
        title = spec.split(": ", 1)[1]
        assert any(title in h for h in headings), f"{topic}: no heading {title!r}"


# ------------------------------------------------------------------ written from the text


def _fields(data: bytes) -> dict[str, Any]:
    """A message's fields as plain values, whatever its key order."""
    import msgpack

    fields: dict[str, Any] = msgpack.unpackb(data)
    return fields


def test_every_request_vector_decodes_to_its_fields_in_either_key_order() -> None:
    from shared import codec

    decoders = {
        "step_req": codec.decode_step_request,
        "eval_req": codec.decode_evaluate_request,
        "pred_req": codec.decode_predict_request,
    }
    for case in _cases("requests"):
        given, output = case["input"], case["output"]
        message, reordered = (bytes.fromhex(output[k]) for k in ("message", "reordered"))
        assert len(message) == output["bytes"] and _fields(message) == _fields(reordered)
        for data in (message, reordered):
            decoded = decoders[given["t"]](data)
            chunks = [
                {"k": "raw", "x": c.activations.tolist()}
                if isinstance(c, codec.RawActivations)
                else {"k": "pq", "cb": c.codebook.tolist(), "codewords": c.codewords.tolist()}
                for c in decoded.chunks
            ]
            if given["dtype"] == "float32":  # float16 rounds: checked by the bytes above
                assert chunks == given["chunks"], case["name"]


def _canonical_digest_from_the_text(message: bytes) -> bytes:
    """Section 1's canonical form, written from the text: the msgpack value again, every
    map's keys in ascending order of their UTF-8 bytes, then SHA-256."""

    def canonical(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: canonical(value[k]) for k in sorted(value, key=lambda k: k.encode())}
        if isinstance(value, list):
            return [canonical(v) for v in value]
        return value

    value = msgpack.unpackb(message, raw=False)
    return hashlib.sha256(msgpack.packb(canonical(value), use_bin_type=True)).digest()


def test_a_message_and_its_keys_in_another_order_have_one_canonical_digest() -> None:
    """Party B identifies a request by its canonical digest (a step sent again is the same
    message whatever its key order): the vectors' digest, from the text and from ours."""
    from shared import codec

    for case in _cases("requests"):
        output = case["output"]
        message, reordered = (bytes.fromhex(output[k]) for k in ("message", "reordered"))
        assert message != reordered
        digest = bytes.fromhex(output["digest"])
        assert codec.canonical_digest(message) == codec.canonical_digest(reordered) == digest
        assert _canonical_digest_from_the_text(reordered) == digest, case["name"]


def test_the_text_alone_writes_the_request_vectors_byte_for_byte() -> None:
    """The independent client (tests/independent_client, written from the documents) encodes
    the bit-packed float32 cases to exactly the vectors' bytes."""
    from tests.independent_client import messages

    written = 0
    for case in _cases("requests"):
        given = case["input"]
        if given["dtype"] != "float32" or given["codewords"] != "packed":
            continue
        chunks = [
            messages.raw_chunk(np.array(c["x"], dtype=np.float32))
            if c["k"] == "raw"
            else messages.pq_chunk(np.array(c["cb"], dtype=np.float32), np.array(c["codewords"]))
            for c in given["chunks"]
        ]
        if given["t"] == "step_req":
            data = messages.step_request(given["s"], bytes.fromhex(given["h"]), chunks)
        elif given["t"] == "eval_req":
            data = messages.evaluate_request(bytes.fromhex(given["h"]), chunks)
        else:
            data = messages.predict_request(given["ids"], chunks)
        assert data.hex() == case["output"]["message"], case["name"]
        written += 1
    assert written >= 4


def test_the_text_alone_fuses_the_parties_and_slices_their_gradients() -> None:
    """Section 12.6's table, in numpy: concat side by side, sum, mean; each party's columns,
    the whole gradient, or it over N."""
    for case in _cases("parties"):
        given, output = case["input"], case["output"]
        if "fusion" not in given:
            continue
        z = [np.array(p, dtype=np.float32) for p in given["z"]]
        g = np.array(given["G"], dtype=np.float32)
        if given["fusion"] == "concat":
            fused = np.concatenate(z, axis=1)
            edges = np.cumsum([p.shape[1] for p in z])[:-1]
            grads = np.split(g, edges, axis=1)
        else:
            fused = z[0].copy()
            for part in z[1:]:
                fused = fused + part
            share = g if given["fusion"] == "sum" else g / np.float32(len(z))
            if given["fusion"] == "mean":
                fused = fused / np.float32(len(z))
            grads = [share] * len(z)
        assert fused.tolist() == output["Z"], case["name"]
        assert [x.tolist() for x in grads] == output["g"], case["name"]


def test_the_text_alone_cuts_a_predict_list_as_every_party_does() -> None:
    """Section 12.8's rule, in integers: for each party p, n_p = (max_body_bytes - 1024 -
    4 c_p) * B // ((98 + 4 d_p) * B + 4 c_p); n = max(1, the least n_p) ids a request, the
    list cut into requests of n in order."""
    cut = [case for case in _cases("parties") if "max_body_bytes" in case["input"]]
    assert len(cut) == 4
    for case in cut:
        given, output = case["input"], case["output"]
        body, batch = given["max_body_bytes"], given["batch_size"]
        n = max(
            1,
            min(
                (body - 1024 - 4 * p["codebook_floats"])
                * batch
                // ((98 + 4 * p["cut_dim"]) * batch + 4 * p["codebook_floats"])
                for p in given["parties"]
            ),
        )
        sizes = [min(n, given["ids"] - at) for at in range(0, given["ids"], n)]
        assert (n, sizes) == (output["ids_per_request"], output["requests"]), case["name"]


def test_the_psi_vector_is_a_real_intersection_under_its_keys() -> None:
    import private_set_intersection.python as psi_library

    from shared.psi import PsiServer, decode_psi_reply, decode_psi_request

    (case,) = _cases("psi")
    given, output = case["input"], case["output"]
    client = psi_library.client.CreateFromKey(bytes.fromhex(given["client_key"]), True)
    request = client.CreateRequest(given["client_ids"]).SerializeToString()
    server = PsiServer(given["server_ids"], bytes.fromhex(given["server_key"]))
    response, count = server.respond(request, max_ids=10)
    assert (request.hex(), server.setup.hex(), response.hex()) == (
        output["request"],
        output["setup"],
        output["response"],
    )
    assert decode_psi_request(bytes.fromhex(output["psi_request"])).request == request
    reply = decode_psi_reply(bytes.fromhex(output["psi_reply"]))
    assert (reply.setup, reply.response) == (server.setup, response)
    setup, answer = psi_library.ServerSetup(), psi_library.Response()
    setup.ParseFromString(reply.setup)
    answer.ParseFromString(reply.response)
    found = sorted(given["client_ids"][i] for i in client.GetIntersection(setup, answer))
    assert (
        found
        == output["intersection"]
        == sorted(set(given["client_ids"]) & set(given["server_ids"]))
    )
    assert count == len(given["client_ids"])


def test_the_text_alone_decodes_every_downlink_representation() -> None:
    for case in _cases("downlink"):
        message = bytes.fromhex(case["output"]["message"])
        assert len(message) == case["output"]["bytes"], case["name"]
        assert gradient_from_the_doc.gradient(message) == case["output"]["decoded"], case["name"]


def test_the_text_alone_decodes_every_entropy_coded_codeword_array() -> None:
    for case in _cases("codewords"):
        given, output = case["input"], case["output"]
        cf, ca = bytes.fromhex(output["cf"]), bytes.fromhex(output["ca"])
        shape = (given["B"], given["q"], given["R"], given["L"])
        assert codewords_from_the_doc.codewords(cf, ca, *shape) == given["codewords"]


def test_the_text_alone_gives_the_aligned_keys() -> None:
    for case in _cases("hmac"):
        given, out = case["input"], case["output"]
        keys = [doc.aligned_key(given["alignment_key"], i).hex() for i in given["ids"]]
        aligned = [k.hex() for k in doc.aligned_list(given["alignment_key"], given["ids"])]
        assert (keys, aligned) == (out["keys"], out["aligned"]), case["name"]


def test_the_text_alone_gives_the_binary_alignment() -> None:
    """PROTOCOL.md 8.1 with msgpack and the aligned keys of 9.1, nothing from shared/."""
    for case in _cases("align_keys"):
        given, out = case["input"], case["output"]
        p, key = given["prefix"], given["alignment_key"]
        keys = {i: doc.aligned_key(key, i) for i in given["party_a_ids"]}
        offered = sorted(given["party_a_ids"], key=lambda i: keys[i][:p])
        request = {"v": 1, "t": "align_req", "p": p, "k": b"".join(keys[i][:p] for i in offered)}
        bits = [i in set(given["party_b_ids"]) for i in offered]
        bitmap = bytes(
            sum(bit << (7 - j) for j, bit in enumerate(bits[at : at + 8]))
            for at in range(0, len(bits), 8)
        )
        train, eval_ = doc.split(sum(bits), given["seed"], given["eval_fraction"])
        reply = {"v": 1, "t": "align_res", "n": len(offered), "m": bitmap}
        reply |= {"train": len(train), "eval": len(eval_)}
        assert offered == out["offered"], case["name"]
        assert msgpack.packb(request).hex() == out["request"], case["name"]
        assert bitmap.hex() == out["kept_bitmap"], case["name"]
        assert msgpack.packb(reply).hex() == out["reply"], case["name"]


def test_the_text_alone_gives_the_sha256_orders() -> None:
    for case in _cases("sha_order"):
        given, out = case["input"], case["output"]
        keys = [doc.key64(f"{given['prefix']}{i}").hex() for i in range(given["n"])]
        assert keys == out["keys"], case["name"]
        assert doc.order(given["prefix"], given["n"]) == out["order"], case["name"]


def test_the_text_alone_gives_the_splits() -> None:
    for case in _cases("split"):
        given, out = case["input"], case["output"]
        train, held_out = doc.split(given["n"], given["seed"], given["eval_fraction"])
        assert (len(held_out), train, held_out) == (out["n_eval"], out["train"], out["eval"]), case[
            "name"
        ]


def test_the_text_alone_gives_the_shuffle_batches() -> None:
    for case in _cases("shuffle"):
        given = case["input"]
        for expected in case["output"]["batches"]:
            got = doc.shuffle_batch(
                given["n"], given["batch_size"], given["seed"], expected["step"]
            )
            assert got == expected["positions"], (case["name"], expected["step"])


def test_the_text_alone_gives_the_client_batches() -> None:
    for case in _cases("clients"):
        given = case["input"]
        for expected in case["output"]["batches"]:
            chosen, positions, chunks = doc.clients_batch(
                given["clients"],
                given["clients_per_step"],
                given["batch_size"],
                given["seed"],
                expected["step"],
            )
            assert (chosen, positions, chunks) == (
                expected["clients"],
                expected["positions"],
                expected["chunk_sizes"],
            ), (case["name"], expected["step"])


def test_the_text_alone_gives_the_step_seeds_and_digests() -> None:
    for case in _cases("step_seed"):
        given = case["input"]
        got = doc.step_seed(given["run_seed"], given["step"], given["purpose"])
        assert got == case["output"]["seed"], case["name"]
    for case in _cases("batch_digest"):
        keys = [bytes.fromhex(k) for k in case["input"]["ids"]]
        assert doc.digest(keys).hex() == case["output"]["digest"], case["name"]


def test_the_text_alone_gives_every_step_digest_and_eval_digest() -> None:
    """The whole chain an outside party A needs: aligned list -> split -> batch -> h."""
    for case in _cases("steps"):
        given, out = case["input"], case["output"]
        aligned = [bytes.fromhex(k) for k in given["aligned"]]
        train, held_out = doc.split(len(aligned), given["seed"], given["eval_fraction"])
        assert (train, held_out) == (out["train"], out["eval"])
        schedule = given["schedule"]
        for expected in out["batches"]:
            t = expected["step"]
            if schedule["kind"] == "shuffle":
                rows = doc.shuffle_batch(len(train), given["batch_size"], given["seed"], t)
                chunks = [given["batch_size"]]
            else:
                names = [schedule["clients"][p] for p in train]
                _, rows, chunks = doc.clients_batch(
                    names, schedule["clients_per_step"], given["batch_size"], given["seed"], t
                )
            positions = [train[i] for i in rows]
            h = doc.digest([aligned[p] for p in positions]).hex()
            assert (positions, chunks, h) == (
                expected["positions"],
                expected["chunk_sizes"],
                expected["digest"],
            ), (case["name"], t)
    for case in _cases("eval_digest"):
        given, out = case["input"], case["output"]
        aligned = [bytes.fromhex(k) for k in given["aligned"]]
        train, held_out = doc.split(len(aligned), given["seed"], given["eval_fraction"])
        positions = held_out if given["split"] == "eval" else train
        assert positions == out["positions"]
        assert doc.digest([aligned[p] for p in positions]).hex() == out["digest"]


# ------------------------------------------------------------------ the text's worked examples


def test_the_worked_examples_in_the_text_are_the_vectors() -> None:
    text = PROTOCOL.read_text()
    hmac_case = _cases("hmac")[0]["output"]
    split_case = _cases("split")[0]["output"]
    shuffle_case = _cases("shuffle")[0]["output"]["batches"]
    clients_case = _cases("clients")[0]["output"]["batches"]
    order_case = _cases("sha_order")[1]["output"]
    steps_case = _cases("steps")[0]["output"]["batches"][0]
    expected = [
        *(f"`{k}`" for k in hmac_case["keys"]),
        f'`order("shuffle:7:0:", 5) = {order_case["order"]}`',
        *(f"`{k}`" for k in order_case["keys"]),
        f"**eval = {split_case['eval']}**",
        f"**train = {split_case['train']}**",
        f"step 1 is `{shuffle_case[0]['positions']}`",
        f"**step 3 `{shuffle_case[2]['positions']}`**",
        f"**Step 1 = `{clients_case[0]['positions']}`, "
        f"chunks `{clients_case[0]['chunk_sizes']}`.**",
        f"Step 2 is `{clients_case[1]['positions']}`",
        f"**{_cases('step_seed')[0]['output']['seed']}**",
        f"**`{_cases('batch_digest')[1]['output']['digest']}`**",
        f"`{_cases('batch_digest')[2]['output']['digest']}`",
        f"positions `{steps_case['positions']}` and `h = {steps_case['digest']}`",
    ]
    missing = [e for e in expected if e not in text]
    assert not missing, f"docs/PROTOCOL.md lost its worked examples: {missing}"


def test_six_decimal_eval_fractions_give_exact_parts_per_million() -> None:
    """The claim of section 9.3: for every fraction with at most six decimals, the double
    product eval_fraction * 10^6 is within 1e-9 of the integer, so every language agrees."""
    k = np.arange(1_000_000, dtype=np.float64)
    fractions = k / 1e6  # the doubles nearest k / 10^6, as a JSON parser gives them
    products = fractions * 1e6
    assert np.abs(products - k).max() < 1e-9
    assert [doc.eval_size(10**6, float(f)) for f in fractions[::99991]] == list(k[::99991])
