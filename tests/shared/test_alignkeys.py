"""The binary alignment's messages (shared.alignkeys, docs/PROTOCOL.md 8.1): round trips,
every malformed form refused as a CodecError, and prefixes that two ids share refused."""

import os

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.alignkeys import (
    AlignReply,
    AlignRequest,
    AmbiguousPrefix,
    decode_align_reply,
    decode_align_request,
    encode_align_reply,
    encode_align_request,
    kept_bitmap,
    match_prefixes,
    request_for,
)
from shared.codec import CodecError


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 300),
    prefix=st.integers(8, 32),
    held=st.floats(0, 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_party_b_keeps_exactly_the_keys_it_holds(
    n: int, prefix: int, held: float, seed: int
) -> None:
    rng = __import__("random").Random(seed)
    keys = [rng.randbytes(32) for _ in range(n)]
    theirs = [k for k in keys if rng.random() < held] + [rng.randbytes(32) for _ in range(5)]

    request, ordered = request_for(keys, prefix)
    decoded = decode_align_request(encode_align_request(request))
    matched = match_prefixes(theirs, decoded)
    kept = {m for m in matched if m is not None}
    bitmap = kept_bitmap(matched, kept)
    reply = decode_align_reply(
        encode_align_reply(AlignReply(n=decoded.n, kept=bitmap, train=len(kept), eval=0))
    )

    assert decoded == request and decoded.n == n
    assert len(encode_align_request(request)) <= n * prefix + 32  # the keys and a few headers
    assert {k for k, ok in zip(ordered, reply.mask(), strict=True) if ok} == set(keys) & set(theirs)


def _message(**fields: object) -> bytes:
    return msgpack.packb({"v": 1, **fields}, use_bin_type=True)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (_message(t="align_req", p=8, k=b"\x01" * 8 + b"\x00" * 8), "ascending"),
        (_message(t="align_req", p=8, k=b"\x01" * 16), "twice"),
        (_message(t="align_req", p=8, k=b"\x01" * 12), "multiple of the prefix"),
        (_message(t="align_req", p=8, k=b""), "multiple of the prefix"),
        (_message(t="align_req", p=4, k=b"\x01" * 8), "align_req.p"),
        (_message(t="align_req", p=40, k=b"\x01" * 40), "align_req.p"),
        (_message(t="align_req", p=True, k=b"\x01" * 8), "align_req.p"),
        (_message(t="align_req", p=8, k="01234567"), "align_req.k"),
        (_message(t="align_req", p=8), "missing"),
        (_message(t="align_req", p=8, k=b"\x01" * 8, x=1), "unexpected"),
        (_message(t="psi_request", request=b""), "type"),
    ],
)
def test_a_malformed_request_is_a_codec_error(body: bytes, says: str) -> None:
    with pytest.raises(CodecError, match=says):
        decode_align_request(body)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"n": 9, "m": b"\xff", "train": 8, "eval": 0}, "2 bytes"),
        ({"n": 3, "m": b"\xf0", "train": 4, "eval": 0}, "padding"),
        ({"n": 3, "m": b"\xe0", "train": 2, "eval": 0}, "3 kept"),
        ({"n": 0, "m": b"", "train": 0, "eval": 0}, "align_res.n"),
    ],
)
def test_a_malformed_reply_is_a_codec_error(fields: dict[str, object], says: str) -> None:
    with pytest.raises(CodecError, match=says):
        decode_align_reply(_message(t="align_res", **fields))


def test_a_prefix_two_of_party_bs_ids_share_is_refused_not_guessed() -> None:
    shared_head = os.urandom(8)
    twins = [shared_head + os.urandom(24), shared_head + os.urandom(24)]
    request, _ = request_for([twins[0], os.urandom(32)], prefix=8)
    with pytest.raises(AmbiguousPrefix, match="longer prefixes"):
        match_prefixes([*twins, os.urandom(32)], request)
    # the same ids are told apart by longer prefixes
    longer, _ = request_for([twins[0]], prefix=16)
    assert match_prefixes(twins, longer) == [twins[0]]
    # a shared prefix that nobody offered does not matter
    other, _ = request_for([os.urandom(32)], prefix=8)
    assert match_prefixes(twins, other) == [None]


def test_the_request_is_canonical() -> None:
    keys = [os.urandom(32) for _ in range(50)]
    assert (
        request_for(keys)[0]
        == request_for(list(reversed(keys)))[0]
        == AlignRequest(prefix=16, keys=b"".join(sorted(k[:16] for k in keys)))
    )
