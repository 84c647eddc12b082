"""The envelope of every wire message: one msgpack map with the version ``"v"`` and type ``"t"``.

Training messages (``shared.codec``) and PSI messages (``shared.psi``) share it: one wire
version, one list of type tags, one reader. A decoder checks ``v`` first (so a future
version's different fields are reported as an unsupported version, not as unknown fields),
then ``t``, then that the map holds exactly the message's fields.
"""

import hashlib
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


# Bytes after the type byte of each fixed-size msgpack item: ints, floats, nil, booleans.
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FIXED |= {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin, str: length bytes
_DEPTH = 8  # a StepRequest nests 3 deep (map -> chunks -> chunk); deeper is not one
# Items walked at most to find v, t and s: a StepRequest of 4,096 chunks (the decoder's
# max_chunks) written with its chunks first is about 100,000. Past it, the body is not
# peeked at (it is decoded the normal way, in a worker thread, with the decoder's limits).
_BUDGET = 1 << 17


class _Walk:
    """Skips msgpack items by their headers alone: no value is built, nothing is copied."""

    def __init__(self, body: memoryview) -> None:
        self.body = body
        self.budget = _BUDGET

    def skip(self, at: int, depth: int = 1) -> int:
        """The offset just past the item at ``at``. ValueError for what has no place in a
        well-formed message (ext types, the unused byte 0xc1, nesting past ``_DEPTH``), a
        cut-off item, or a walk over budget."""
        self.budget -= 1
        if depth > _DEPTH or at >= len(self.body) or self.budget < 0:
            raise ValueError("too deep, cut off or too long to peek at")
        head = self.body[at]
        at += 1
        if head <= 0x7F or head >= 0xE0:
            return at  # fixint
        if 0xA0 <= head <= 0xBF:
            return at + (head & 0x1F)  # fixstr
        if head in _FIXED:
            return at + _FIXED[head]
        if head in _SIZED:
            width = _SIZED[head]
            return at + width + self.number(at, width)
        if 0x80 <= head <= 0x9F:  # fixmap, fixarray
            items = (head & 0x0F) * (2 if head < 0x90 else 1)
        elif head in (0xDC, 0xDD, 0xDE, 0xDF):  # array16/32, map16/32
            width = 2 if head in (0xDC, 0xDE) else 4
            items = self.number(at, width) * (2 if head >= 0xDE else 1)
            at += width
        else:
            raise ValueError(f"msgpack type byte {head:#x} has no place in a message")
        for _ in range(items):
            at = self.skip(at, depth + 1)
        return at

    def number(self, at: int, width: int) -> int:
        if at + width > len(self.body):
            raise ValueError("cut off")
        return int.from_bytes(self.body[at : at + width], "big")

    def small(self, start: int, end: int) -> object:
        """The item in [start, end) if it is short (a key, a version, a step), else None."""
        return msgpack.unpackb(self.body[start:end], raw=False) if end - start <= 16 else None


def peek_step(body: bytes) -> int | None:
    """The step ``s`` of a StepRequest body, read without decoding it: the entries of its
    top-level map are walked (values skipped by their headers) until ``v``, ``t`` and ``s``
    are found, in whatever order the sender wrote them (the order of a map's keys carries
    no meaning, docs/PROTOCOL.md section 1). None unless the body is a map whose ``v`` is
    this wire version, ``t`` is ``step_req`` and ``s`` a step number; the full decode (and
    its 400 for a malformed body) stays with the normal path."""
    walk = _Walk(memoryview(body))
    found: dict[object, object] = {}
    try:
        head = walk.body[0] if body else 0
        if 0x80 <= head <= 0x8F:
            entries, at = head & 0x0F, 1
        elif head in (0xDE, 0xDF):
            width = 2 if head == 0xDE else 4
            entries, at = walk.number(1, width), 1 + width
        else:
            return None  # not a map
        for _ in range(entries):
            key_end = walk.skip(at)
            value_end = walk.skip(key_end)
            key = walk.small(at, key_end)
            if key in ("v", "t", "s"):
                if key in found:
                    return None  # a repeated key: the decoder refuses the body
                found[key] = walk.small(key_end, value_end)
                if len(found) == 3:
                    break
            at = value_end
    except (msgpack.UnpackException, ValueError):
        return None
    step = found.get("s")
    if found.get("v") != WIRE_VERSION or found.get("t") != MessageType.STEP_REQUEST.value:
        return None
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        return None
    return step


def canonical_digest(body: bytes) -> bytes:
    """SHA-256 of a message's canonical form (docs/PROTOCOL.md section 1): its msgpack value
    written again with every map's keys in ascending order (by their UTF-8 bytes), integers
    in their shortest form and floats as float64. Two bodies are the same message exactly
    when their canonical digests are equal: the same fields, in any key order. ``body`` has
    passed its decoder already (the bounds are that decoder's)."""
    value = msgpack.unpackb(
        body, raw=False, strict_map_key=True, object_pairs_hook=_sorted_map, use_list=True
    )
    return hashlib.sha256(msgpack.packb(value, use_bin_type=True)).digest()


def _sorted_map(pairs: list[tuple[str, object]]) -> dict[str, object]:
    return dict(sorted(pairs, key=lambda pair: pair[0].encode()))
