"""The conformance vectors of docs/conformance/, computed by the reference code in shared/.

    python -m tests.utils.conformance_vectors          # rewrite the files of TOPICS
    python -m tests.utils.conformance_vectors --check  # exit 1 if a file differs

Every file has the same top-level structure (docs/conformance/README.md): ``kit``, ``format``,
``topic``, ``spec`` (where the text defines it), ``about`` and ``cases``, each case a ``name``,
an ``input`` and an ``output``. Bytes are lowercase hex strings. tests/contract/test_conformance.py
checks that the files equal what this module computes now (so code and vectors cannot drift)
and that an implementation written from the text alone reproduces them.

A topic is a function returning (about, cases); add one to ``TOPICS`` to add a file.
"""

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from party_b.privacy import METRICS_POLICIES, PrivacyPolicy
from party_b.privacy.defences import visible_metrics
from shared import alignkeys, codec
from shared.alignment import hmac_ids, order_by_raw_id
from shared.schedule import (
    ClientBatches,
    ShuffledBatches,
    batch_digest,
    make_schedule,
    split_train_eval,
    step_seed,
)
from shared.schedule.v2 import sha_order
from shared.wire.bitpack import packed_nbytes

KIT_DIR = Path(__file__).resolve().parents[2] / "docs" / "conformance"
KIT = "fedlite-vfl conformance vectors"
FORMAT = 1
MAX_SEED = 2**63 - 1

Case = dict[str, Any]
Topic = Callable[[], tuple[str, str, list[Case]]]  # () -> (section title, about, cases)

# The key every worked example and most vectors use: bytes 0x00, 0x01, ..., 0x1f.
EXAMPLE_KEY = bytes(range(32)).hex()
EXAMPLE_IDS = ["u10", "u2", "u9", "u1", "x", "u3", "u30", "u4", "é", "u5", "u6", "u7"]
EXAMPLE_CLIENTS = ["b", "a", "c", "a", "b", "c", "c", "a", "d", "c", "c", "b"]


def _case(name: str, given: dict[str, Any], output: dict[str, Any]) -> Case:
    return {"name": name, "input": given, "output": output}


def sha_order_cases() -> tuple[str, str, list[Case]]:
    about = (
        "The one drawing primitive: 0..n-1 sorted by the first 8 bytes of "
        "SHA-256(ASCII(prefix + decimal(i))) as an unsigned big-endian integer, ties by i. "
        "keys[i] is those 8 bytes for i, in hex."
    )
    cases = []
    for prefix, n in [("split:7:", 10), ("shuffle:7:0:", 5), ("shuffle:7:1:", 5), ("x:", 1)]:
        keys = [hashlib.sha256(f"{prefix}{i}".encode()).digest()[:8].hex() for i in range(n)]
        order = sha_order(prefix, n).tolist()
        cases.append(
            _case(f"{prefix} n={n}", {"prefix": prefix, "n": n}, {"keys": keys, "order": order})
        )
    return "Drawing by SHA-256", about, cases


def split_cases() -> tuple[str, str, list[Case]]:
    about = (
        "Train/eval split of n aligned positions (schedule version 2): n_eval, then both "
        "position lists in ascending order. Includes the rounding traps: halves round up, "
        "eval_fraction is applied as whole parts per million, at least one position stays train."
    )
    given = [
        ("worked example", 10, 7, 0.25),
        ("half rounds up", 3, 7, 0.5),
        ("0.15 of 10 is 1.5, rounds to 2", 10, 7, 0.15),
        ("a tie in parts per million (1/128 = 7812.5 ppm rounds to 7813)", 128, 1, 0.0078125),
        ("no eval", 6, 7, 0.0),
        ("one position stays train", 2, 7, 0.9),
        ("a single position", 1, 7, 0.5),
        ("the largest seed", 12, MAX_SEED, 0.3),
        ("breast cancer, 569 rows", 569, 0, 0.2),
    ]
    cases = []
    for name, n, seed, fraction in given:
        train, held_out = split_train_eval(n, seed=seed, eval_fraction=fraction, version=2)
        output = {"n_eval": len(held_out), "train": train.tolist(), "eval": held_out.tolist()}
        cases.append(_case(name, {"n": n, "seed": seed, "eval_fraction": fraction}, output))
    return "Train/eval split", about, cases


def shuffle_cases() -> tuple[str, str, list[Case]]:
    about = (
        "The 'shuffle' batch schedule (version 2): positions into the train list of length n "
        "of the batches of the given steps, in row order; one chunk of batch_size rows."
    )
    given = [
        ("worked example: step 3 straddles epochs 0 and 1", 5, 2, 7, list(range(1, 7))),
        ("a batch larger than the train list spans three epochs", 3, 7, 1, [1, 2]),
        (
            "n = 1000, batch 32: step 32 straddles epochs 0 and 1",
            1000,
            32,
            MAX_SEED,
            [1, 31, 32, 33, 1000],
        ),
    ]
    cases = []
    for name, n, batch_size, seed, steps in given:
        schedule = ShuffledBatches(n=n, batch_size=batch_size, seed=seed, version=2)
        batches = [{"step": t, "positions": schedule.batch(t).positions.tolist()} for t in steps]
        given_ = {"n": n, "batch_size": batch_size, "seed": seed, "steps": steps}
        cases.append(_case(name, given_, {"batches": batches}))
    return "The `shuffle` schedule", about, cases


def clients_cases() -> tuple[str, str, list[Case]]:
    about = (
        "The 'clients' batch schedule (version 2): clients[i] names the client of train "
        "position i. Per step: the chosen clients (ascending by UTF-8 bytes), the train "
        "positions in row order and the rows of each chunk (one chunk per chosen client)."
    )
    given: list[tuple[str, list[str], int, int, int, list[int]]] = [
        ("worked example: uneven clients", EXAMPLE_CLIENTS, 2, 4, 2, [1, 2, 3]),
        ("more clients per step than clients", ["p", "q", "p", "q", "q"], 5, 2, 0, [1, 2]),
        (
            "names sort by UTF-8 bytes, not UTF-16",
            ["\U0001f600", "\uff21", "Z", "a", "é"] * 2,
            3,
            1,
            9,
            [1, 2, 3],
        ),
        (
            "40 rows of 7 clients",
            [f"w{(i * i) % 7}" for i in range(40)],
            3,
            4,
            MAX_SEED,
            [1, 2, 50],
        ),
    ]
    cases = []
    for name, clients, per_step, batch_size, seed, steps in given:
        schedule = ClientBatches(
            clients, clients_per_step=per_step, batch_size=batch_size, seed=seed, version=2
        )
        batches = []
        for t in steps:
            batch = schedule.batch(t)
            positions = batch.positions.tolist()
            starts = [sum(batch.chunk_sizes[:k]) for k in range(len(batch.chunk_sizes))]
            chosen = [clients[positions[s]] for s in starts]
            batches.append(
                {
                    "step": t,
                    "clients": chosen,
                    "positions": positions,
                    "chunk_sizes": list(batch.chunk_sizes),
                }
            )
        given_ = {
            "clients": clients,
            "clients_per_step": per_step,
            "batch_size": batch_size,
            "seed": seed,
            "steps": steps,
        }
        cases.append(_case(name, given_, {"batches": batches}))
    return "The `clients` schedule", about, cases


def step_seed_cases() -> tuple[str, str, list[Case]]:
    about = (
        "Per-step seeds: the first 8 bytes of SHA-256(ASCII(text)), text = "
        "'{run_seed}:{step}:{purpose}', as a big-endian integer shifted right by one bit."
    )
    given = [
        (7, 3, "dropout-top"),
        (7, 3, "dropout-bottom"),
        (0, 1, "kmeans-0"),
        (0, 1, "kmeans-9"),
        (MAX_SEED, 2**63 - 1, "kmeans-0"),
        (42, 0, "evaluate-eval-3"),
    ]
    cases = []
    for seed, step, purpose in given:
        text = f"{seed}:{step}:{purpose}"
        output = {"text": text, "seed": step_seed(seed, step, purpose)}
        cases.append(_case(text, {"run_seed": seed, "step": step, "purpose": purpose}, output))
    return "Step seeds", about, cases


def batch_digest_cases() -> tuple[str, str, list[Case]]:
    about = (
        "The 8-byte digest of an ordered list of ids: the first 8 bytes of SHA-256 over, for "
        "every id in order, its length as 2 bytes big-endian then its bytes."
    )
    a, b, c = bytes(32), bytes([1]) * 32, bytes(range(32))
    given = [
        ("one key", [c]),
        ("two keys", [a, b]),
        ("the same keys in the other order", [b, a]),
        ("three keys", [a, b, c]),
        ("no id (never sent, but defined)", []),
    ]
    cases = [
        _case(name, {"ids": [k.hex() for k in ids]}, {"digest": batch_digest(ids).hex()})
        for name, ids in given
    ]
    return "Digests", about, cases


def hmac_cases() -> tuple[str, str, list[Case]]:
    about = (
        "Aligned keys: HMAC-SHA256(hex-decoded alignment_key, UTF-8 id), 32 bytes, in hex; "
        "keys in input order, then the aligned list: keys ordered by raw id as UTF-8 bytes."
    )
    given = [
        ("worked example", EXAMPLE_KEY, ["u10", "u9", "u2"]),
        ("twelve ids, one non-ASCII", EXAMPLE_KEY, EXAMPLE_IDS),
        ("another key, an empty id", "ff" * 32, ["", "a", "A", "0"]),
    ]
    cases = []
    for name, key_hex, ids in given:
        keys = hmac_ids(bytes.fromhex(key_hex), ids)
        aligned = order_by_raw_id(ids, keys, set(keys))
        output = {
            "keys": [k.hex() for k in keys],
            "aligned": [k.hex() for k in aligned],
            "aligned_ids": sorted(ids, key=lambda i: i.encode()),
        }
        cases.append(_case(name, {"alignment_key": key_hex, "ids": ids}, output))
    return "Aligned keys and the aligned list", about, cases


def _aligned_example() -> tuple[list[str], list[bytes]]:
    """The twelve example ids, their aligned list (hmac.json's second case)."""
    keys = hmac_ids(bytes.fromhex(EXAMPLE_KEY), EXAMPLE_IDS)
    aligned = order_by_raw_id(EXAMPLE_IDS, keys, set(keys))
    return sorted(EXAMPLE_IDS, key=lambda i: i.encode()), aligned


def steps_cases() -> tuple[str, str, list[Case]]:
    about = (
        "Everything together, as party B checks a step: the aligned list (hex keys, by "
        "position), the split, and per step the batch as aligned positions in row order, its "
        "chunk sizes and the digest h of the StepRequest. clients[p] (clients schedule) names "
        "the client of aligned position p."
    )
    ids, aligned = _aligned_example()
    groups = [EXAMPLE_CLIENTS[EXAMPLE_IDS.index(i)] for i in ids]  # client of each aligned id
    given: list[tuple[str, dict[str, Any]]] = [
        ("shuffle", {"kind": "shuffle"}),
        ("clients", {"kind": "clients", "clients_per_step": 2, "clients": groups}),
    ]
    cases = []
    for kind, schedule_spec in given:
        seed, fraction, batch_size, steps = 11, 0.25, 3, [1, 2, 3, 4]
        train, held_out = split_train_eval(
            len(aligned), seed=seed, eval_fraction=fraction, version=2
        )
        clients = schedule_spec.get("clients")
        schedule = make_schedule(
            n=len(train),
            batch_size=batch_size,
            seed=seed,
            clients=None if clients is None else [clients[p] for p in train.tolist()],
            clients_per_step=schedule_spec.get("clients_per_step", 1),
            version=2,
        )
        batches = []
        for t in steps:
            batch = schedule.batch(t)
            positions = train[batch.positions].tolist()
            digest = batch_digest([aligned[p] for p in positions]).hex()
            batches.append(
                {
                    "step": t,
                    "positions": positions,
                    "chunk_sizes": list(batch.chunk_sizes),
                    "digest": digest,
                }
            )
        given_ = {
            "aligned": [k.hex() for k in aligned],
            "seed": seed,
            "eval_fraction": fraction,
            "batch_size": batch_size,
            "schedule": schedule_spec,
            "steps": steps,
        }
        output = {"train": train.tolist(), "eval": held_out.tolist(), "batches": batches}
        cases.append(_case(f"{kind} schedule of the twelve example ids", given_, output))
    return "Digests", about, cases


def eval_digest_cases() -> tuple[str, str, list[Case]]:
    about = (
        "The ids digest h of an EvaluateRequest: the batch digest of the aligned keys of the "
        "split's positions ('eval' or 'train'), in ascending position order."
    )
    _, aligned = _aligned_example()
    cases = []
    for split in ("eval", "train"):
        seed, fraction = 11, 0.25
        train, held_out = split_train_eval(
            len(aligned), seed=seed, eval_fraction=fraction, version=2
        )
        positions = (held_out if split == "eval" else train).tolist()
        output = {
            "positions": positions,
            "digest": batch_digest([aligned[p] for p in positions]).hex(),
        }
        given_ = {
            "aligned": [k.hex() for k in aligned],
            "seed": seed,
            "eval_fraction": fraction,
            "split": split,
        }
        cases.append(_case(f"split={split} of the twelve example ids", given_, output))
    return "Digests", about, cases


DOWNLINK_GRAD = [
    [0.5, -0.25, 0.125, 0.0, -1.0, 2.0, -0.0625, 0.75],
    [-3.0, 1.5, 0.0, 0.0, 0.25, -0.5, 6.0, -0.125],
]
DOWNLINK_SPECS = ["float32", "float16", "bfloat16", "int8", "int4", "int2", "int1", "topk:k=3"]
DOWNLINK_SPECS += ["pq:q=4,L=2", "pq:q=2,L=3,R=2,cb=f2"]


def downlink_cases() -> tuple[str, str, list[Case]]:
    import numpy as np

    from shared import codec
    from shared.wire.downlink import DownlinkSpec

    about = (
        "One StepResponse (step 5, loss 0.5, metrics {'accuracy': 0.25}) carrying the same "
        "(2, 8) gradient in every downlink representation, at the step seed 'seed'. A decoder "
        "must turn 'message' into 'decoded' (row-major float32 values) exactly. The "
        "stochastic kinds (int4, int2) and pq draw from numpy's generators: another encoder "
        "need not reproduce their bytes, only decode them."
    )
    grad = np.array(DOWNLINK_GRAD, dtype=np.float32)
    cases = []
    for text in DOWNLINK_SPECS:
        message = codec.StepResponse(step=5, loss=0.5, metrics={"accuracy": 0.25}, grad=grad)
        data = codec.encode_step_response(message, downlink=DownlinkSpec.from_string(text), seed=7)
        decoded = codec.decode_step_response(data).grad
        given = {"downlink": text, "seed": 7, "grad": DOWNLINK_GRAD}
        output = {"bytes": len(data), "message": data.hex(), "decoded": decoded.tolist()}
        cases.append(_case(text, given, output))
    return "Compressed gradients", about, cases


def codewords_cases() -> tuple[str, str, list[Case]]:
    from shared.wire import ans

    about = (
        "A PQ chunk's (B, q) codewords in R groups of L, entropy-coded (fields 'cf' and 'ca' "
        "of the chunk). A decoder must turn 'cf' and 'ca' into 'codewords' exactly. The "
        "frequency tables are the sender's choice: another encoder need not reproduce these "
        "bytes, only decode them. 'packed_bytes' is the size of the bit-packed 'cw' they "
        "replace; a sender sends 'cf' and 'ca' only where they are smaller."
    )
    rng = np.random.default_rng(16)
    examples = {
        "L=2, skewed": ((rng.random((8, 32)) < 0.1).astype(np.int64), 1, 2),
        "L=5, R=2, codeword 4 absent": (rng.choice(4, size=(6, 8), p=[0.7, 0.1, 0.1, 0.1]), 2, 5),
        "L=1": (np.zeros((2, 3), dtype=np.int64), 1, 1),
    }
    cases = []
    for name, (codes, R, L) in examples.items():
        coded = ans.encode(codes, R, L)
        assert coded is not None
        B, q = codes.shape
        given = {"B": B, "q": q, "R": R, "L": L, "codewords": codes.tolist()}
        output = {
            "cf": coded[0].hex(),
            "ca": coded[1].hex(),
            "packed_bytes": packed_nbytes(B * q, (L - 1).bit_length()),
        }
        cases.append(_case(name, given, output))
    return "Entropy-coded codewords", about, cases


def step_reply_cases() -> tuple[str, str, list[Case]]:
    about = (
        "One StepResponse as party B encodes it under each metrics policy of a run (all, "
        "loss, none; none is what the default policy, protected, sends): the loss l (null: "
        "NaN on the wire) and metrics m it carries, and the whole message as hex. The "
        "gradient is the same in every case."
    )
    grad = np.array([[0.5, -0.25, 1.0], [-0.125, 2.0, 0.0]], dtype=np.float32)
    loss, metrics = 0.6931471805599453, {"n": 2.0, "accuracy": 0.5}
    cases = []
    for policy in METRICS_POLICIES:
        shown_loss, shown = visible_metrics(loss, metrics, PrivacyPolicy(metrics=policy))
        message = codec.StepResponse(step=7, loss=shown_loss, metrics=shown, grad=grad)
        given = {
            "metrics_policy": policy,
            "step": 7,
            "loss": loss,
            "metrics": metrics,
            "grad": grad.tolist(),
            "grad_dtype": "f4",
        }
        output = {
            "l": shown_loss if np.isfinite(shown_loss) else None,
            "m": shown,
            "message": codec.encode_step_response(message).hex(),
        }
        cases.append(_case(f"metrics={policy}", given, output))
    return "What a step reply carries", about, cases


def align_keys_cases() -> tuple[str, str, list[Case]]:
    about = (
        "The binary alignment: party A's AlignRequest for the ids of its PSI intersection "
        "(the first `prefix` bytes of each aligned key, sorted ascending as bytes, "
        "concatenated in field k), and party B's AlignReply: one bit per request key, most "
        "significant bit first, set where party B holds the id (and it has a label), then the "
        "split sizes of the kept keys. `offered` lists the ids in the request's order; "
        "`kept` the ids whose bits are set. Messages in hex."
    )
    given = [
        ("worked example", EXAMPLE_KEY, ["u10", "u9", "u2"], ["u2", "u9", "u5"], 8, 0.25),
        ("twelve ids, 16-byte prefixes", EXAMPLE_KEY, EXAMPLE_IDS, EXAMPLE_IDS[2:], 16, 0.25),
        ("whole keys", "ff" * 32, ["a", "b", "c", "d", "e"], ["b", "d", "e", "z"], 32, 0.5),
    ]
    cases = []
    for name, key_hex, a_ids, b_ids, prefix, eval_fraction in given:
        key = bytes.fromhex(key_hex)
        a_keys = hmac_ids(key, a_ids)
        request, ordered = alignkeys.request_for(a_keys, prefix)
        by_key = dict(zip(a_keys, a_ids, strict=True))
        b_keys = set(hmac_ids(key, b_ids))
        matched = alignkeys.match_prefixes(sorted(b_keys), request)
        kept = [k for k, m in zip(ordered, matched, strict=True) if m is not None]
        aligned = order_by_raw_id(a_ids, a_keys, set(kept))
        train, eval_ = split_train_eval(len(aligned), seed=0, eval_fraction=eval_fraction)
        bitmap = alignkeys.kept_bitmap(matched, set(kept))
        reply = alignkeys.AlignReply(n=request.n, kept=bitmap, train=len(train), eval=len(eval_))
        output = {
            "offered": [by_key[k] for k in ordered],
            "request": alignkeys.encode_align_request(request).hex(),
            "kept_bitmap": bitmap.hex(),
            "kept": [by_key[k] for k in kept],
            "reply": alignkeys.encode_align_reply(reply).hex(),
        }
        given_case = {
            "alignment_key": key_hex,
            "party_a_ids": a_ids,
            "party_b_ids": b_ids,
            "prefix": prefix,
            "seed": 0,
            "eval_fraction": eval_fraction,
        }
        cases.append(_case(name, given_case, output))
    return "Binary alignment", about, cases


def _chunk_json(chunk: codec.Activations) -> dict[str, Any]:
    """A chunk as the vectors write it: what a sender starts from, in JSON."""
    if isinstance(chunk, codec.RawActivations):
        return {"k": "raw", "x": chunk.activations.tolist()}
    return {"k": "pq", "cb": chunk.codebook.tolist(), "codewords": chunk.codewords.tolist()}


def requests_cases() -> tuple[str, str, list[Case]]:
    about = (
        "The messages party A sends party B (StepRequest, EvaluateRequest, PredictRequest), "
        "each from its fields to its bytes as our encoder writes them: 'v' and 't' first, "
        "then the fields in the order of section 4's tables. 'chunks' are the chunks in "
        "order: a PQ chunk's codebook 'cb' (R, L, d/q) and codewords (B, q), or a raw chunk's "
        "rows 'x' (B, d); 'dtype' is the wire dtype of the codebooks or rows, 'codewords' "
        "'packed' (cw) or 'ans' (cf and ca, where smaller). Every party B reads 'message'; a "
        "decoder must get the fields back from it exactly. Key order carries no meaning "
        "(section 1): 'reordered' is the same message with its top-level keys reversed, "
        "which party B must treat as the same message; 'digest' is the SHA-256 of the "
        "message's canonical form (section 1), the same for both."
    )
    rng = np.random.default_rng(24)
    h = bytes.fromhex("c4c6a5cddecf8358")
    pq = codec.PQActivations(
        codebook=rng.standard_normal((1, 4, 2)).astype(np.float32),
        codewords=rng.integers(0, 4, (3, 2)),
    )
    skewed = codec.PQActivations(
        codebook=rng.standard_normal((2, 2, 2)).astype(np.float32),
        codewords=(rng.random((16, 4)) < 0.1).astype(np.int64),
    )
    raw = codec.RawActivations(rng.standard_normal((2, 3)).astype(np.float32))
    second = codec.PQActivations(
        codebook=rng.standard_normal((1, 4, 2)).astype(np.float32),
        codewords=rng.integers(0, 4, (2, 2)),
    )
    examples: list[tuple[str, str, dict[str, Any], bytes]] = []
    for name, chunks, dtype, coding in [
        ("pq, one chunk, float32 codebook", (pq,), "float32", "packed"),
        ("pq, float16 codebook", (pq,), "float16", "packed"),
        ("pq, entropy-coded codewords", (skewed,), "float32", "ans"),
        ("pq, two chunks (two clients)", (pq, second), "float32", "packed"),
        ("raw float32", (raw,), "float32", "packed"),
        ("raw float16", (raw,), "float16", "packed"),
    ]:
        request = codec.StepRequest(step=7, batch_digest=h, chunks=chunks)
        data = codec.encode_step_request(
            request,
            codebook_dtype=dtype,
            activations_dtype=dtype,
            codewords=coding,  # type: ignore[arg-type]
        )
        given = {"s": 7, "h": h.hex(), "dtype": dtype, "codewords": coding}
        examples.append((f"step_req: {name}", "step_req", given | {"chunks": chunks}, data))
    evaluate = codec.EvaluateRequest(ids_digest=h, chunks=(pq, second))
    examples.append(
        (
            "eval_req: two chunks",
            "eval_req",
            {"h": h.hex(), "dtype": "float32", "codewords": "packed", "chunks": (pq, second)},
            codec.encode_evaluate_request(evaluate),
        )
    )
    ids = [k.hex() for k in hmac_ids(bytes.fromhex(EXAMPLE_KEY), ["u10", "u2", "u9"])]
    predict = codec.PredictRequest(ids=ids, chunks=(pq,))
    examples.append(
        (
            "pred_req: three ids",
            "pred_req",
            {"ids": ids, "dtype": "float32", "codewords": "packed", "chunks": (pq,)},
            codec.encode_predict_request(predict),
        )
    )
    cases = []
    for name, tag, given, data in examples:
        reordered = msgpack.packb(dict(reversed(msgpack.unpackb(data).items())))
        given = {"t": tag, **given, "chunks": [_chunk_json(c) for c in given["chunks"]]}
        output = {
            "bytes": len(data),
            "message": data.hex(),
            "reordered": reordered.hex(),
            "digest": codec.canonical_digest(data).hex(),
        }
        cases.append(_case(name, given, output))
    return "Messages", about, cases


PSI_CLIENT_KEY = bytes(range(1, 33))
PSI_SERVER_KEY = bytes(range(33, 65))


def psi_cases() -> tuple[str, str, list[Case]]:
    import private_set_intersection.python as psi_library

    from shared.psi import (
        PsiReply,
        PsiRequest,
        PsiServer,
        encode_psi_reply,
        encode_psi_request,
    )

    about = (
        "A whole private set intersection with real messages of OpenMined's PSI library "
        "(2.x, P-256, reveal_intersection, RAW set-up), under fixed secret scalars so that "
        "the bytes are reproducible: 'client_key' (party A's, 32 bytes) and 'server_key' "
        "(party B's). 'client_ids' are in the order party A blinds them (a real party A "
        "shuffles them with a cryptographic generator first). 'request', 'setup' and "
        "'response' are the library's serialized protobuf messages; 'psi_request' and "
        "'psi_reply' the msgpack messages that carry them (section 8); 'intersection' what "
        "party A computes from them. The library's own bindings (C++, Go, JavaScript, Rust, "
        "Python) build and read these; hashing to the curve by hand is not needed."
    )
    client_ids = ["u9", "u2", "x", "u10"]
    server_ids = ["u1", "u10", "u2", "u3"]
    client = psi_library.client.CreateFromKey(PSI_CLIENT_KEY, True)
    request = client.CreateRequest(client_ids).SerializeToString()
    server = PsiServer(server_ids, PSI_SERVER_KEY)
    response, _count = server.respond(request, max_ids=100)
    setup = psi_library.ServerSetup()
    setup.ParseFromString(server.setup)
    answer = psi_library.Response()
    answer.ParseFromString(response)
    found = sorted(client_ids[i] for i in client.GetIntersection(setup, answer))
    version = "0123abcd"
    given = {
        "client_key": PSI_CLIENT_KEY.hex(),
        "server_key": PSI_SERVER_KEY.hex(),
        "client_ids": client_ids,
        "server_ids": server_ids,
        "dataset_version": version,
    }
    output = {
        "request": request.hex(),
        "setup": server.setup.hex(),
        "response": response.hex(),
        "psi_request": encode_psi_request(PsiRequest(request=request)).hex(),
        "psi_reply": encode_psi_reply(
            PsiReply(dataset_version=version, setup=server.setup, response=response)
        ).hex(),
        "intersection": found,
    }
    case = _case("four ids each, two in common", given, output)
    return "Private set intersection (`/v1/psi`)", about, [case]


def parties_cases() -> tuple[str, str, list[Case]]:
    import torch

    from api_schemas import RunCreate
    from party_b.service.fusion import fuse, slices

    about = (
        "A run with several feature parties (section 12). Fusion cases: each party's z~ (rows "
        "x d_p, in the order of RunCreate.parties) and the gradient G = dL/dZ party B's top "
        "model takes at the fused input; the fused input Z party B computes, and the gradient "
        "g_p each party gets back (its columns for concat, G for sum, G / N for mean), all "
        "float32. The run case: a RunCreate with parties as a client sends it, and the config "
        "party B stores and echoes in RunOut.config (fusion, every party's downlink and the "
        "fused cut_dim filled in). The predict cut cases (section 12.8): party B's "
        "max_body_bytes, the run's batch_size, each party's cut_dim and codebook floats a "
        "chunk (R * L * cut_dim / q for PQ, 0 for raw), and a list's length; the ids a "
        "request every party sends, and the sizes of the requests the list travels in."
    )
    z = [
        [[1.0, 2.0], [3.0, 4.0]],
        [[0.5, -0.5], [0.25, -0.25]],
        [[8.0, 9.0, 10.0], [11.0, 12.0, 13.0]],
    ]
    same = [[[1.0, 2.0], [3.0, 4.0]], [[0.5, -0.5], [0.25, -0.25]], [[-1.0, 0.0], [2.0, 6.0]]]
    cases = []
    for fusion, parts in [("concat", z), ("sum", same), ("mean", same)]:
        tensors = [torch.tensor(p, dtype=torch.float32) for p in parts]
        fused = fuse(tensors, fusion)
        grad = torch.arange(fused.numel(), dtype=torch.float32).reshape(fused.shape) / 4 - 1
        widths = [t.shape[1] for t in tensors]
        given = {"fusion": fusion, "z": parts, "G": grad.tolist()}
        output = {
            "Z": fused.tolist(),
            "g": [g.tolist() for g in slices(grad, widths, fusion)],
        }
        cases.append(_case(f"three parties, {fusion}", given, output))
    spec = {
        "name": "credit",
        "model": "tabular_mlp",
        "top": {"hidden": [32]},
        "parties": [
            {"name": "telco", "cut_dim": 16, "quantizer": {"mode": "pq", "q": 4, "L": 16}},
            {
                "name": "retail",
                "cut_dim": 16,
                "quantizer": {"mode": "pq", "q": 4, "L": 16},
                "downlink": "int8",
            },
        ],
        "optimizer": {"name": "adam", "lr": 0.003},
        "batch_size": 256,
        "steps": 600,
        "seed": 0,
    }
    stored = RunCreate.model_validate(spec).model_dump(mode="json")
    cases.append(_case("a RunCreate with two parties", {"RunCreate": spec}, {"config": stored}))
    for body, parties, batch, length in [
        (65_536, [(8, 0), (64, 0)], 32, 300),  # raw activations, both parties
        (65_536, [(8, 8), (64, 64)], 32, 300),  # PQ q = 4, L = 4: R * L * d / q = 8 and 64
        (64 * 2**20, [(9216, 16), (16, 0)], 20, 10_000),  # FEMNIST's q = 1152, L = 2; raw
        (1024, [(9216, 0)], 32, 3),  # not even one id fits: one a request
    ]:
        per_request = codec.predict_ids_within(body, parties, batch)
        sizes = [min(per_request, length - at) for at in range(0, length, per_request)]
        given = {
            "max_body_bytes": body,
            "batch_size": batch,
            "parties": [{"cut_dim": d, "codebook_floats": c} for d, c in parties],
            "ids": length,
        }
        output = {"ids_per_request": per_request, "requests": sizes}
        name = f"predict cut, {body} bytes, parties {parties}, batch {batch}"
        cases.append(_case(name, given, output))
    return "Several feature parties", about, cases


# The last calls of a run with two feature parties, each list in the order party B gets them.
END_OF_RUN_ORDERS = {
    "one finishes, the other evaluates first": [
        ("left", "finish"), ("right", "evaluate"), ("right", "finish"),
        ("left", "evaluate"), ("right", "evaluate"),
    ],
    "one evaluates and waits, the other finishes": [
        ("right", "evaluate"), ("left", "finish"), ("right", "finish"),
        ("left", "evaluate"), ("right", "evaluate"),
    ],
    "both evaluate and predict, then finish": [
        ("left", "evaluate"), ("right", "evaluate"), ("left", "predict"),
        ("right", "predict"), ("right", "finish"), ("left", "finish"),
    ],
    "one finishes, the other predicts first": [
        ("left", "finish"), ("right", "predict"), ("right", "finish"),
        ("right", "predict"), ("left", "predict"),
    ],
}  # fmt: skip


# the meetings party B names these calls by (party_b.service: one split, one list of ids)
MEETING_KEYS = {
    "finish": ("finish",),
    "evaluate": ("eval", "eval", "h"),
    "predict": ("predict", "ids"),
}


def end_of_run_cases() -> tuple[str, str, list[Case]]:
    """Party B's meetings (party_b.service.meetings) fed the calls one at a time."""
    import asyncio

    from party_b.errors import ProblemError
    from party_b.service.meetings import Agenda, Meetings, Ticket

    about = (
        "The order of the last calls of a run with two feature parties (section 12.7): each "
        "case lists the calls in the order party B receives them, each call waiting (as in a "
        "meeting) until its answer; 'answers' gives, per call in that order, what it gets "
        "('ok', or the problem type with its expected_call) and after which call it is "
        "answered (its index in 'calls': a call that waits is answered when the last party's "
        "call of its meeting arrives). Every order ends with the run finished and every "
        "party's evaluation and prediction answered."
    )

    async def play(calls: list[tuple[str, str]]) -> list[dict[str, Any]]:
        meetings = Meetings()

        async def inline(fn: Callable[[], Any]) -> Any:
            return fn()

        def agenda(kind: str) -> Agenda:
            return Agenda(
                kind, ("left", "right"), lambda parts: dict.fromkeys(parts, "ok"), wait=60
            )

        tasks: list[asyncio.Task[Any]] = []
        answered_after: dict[int, int] = {}
        for i, (party, kind) in enumerate(calls):
            ticket = Ticket(MEETING_KEYS[kind], party, None, kind.encode(), agenda(kind))
            tasks.append(asyncio.ensure_future(meetings.attend("run", ticket, inline, epoch=0)))
            for _ in range(100):  # let every request run until it waits or is answered
                await asyncio.sleep(0)
            for j, task in enumerate(tasks):
                if task.done() and j not in answered_after:
                    answered_after[j] = i
        answers = []
        for j, task in enumerate(tasks):
            try:
                task.result()
                answers.append({"answer": "ok", "after_call": answered_after[j]})
            except ProblemError as problem:
                slug = problem.type.value.rsplit(":", 1)[1]
                expected = problem.extensions.get("expected_call")
                answers.append(
                    {"answer": slug, "expected_call": expected, "after_call": answered_after[j]}
                )
        return answers

    cases = []
    for name, calls in END_OF_RUN_ORDERS.items():
        answers = asyncio.run(play(calls))
        given = {"parties": ["left", "right"], "calls": [list(c) for c in calls]}
        cases.append(_case(name, given, {"answers": answers}))
    return "Recovery and the end of a run", about, cases


TOPICS: dict[str, Topic] = {
    "hmac": hmac_cases,
    "sha_order": sha_order_cases,
    "split": split_cases,
    "shuffle": shuffle_cases,
    "clients": clients_cases,
    "step_seed": step_seed_cases,
    "batch_digest": batch_digest_cases,
    "steps": steps_cases,
    "eval_digest": eval_digest_cases,
    "downlink": downlink_cases,
    "step_reply": step_reply_cases,
    "codewords": codewords_cases,
    "align_keys": align_keys_cases,
    "requests": requests_cases,
    "psi": psi_cases,
    "parties": parties_cases,
    "end_of_run": end_of_run_cases,
}
# Topics specified outside section 9 (Derived values): the part of PROTOCOL.md that holds them.
PARTS = {
    "downlink": "Messages",
    "codewords": "Codeword bit packing",
    "align_keys": "Private set intersection",
    "requests": "Envelope and messages",
    "psi": "Section 8",
    "parties": "Section 12",
    "end_of_run": "Section 12",
}


def document(topic: str) -> dict[str, Any]:
    section, about, cases = TOPICS[topic]()
    return {
        "kit": KIT,
        "format": FORMAT,
        "topic": topic,
        "spec": f"docs/PROTOCOL.md, {PARTS.get(topic, 'Derived values')}: {section}",
        "schedule_version": 2,
        "about": about,
        "cases": cases,
    }


def render(value: Any, indent: int = 0) -> str:
    """JSON with lists of plain values on one line (readable, diff-friendly), UTF-8."""
    pad = "  " * (indent + 1)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {render(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        items = [pad + render(v, indent + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    return json.dumps(value, ensure_ascii=False)


def text(topic: str) -> str:
    return render(document(topic)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for topic in TOPICS:
        path = KIT_DIR / f"{topic}.json"
        wanted = text(topic)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != wanted:
                stale.append(path.name)
        else:
            path.write_text(wanted, encoding="utf-8")
    if stale:
        print("stale:", ", ".join(stale), file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
