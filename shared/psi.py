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

Wire messages use the envelope of every other message (``shared.wire.envelope``: one msgpack
map with the wire version ``"v"`` and a type tag ``"t"``) and its safe reader; the PSI
library's own messages travel inside them as opaque protobuf ``bin`` fields and are parsed
only by the library.

Exceptions::

    ValueError
     ├── CodecError        (shared.wire) a PSI message that is not well-formed msgpack
     └── PsiError          a PSI message the library cannot process (not points, ...)
          └── PsiTooLarge   a request with more ids than the server takes
"""

import hashlib
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import private_set_intersection.python as _psi
from google.protobuf.message import DecodeError

from shared.wire.envelope import MessageType, open_message, pack
from shared.wire.reader import DEFAULT_LIMITS, DecodeLimits

__all__ = [
    "PSI_PROTOCOL",
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
    "psi_request_bytes",
]

PSI_PROTOCOL: Final = "ecdh-psi/p256/openmined-psi-2/raw"  # named in GET /v1/psi
_MAX_VERSION_CHARS: Final = 64  # a dataset version is a short public name


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
    return pack(MessageType.PSI_REQUEST, {"request": message.request})


def psi_request_bytes(ids: int) -> int:
    """The exact size of the encoded PsiRequest for ``ids`` distinct ids, known before the
    PSI's work: the library's protobuf carries each blinded id as a compressed P-256 point
    (33 bytes) behind its field tag and length (2), then the reveal_intersection flag (2);
    the envelope wraps it in a msgpack bin, whose header grows with its length."""
    inner = 35 * ids + 2
    header = 2 if inner < 1 << 8 else 3 if inner < 1 << 16 else 5
    return len(encode_psi_request(PsiRequest(request=b""))) - 2 + header + inner


def decode_psi_request(data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> PsiRequest:
    """Parse a PsiRequest; raises ``CodecError`` (from ``shared.wire``) for any malformed input."""
    f = open_message(data, MessageType.PSI_REQUEST, frozenset({"request"}), limits)
    return PsiRequest(request=f.get_bin("request"))


def encode_psi_reply(message: PsiReply) -> bytes:
    return pack(
        MessageType.PSI_REPLY,
        {
            "dataset_version": message.dataset_version,
            "setup": message.setup,
            "response": message.response,
        },
    )


def decode_psi_reply(data: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> PsiReply:
    """Parse a PsiReply; raises ``CodecError`` (from ``shared.wire``) for any malformed input."""
    keys = frozenset({"dataset_version", "setup", "response"})
    f = open_message(data, MessageType.PSI_REPLY, keys, limits)
    return PsiReply(
        dataset_version=f.get_str("dataset_version", max_chars=_MAX_VERSION_CHARS),
        setup=f.get_bin("setup"),
        response=f.get_bin("response"),
    )


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
        # The library's server object is not thread-safe: two requests processed at once on
        # it crash the process (SIGFPE / abort inside the C++ code). Party B answers requests
        # from several worker threads, so they take turns on it.
        self._lock = threading.Lock()
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
            with self._lock:
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
