"""The wire layer under every message: one envelope, one safe reader, for PSI messages too."""

import re
from pathlib import Path

import msgpack
import numpy as np
import pytest

from shared import codec
from shared.codec import CodecError, RangeError
from shared.psi import (
    PsiReply,
    PsiRequest,
    decode_psi_reply,
    decode_psi_request,
    encode_psi_reply,
    encode_psi_request,
)
from shared.wire.envelope import WIRE_VERSION, MessageType

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"


def test_every_message_type_is_in_the_protocol_document() -> None:
    text = PROTOCOL.read_text()
    table = text[: text.index("## 1. Envelope")]
    for message_type in MessageType:
        assert f"`{message_type.value}`" in table, message_type


def _vectors() -> dict[str, str]:
    """The hex test vectors of PROTOCOL.md section 8, by message name."""
    text = PROTOCOL.read_text()
    section = text[text.index("## 8. Private set intersection") :]
    return dict(re.findall(r"^\| `(Psi\w+)\(.*?\)` \| `([0-9a-f]+)` \|$", section, re.M))


def test_psi_messages_encode_to_the_documented_bytes() -> None:
    vectors = _vectors()
    request = PsiRequest(request=bytes.fromhex("0a0102"))
    reply = PsiReply(dataset_version="0123abcd", setup=b"\x0a\x00", response=b"\x12\x00")

    assert encode_psi_request(request).hex() == vectors["PsiRequest"]
    assert encode_psi_reply(reply).hex() == vectors["PsiReply"]
    assert decode_psi_request(bytes.fromhex(vectors["PsiRequest"])) == request
    assert decode_psi_reply(bytes.fromhex(vectors["PsiReply"])) == reply


def test_psi_messages_keep_the_bytes_of_the_first_psi_version() -> None:
    # before the shared envelope, PSI messages were packed as these maps: the same bytes
    old = msgpack.packb({"v": 1, "t": "psi_request", "request": b"\x01"}, use_bin_type=True)
    assert encode_psi_request(PsiRequest(request=b"\x01")) == old


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\x83\xa1v\x01\xa1v\x01\xa1t\xabpsi_request", "duplicate key"),
        (encode_psi_request(PsiRequest(request=b"\x01")) + b"\x00", "trailing bytes"),
        (msgpack.packb({"v": True, "t": "psi_request", "request": b""}), "must be an int"),
        (msgpack.packb({"v": WIRE_VERSION + 1, "t": "psi_request", "request": b""}), "version"),
        (msgpack.packb({"v": 1, "t": "psi_reply", "request": b""}), "expected message type"),
        (msgpack.packb({"v": 1, "t": "psi_request", "request": "text"}), "expected bin"),
        (msgpack.packb({"v": 1, "t": "psi_request", "request": b"", "x": 1}), "unexpected"),
        (msgpack.packb({"v": 1, "t": "psi_request"}), "missing"),
    ],
)
def test_psi_requests_are_read_by_the_safe_reader(data: bytes, fragment: str) -> None:
    with pytest.raises(CodecError, match=fragment):
        decode_psi_request(data)


def test_a_psi_reply_names_a_short_dataset_version() -> None:
    long = PsiReply(dataset_version="x" * 65, setup=b"", response=b"")
    with pytest.raises(CodecError, match="1 to 64 characters"):
        decode_psi_reply(encode_psi_reply(long))


def test_float16_overflow_is_a_range_error_and_nan_is_not() -> None:
    # a finite float32 gradient beyond float16's range can be sent wider: RangeError says so
    def response(value: float) -> codec.StepResponse:
        grad = np.full((2, 3), value, dtype=np.float32)
        return codec.StepResponse(step=1, loss=0.5, metrics={}, grad=grad)

    with pytest.raises(RangeError, match="beyond the float16 range"):
        codec.encode_step_response(response(1e5), grad_dtype="float16")
    assert codec.decode_step_response(codec.encode_step_response(response(1e5))).grad[0, 0] == 1e5
    with pytest.raises(ValueError, match="NaN or Inf") as raised:
        codec.encode_step_response(response(float("nan")), grad_dtype="float16")
    assert not isinstance(raised.value, RangeError | CodecError)
