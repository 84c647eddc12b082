"""Private set intersection (PSI) of sample ids: the protocol, its wire messages, both roles.

Which samples do both parties hold? Each party must learn exactly that, and nothing about the
other's ids outside it. The construction is the classic Diffie-Hellman PSI (Meadows 1986;
Huberman, Franklin and Hogg 1999), as implemented by OpenMined's PSI library (``openmined.psi``,
C++ from Google's Private Join and Compute): ids are hashed onto the NIST P-256 curve and
blinded by commutative exponentiation with each party's secret scalar::

    party A (client, secret a)                          party B (server, secret b)
    X = A's ids, in a random order
    request  = [H(x)^a for x in X]            ─────►
                                              ◄─────    setup    = sorted [H(y)^b for y in Y]
                                                        response = [(H(x)^a)^b  for x in X]
    H(x)^b = response[i]^(1/a); x ∈ Y iff H(x)^b ∈ setup

Party B's setup depends only on its ids and its key, so it is computed once per dataset
version (``dataset_version``) and reused for every request. Under the decisional
Diffie-Hellman assumption, with H a random oracle, party A cannot tell H(y)^b of an id it did
not offer from a random point, and party B sees only blinded points of party A's ids.

What each side learns (honest-but-curious): party A learns X ∩ Y and |Y|; party B learns |X|
from the request, and the intersection when party A then aligns a run on it (party A sends the
HMACs of the ids in X ∩ Y under the run key, never of any other id). Like every PSI, a party
can put guessed ids into its own input set and learn which of them the other holds: party B
bounds that by the size of one request (``max_aligned_ids``) and logs every request.

Wire messages are msgpack maps with the PSI version (``"v"``) and a type tag (``"t"``);
the PSI library's own messages travel inside them as opaque protobuf ``bin`` fields and are
parsed only by the library.

Exceptions::

    ValueError
     └── PsiError          a PSI message that is malformed or cannot be processed
          └── PsiTooLarge   a request with more ids than the server takes
"""

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack
import private_set_intersection.python as _psi
from google.protobuf.message import DecodeError

__all__ = [
    "PSI_PROTOCOL",
    "PSI_VERSION",
    "PsiClient",
    "PsiError",
    "PsiReply",
    "PsiRequest",
    "PsiServer",
    "PsiTooLarge",
    "dataset_digest",
    "decode_psi_reply",
    "decode_psi_request",
    "encode_psi_reply",
    "encode_psi_request",
    "new_server_key",
]

PSI_VERSION: Final = 1
PSI_PROTOCOL: Final = "ecdh-psi/p256/openmined-psi-2/raw"  # named in GET /v1/psi
_MAX_MESSAGE: Final = 2**32 - 1  # msgpack's largest bin


class PsiError(ValueError):
    """A PSI message that is malformed, over a limit, or that the library refuses."""


class PsiTooLarge(PsiError):
    """A request with more ids than the server's limit."""


# ============================================================================ dataset versions


def dataset_digest(ids: Sequence[str]) -> str:
    """A content hash of an id set (hex SHA-256): equal iff the sets of ids are equal.

    Each id is length-prefixed, so no two different sets share an encoding. It is never sent
    to the other party (it would let them confirm a guessed id set); it keys caches locally.
    """
    h = hashlib.sha256(b"fedlite-vfl id set v1\0")
    for i in sorted(set(ids)):
        data = i.encode("utf-8")
        h.update(len(data).to_bytes(4, "big"))
        h.update(data)
    return h.hexdigest()


# ============================================================================ wire messages


@dataclass(frozen=True)
class PsiRequest:
    """Party A -> B: the library's ``Request`` (party A's blinded ids), serialized."""

    request: bytes


@dataclass(frozen=True)
class PsiReply:
    """Party B -> A: B's dataset version, its setup (blinded ids) and the re-blinded request."""

    dataset_version: str
    setup: bytes
    response: bytes


def encode_psi_request(message: PsiRequest) -> bytes:
    return _pack({"v": PSI_VERSION, "t": "psi_request", "request": message.request})


def decode_psi_request(data: bytes) -> PsiRequest:
    fields = _unpack(data, "psi_request", {"request"})
    return PsiRequest(request=_bin(fields, "request"))


def encode_psi_reply(message: PsiReply) -> bytes:
    return _pack(
        {
            "v": PSI_VERSION,
            "t": "psi_reply",
            "dataset_version": message.dataset_version,
            "setup": message.setup,
            "response": message.response,
        }
    )


def decode_psi_reply(data: bytes) -> PsiReply:
    fields = _unpack(data, "psi_reply", {"dataset_version", "setup", "response"})
    version = fields["dataset_version"]
    if not isinstance(version, str) or not 1 <= len(version) <= 64:
        raise PsiError("dataset_version must be a string of 1 to 64 characters")
    return PsiReply(
        dataset_version=version, setup=_bin(fields, "setup"), response=_bin(fields, "response")
    )


def _pack(message: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


def _unpack(data: bytes, msg_type: str, keys: set[str]) -> dict[str, Any]:
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=_MAX_MESSAGE)
    except (ValueError, msgpack.UnpackException) as exc:
        raise PsiError(f"not a msgpack message: {exc}") from None
    if not isinstance(obj, dict):
        raise PsiError(f"expected a msgpack map, got {type(obj).__name__}")
    if obj.get("v") != PSI_VERSION:
        raise PsiError(f"unsupported PSI version {obj.get('v')!r} (this side speaks {PSI_VERSION})")
    if obj.get("t") != msg_type:
        raise PsiError(f"expected a {msg_type} message, got {obj.get('t')!r}")
    extra = set(obj) - keys - {"v", "t"}
    missing = keys - set(obj)
    if extra or missing:
        raise PsiError(f"{msg_type}: missing fields {sorted(missing)}, unknown {sorted(extra)}")
    return obj


def _bin(fields: dict[str, Any], key: str) -> bytes:
    value = fields[key]
    if not isinstance(value, bytes):
        raise PsiError(f"{key} must be msgpack bin, got {type(value).__name__}")
    return value


# ============================================================================ roles


def new_server_key() -> bytes:
    """A fresh secret scalar for party B (32 bytes; keep it with the dataset version)."""
    key: bytes = _psi.server.CreateWithNewKey(True).GetPrivateKeyBytes()
    return key


class PsiServer:
    """Party B's side for one id list under one secret key.

    ``setup`` (|Y| hash-to-curve operations and exponentiations) is computed here, once.
    """

    def __init__(self, ids: Sequence[str], key: bytes) -> None:
        self._server = _psi.server.CreateFromKey(key, True)
        # RAW: the exact set of blinded points, sorted by the library (hides party B's order).
        # No false positives, and unlike a Bloom filter it does not depend on |X|, so one
        # setup serves every request.
        setup = self._server.CreateSetupMessage(0.0, 1, list(ids), _psi.DataStructure.RAW)
        self.setup: bytes = setup.SerializeToString()
        self.size = len(ids)

    def respond(self, request: bytes, *, max_ids: int) -> tuple[bytes, int]:
        """Re-blind party A's points with this side's key, in the request's order.

        Returns the serialized response and the number of ids party A offered.
        """
        parsed = _psi.Request()
        try:
            parsed.ParseFromString(request)
        except DecodeError as exc:
            raise PsiError(f"not a PSI request: {exc}") from None
        if not parsed.reveal_intersection:
            raise PsiError("only the intersection protocol is served (reveal_intersection)")
        count = len(parsed.encrypted_elements)
        if count == 0:
            raise PsiError("the request holds no ids")
        if count > max_ids:
            raise PsiTooLarge(f"{count} ids in the request, over this server's limit {max_ids}")
        try:
            response: bytes = self._server.ProcessRequest(parsed).SerializeToString()
        except RuntimeError as exc:  # an element that is not a P-256 point
            raise PsiError(f"the request holds an invalid point: {exc}") from None
        return response, count


class PsiClient:
    """Party A's side: one request over ``ids`` with a fresh secret key."""

    def __init__(self, ids: Sequence[str]) -> None:
        self._client = _psi.client.CreateWithNewKey(True)
        # A random order: the position of a blinded id in the request says nothing about it.
        self._ids = list(dict.fromkeys(ids))
        secrets.SystemRandom().shuffle(self._ids)

    def request(self) -> bytes:
        data: bytes = self._client.CreateRequest(self._ids).SerializeToString()
        return data

    def intersection(self, setup: bytes, response: bytes) -> list[str]:
        """The ids both parties hold, sorted (raw ids, this side's own)."""
        parsed_setup = _psi.ServerSetup()
        parsed_response = _psi.Response()
        try:
            parsed_setup.ParseFromString(setup)
            parsed_response.ParseFromString(response)
        except DecodeError as exc:
            raise PsiError(f"not a PSI reply: {exc}") from None
        if len(parsed_response.encrypted_elements) != len(self._ids):
            raise PsiError(
                f"party B answered {len(parsed_response.encrypted_elements)} points "
                f"for {len(self._ids)} ids"
            )
        try:
            found = self._client.GetIntersection(parsed_setup, parsed_response)
        except RuntimeError as exc:
            raise PsiError(f"the reply holds an invalid point: {exc}") from None
        return sorted(self._ids[i] for i in found)
