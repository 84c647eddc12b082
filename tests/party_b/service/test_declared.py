"""Which limit a refused body broke (``party_b.service.declared``): read from what the body
declares, named with its ``FEDLITE_B_LIMIT_*`` setting; a body that is merely malformed,
or within every limit, names none."""

import numpy as np
import pytest

from party_b.service.declared import declared, over_limit
from shared import codec

LIMITS = codec.DecodeLimits(max_batch=8, max_dim=16, max_q=4, max_L=4, max_chunks=3)


def _raw(rows: int, d: int = 4) -> codec.RawActivations:
    return codec.RawActivations(np.zeros((rows, d), dtype=np.float32))


def _predict(ids: int, *chunks: codec.Activations) -> bytes:
    return codec.encode_predict_request(
        codec.PredictRequest(ids=["0" * 64] * ids, chunks=chunks or (_raw(ids),))
    )


@pytest.mark.parametrize(
    ("body", "limit", "named"),
    [
        (_predict(9), "max_batch", "9 ids in one request"),
        (_predict(6, _raw(2), _raw(2), _raw(1), _raw(1)), "max_chunks", "4 activation chunks"),
        (_predict(1, _raw(1, d=17)), "max_dim", "activation width d = 17"),
    ],
)
def test_a_body_over_a_limit_names_the_limit_and_its_setting(
    body: bytes, limit: str, named: str
) -> None:
    found = over_limit(body, LIMITS)

    assert found is not None
    assert found[0] == limit
    assert named in found[1]
    if limit != "max_chunks":  # the protocol's own bound has no setting
        assert f"FEDLITE_B_LIMIT_{limit.upper()}" in found[1]
    with pytest.raises(codec.CodecError):  # the codec refuses every one of them
        codec.decode_predict_request(body, limits=LIMITS)


def test_rows_over_the_limit_are_counted_over_every_chunk() -> None:
    body = codec.encode_step_request(
        codec.StepRequest(step=1, batch_digest=bytes(8), chunks=(_raw(5), _raw(5)))
    )

    found = over_limit(body, LIMITS)

    assert found is not None and found[0] == "max_batch"
    assert "10 activation rows" in found[1]


def test_quantizer_sizes_are_read_from_pq_chunks() -> None:
    chunk = codec.PQActivations(
        codebook=np.zeros((1, 8, 1), dtype=np.float32), codewords=np.zeros((2, 4), dtype=np.int64)
    )
    body = _predict(2, chunk)

    assert declared(body) is not None
    found = over_limit(body, LIMITS)
    assert found is not None and found[0] == "max_L"


@pytest.mark.parametrize("body", [b"", b"\xc1", b"\x91\x01", _predict(2)[:-3]])
def test_a_body_within_the_limits_or_unreadable_names_none(body: bytes) -> None:
    assert over_limit(body, LIMITS) is None
