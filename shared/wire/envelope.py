"""The envelope of every wire message: one msgpack map with the version ``"v"`` and type ``"t"``.

Training messages (``shared.codec``) and PSI messages (``shared.psi``) share it: one wire
version, one list of type tags, one reader. A decoder checks ``v`` first (so a future
version's different fields are reported as an unsupported version, not as unknown fields),
then ``t``, then that the map holds exactly the message's fields.
"""

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Final

import msgpack

from shared.types import MAX_STEP
from shared.wire.reader import CodecError, DecodeLimits, Fields, type_name, unpack_map

__all__ = ["WIRE_VERSION", "MessageType", "open_message", "pack", "peek_step"]

WIRE_VERSION: Final = 1


class MessageType(StrEnum):
    """The type tag ``t`` of every message of the protocol (docs/PROTOCOL.md)."""

    STEP_REQUEST = "step_req"
    STEP_RESPONSE = "step_res"
    EVALUATE_REQUEST = "eval_req"
    EVALUATE_RESPONSE = "eval_res"
    PREDICT_REQUEST = "pred_req"
    PREDICT_RESPONSE = "pred_res"
    PSI_REQUEST = "psi_request"
    PSI_REPLY = "psi_reply"
    ALIGN_REQUEST = "align_req"  # shared.alignkeys: a run's aligned key prefixes
    ALIGN_REPLY = "align_res"


def pack(message_type: MessageType, fields: dict[str, Any]) -> bytes:
    """The message's bytes: ``v`` and ``t`` first, then ``fields`` in their order."""
    message = {"v": WIRE_VERSION, "t": message_type.value, **fields}
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


def open_message(
    data: object,
    message_type: MessageType,
    keys: frozenset[str] | Callable[[Mapping[str, Any]], frozenset[str]],
    limits: DecodeLimits,
) -> Fields:
    """Parse one msgpack map and check its envelope: version, type tag, exact field set.

    ``keys`` may be a function of the map, for a message with alternative field sets (a
    StepResponse's gradient, original or compressed).
    """
    obj = unpack_map(data, limits)
    if "v" not in obj:
        raise CodecError("missing wire version field 'v'")
    version = obj["v"]
    if type(version) is not int:
        raise CodecError(f"wire version 'v' must be an int, got {type_name(version)}")
    if version != WIRE_VERSION:
        raise CodecError(f"unsupported wire version {version} (this codec speaks {WIRE_VERSION})")
    tag = obj.get("t")
    if type(tag) is not str:
        raise CodecError(f"message type 't' must be a str, got {type_name(tag)}")
    if tag != message_type.value:
        raise CodecError(f"expected message type {message_type.value!r}, got {tag!r}")
    expected = keys if isinstance(keys, frozenset) else keys(obj)
    return Fields(obj, message_type.value, expected | {"v", "t"})


_HEAD_BYTES = 64  # v, t and s of a StepRequest as party A packs them take under 40 bytes


def peek_step(body: bytes) -> int | None:
    """The step ``s`` of a StepRequest body from its first bytes, or None unless they hold a
    map that starts with exactly ``v`` (this wire version), ``t`` (``step_req``) and ``s``,
    in any order (``pack`` puts them first). No allocation beyond the
    head; the full decode and its 400 stay with the normal path."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True)
    unpacker.feed(body[:_HEAD_BYTES])
    head: dict[object, object] = {}
    try:
        for _ in range(min(unpacker.read_map_header(), 3)):
            key = unpacker.unpack()
            if key not in ("v", "t", "s") or key in head:
                return None
            head[key] = unpacker.unpack()
    except (msgpack.UnpackException, ValueError):
        return None  # not msgpack, not a map, or cut off within the head
    step = head.get("s")
    if head.get("v") != WIRE_VERSION or head.get("t") != MessageType.STEP_REQUEST.value:
        return None
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        return None
    return step
