"""Party A's side of sample alignment: a private set intersection with party B, cached.

``fedlite-a align`` runs it on its own; ``fedlite-a train`` runs it first (through the same
function) and then aligns its run on the result. The intersection is kept in party A's state
under the pair (content hash of party A's ids, party B's dataset version), so every run and
job on the same two data sets reuses it: only a changed id set on either side starts a new
PSI. See ``shared.psi`` for the protocol and what it reveals.
"""

import logging
import time
from collections.abc import Sequence

from party_a.client import Transport
from party_a.errors import ProtocolError
from party_a.state import LocalStore, PsiResult
from shared.codec import CodecError
from shared.psi import (
    PSI_PROTOCOL,
    PsiClient,
    PsiError,
    PsiRequest,
    dataset_digest,
    decode_psi_reply,
    encode_psi_request,
)

__all__ = ["private_intersection"]

log = logging.getLogger("fedlite.party_a")


def private_intersection(
    ids: Sequence[str],
    *,
    transport: Transport,
    store: LocalStore,
    server: str,
    force: bool = False,
) -> tuple[PsiResult, bool]:
    """The ids of ``ids`` that party B also holds, and whether the answer came from the cache.

    ``force`` runs a new PSI even when one for the same pair of id sets is cached.
    """
    own_version = dataset_digest(ids)
    info = transport.psi_info()
    if info.protocol != PSI_PROTOCOL:
        raise ProtocolError(f"party B speaks PSI {info.protocol!r}, this side {PSI_PROTOCOL!r}")
    if not force:
        cached = store.find_psi(server, own_version, info.dataset_version)
        if cached is not None:
            return cached, True
    unique = list(dict.fromkeys(ids))
    if len(unique) > info.max_ids:
        raise ProtocolError(
            f"{len(unique)} ids, but party B takes at most {info.max_ids} per PSI request"
        )
    started = time.perf_counter()
    client = PsiClient(unique)
    body = encode_psi_request(PsiRequest(request=client.request()))
    try:
        raw_reply = transport.psi(body)
        reply = decode_psi_reply(raw_reply)
        common = client.intersection(reply.setup, reply.response)
    except (PsiError, CodecError) as exc:
        raise ProtocolError(f"party B's PSI reply: {exc}") from None
    seconds = time.perf_counter() - started
    # The reply names the id set it was computed on; it wins if party B changed meanwhile.
    result = store.save_psi(
        PsiResult(
            server=server,
            own_version=own_version,
            peer_version=reply.dataset_version,
            own_size=len(unique),
            peer_size=info.size,
            intersection=common,
            wire_bytes=len(body) + len(raw_reply),
            seconds=seconds,
        )
    )
    log.info(
        "PSI with party B: %d of our %d ids in common (party B holds %d), %.1f s",
        len(common),
        len(unique),
        info.size,
        seconds,
    )
    return result, False
