"""Codewords at their empirical entropy (shared/wire/ans.py, docs/PROTOCOL.md 3.1): exact round
trips, the fallback to bit-packing, hostile tables and streams refused, and a run whose step
requests carry rANS-coded codewords training bit-identically to one with bit-packed ones."""

from pathlib import Path

import msgpack
import numpy as np
import pytest

from party_a.errors import problem_from_body
from party_a.features import load_features
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.labels import load_label_table
from shared.codec import (
    CodecError,
    PQActivations,
    StepRequest,
    decode_step_request,
    encode_step_request,
)
from shared.demo_data import write_party_a_demo, write_party_b_demo
from shared.wire import ans
from shared.wire.bitpack import packed_nbytes
from tests.utils.party_a import breast_config


def _skewed(B: int, q: int, L: int, seed: int, absent: int | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weights = rng.random(L) ** 4
    if absent is not None:
        weights[absent] = 0
    return rng.choice(L, size=(B, q), p=weights / weights.sum()).astype(np.int64)


@pytest.mark.parametrize(
    ("B", "q", "R", "L"),
    [(20, 1152, 1, 2), (20, 288, 1, 16), (7, 12, 3, 5), (64, 12, 1, 30), (4, 6, 2, 1)],
)
def test_codewords_round_trip_exactly(B: int, q: int, R: int, L: int) -> None:
    codes = _skewed(B, q, L, seed=B + q, absent=L - 1 if L > 2 else None)
    coded = ans.encode(codes, R, L)
    assert coded is not None
    table, stream = coded
    assert len(table) == 2 * R * L
    freq = np.frombuffer(table, dtype="<u2").reshape(R, L)
    assert (freq.astype(np.int64).sum(axis=1) == 1 << ans.SCALE_BITS).all()
    assert np.array_equal(ans.decode(table, stream, B, q, R, L), codes)


def test_a_skewed_chunk_shrinks_and_a_small_or_flat_one_stays_packed() -> None:
    rng = np.random.default_rng(0)
    skewed = (rng.random((20, 1152)) < 0.1).astype(np.int64)  # ~0.47 bits of entropy
    table, stream = ans.smaller_than_packed(skewed, 1, 2) or (b"", b"")
    assert 0 < len(table) + len(stream) < 0.55 * packed_nbytes(20 * 1152, 1)
    flat = rng.integers(0, 16, size=(20, 288))  # 4 bits of entropy: nothing to gain
    assert ans.smaller_than_packed(flat, 1, 16) is None
    assert ans.smaller_than_packed(np.zeros((2, 4), dtype=np.int64), 1, 4) is None  # tiny


def _request(codes: np.ndarray, R: int, L: int, coding: str) -> bytes:
    codebook = np.arange(R * L * 2, dtype=np.float32).reshape(R, L, 2)
    chunk = PQActivations(codebook=codebook, codewords=codes)
    message = StepRequest(step=3, batch_digest=bytes(8), chunks=[chunk, chunk])
    return encode_step_request(message, codewords=coding)  # type: ignore[arg-type]


def test_a_step_request_with_coded_codewords_decodes_to_the_same_message() -> None:
    codes = (np.random.default_rng(1).random((20, 576)) < 0.05).astype(np.int64)
    packed, coded = _request(codes, 2, 2, "packed"), _request(codes, 2, 2, "ans")
    assert len(coded) < len(packed) / 2
    chunk = msgpack.unpackb(coded)["a"][0]
    assert {"cf", "ca"} <= chunk.keys() and "cw" not in chunk
    for body in (packed, coded):
        decoded = decode_step_request(body)
        for c in decoded.chunks:
            assert isinstance(c, PQActivations) and np.array_equal(c.codewords, codes)
    # where coding does not pay, the chunk is bit-packed as before, byte for byte
    flat = np.random.default_rng(2).integers(0, 4, size=(20, 576))
    assert _request(flat, 2, 4, "ans") == _request(flat, 2, 4, "packed")


def _mutated(body: bytes, change: dict[str, object]) -> bytes:
    message = msgpack.unpackb(body)
    message["a"][0].update(change)
    message["a"][0] = {k: v for k, v in message["a"][0].items() if v is not None}
    packed: bytes = msgpack.packb(message, use_bin_type=True)
    return packed


def test_hostile_tables_and_streams_are_codec_errors() -> None:
    codes = (np.random.default_rng(3).random((20, 576)) < 0.05).astype(np.int64)
    body = _request(codes, 2, 2, "ans")
    chunk = msgpack.unpackb(body)["a"][0]
    table, stream = chunk["cf"], chunk["ca"]
    bad_sum = np.frombuffer(table, dtype="<u2").copy()
    bad_sum[0] += 1
    cases = {
        "sum": {"cf": bad_sum.astype("<u2").tobytes()},
        "table length": {"cf": table[:-2]},
        "truncated": {"ca": stream[:-1]},
        "trailing byte": {"ca": stream + b"\x00"},
        "flipped state": {"ca": bytes([stream[0] ^ 0x40]) + stream[1:]},
        "empty": {"ca": b""},
        "both forms": {"cw": bytes(packed_nbytes(20 * 576, 1))},
        "table only": {"ca": None},
    }
    for name, change in cases.items():
        with pytest.raises(CodecError):
            decode_step_request(_mutated(body, change))
            pytest.fail(f"accepted: {name}")


def _train(tmp_path: Path, coding: str) -> tuple[str, int]:
    """12 steps of the breast run at q = 32, L = 2 through party B in process."""
    features = write_party_a_demo(tmp_path / "features.csv", overlap=0.9)
    labels = write_party_b_demo(tmp_path / "labels.csv", overlap=0.9)
    table = load_label_table(labels, id_column="id", label_column="y", feature_columns=None)
    service, caller = in_process_party_b(table, tmp_path / "b.sqlite")
    overrides = {"run.steps": 12, "quantizer.q": 32, "quantizer.L": 2}
    trainer = PartyATrainer(
        config=breast_config("ans", **overrides, **{"quantizer.codewords": coding}),
        features=load_features(features, id_column="id", feature_columns=None, standardize=True),
        transport=InProcessTransport(service, caller, problem=problem_from_body),
        store=LocalStore.in_directory(tmp_path / "a-state"),
        server="in-process",
    )
    trainer.prepare()
    summary = trainer.train()
    sha = trainer.transport.get_run(trainer.run_id).model_sha256
    trainer.close()
    assert sha is not None
    return sha, summary.bytes_sent


def test_a_run_with_coded_codewords_trains_bit_identically(tmp_path: Path) -> None:
    packed_sha, packed_bytes = _train(tmp_path / "packed", "packed")
    coded_sha, coded_bytes = _train(tmp_path / "ans", "ans")
    assert coded_sha == packed_sha
    assert coded_bytes < packed_bytes  # q = 32, L = 2 on breast: 2,087 B against 2,508
