"""Party A's side of sample alignment: a private set intersection with party B, cached.

``fedlite-a align`` runs it on its own; ``fedlite-a train`` runs it first (through the same
function) and then aligns its run on the result (``align_run``: party B sees HMACs of the
common ids only, and the run's samples are located in party A's feature table). The
intersection is kept in party A's state under the pair (content hash of party A's ids, party
B's dataset version), so every run and job on the same two data sets reuses it: only a changed
id set on either side starts a new PSI. See ``shared.psi`` for the protocol and what it reveals.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from api_schemas import AlignmentIn, AlignmentOut, PsiInfo
from party_a.errors import ConfigError, ProtocolError
from party_a.features import FeatureTable, FeatureTransform
from party_a.phases import phase
from party_a.store import LocalRun, LocalStore, PsiResult, RunServing
from party_a.transport import Transport
from shared.alignkeys import decode_align_reply, encode_align_request, request_for
from shared.alignment import hmac_ids, order_by_raw_id
from shared.codec import CodecError
from shared.psi import (
    PSI_PROTOCOL,
    PsiClient,
    PsiError,
    PsiReply,
    PsiRequest,
    dataset_digest,
    decode_psi_reply,
    encode_psi_request,
    psi_request_bytes,
)

__all__ = [
    "AlignedData",
    "align_run",
    "known_intersection",
    "private_intersection",
    "run_transform",
]


def private_intersection(
    ids: Sequence[str],
    *,
    transport: Transport,
    store: LocalStore,
    server: str,
    force: bool = False,
    info: PsiInfo | None = None,
) -> tuple[PsiResult, bool]:
    """The ids of ``ids`` that party B also holds, and whether the answer came from the cache.

    ``force`` runs a new PSI even when one for the same pair of id sets is cached; ``info``:
    party B's ``GET /v1/psi`` when the caller has it already.
    """
    own_version = dataset_digest(ids)
    info = info if info is not None else transport.psi_info()
    if info.protocol != PSI_PROTOCOL:
        raise ProtocolError(f"party B speaks PSI {info.protocol!r}, this side {PSI_PROTOCOL!r}")
    if not force:
        cached = store.find_psi(server, own_version, info.dataset_version)
        if cached is not None:
            phase("PSI: cached, %s ids in common", f"{len(cached.intersection):,}")
            return cached, True
    unique = list(dict.fromkeys(ids))
    if len(unique) > info.max_ids:
        raise ProtocolError(
            f"{len(unique)} ids, but party B takes at most {info.max_ids} per PSI request"
        )
    phase("PSI: %s ids here, %s at party B", f"{len(unique):,}", f"{info.size:,}")
    started = time.perf_counter()
    common, reply, wire_bytes = _one_psi(unique, transport, info)
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
            wire_bytes=wire_bytes,
            seconds=seconds,
        )
    )
    phase(
        "PSI: %s ids in common (%.1f s, %s bytes)", f"{len(common):,}", seconds, f"{wire_bytes:,}"
    )
    return result, False


def _one_psi(
    ids: list[str], transport: Transport, info: PsiInfo
) -> tuple[list[str], PsiReply, int]:
    """One PSI round trip: the common ids, party B's reply, the bytes of both messages."""
    # told before the PSI's work (about 80 us an id), from the request's exact size
    _fits_body("the PSI request", psi_request_bytes(len(ids)), len(ids), "a table", info)
    client = PsiClient(ids)
    body = encode_psi_request(PsiRequest(request=client.request()))
    try:
        raw_reply = transport.psi(body)
        reply = decode_psi_reply(raw_reply)
        common = client.intersection(reply.setup, reply.response)
    except (PsiError, CodecError) as exc:
        raise ProtocolError(f"party B's PSI reply: {exc}") from None
    return common, reply, len(body) + len(raw_reply)


def _fits_body(what: str, size: int, ids: int, of: str, info: PsiInfo) -> None:
    """ConfigError, before anything is sent, when ``what`` (``size`` bytes for ``ids`` ids)
    is over party B's ``max_body_bytes``: it names the setting, the value that would take it
    and how many ids fit (``of``: "a table", "an intersection"), since no retry and no
    smaller request can help (the PSI and the alignment travel whole)."""
    limit = info.max_body_bytes
    if limit is None or size <= limit:
        return
    raise ConfigError(
        f"{what} for {ids:,} ids is {size:,} bytes, over party B's limit of {limit:,} bytes a "
        f"request: party B's operator raises FEDLITE_B_LIMIT_MAX_BODY_BYTES to at least "
        f"{size:,}, or align {of} of at most about {int(ids * (limit / size)):,} ids"
    )


def known_intersection(
    ids: Sequence[str], *, transport: Transport, store: LocalStore, server: str
) -> PsiResult:
    """The newest intersection of this id set with party B that party A's state holds, without
    asking party B; a first PSI when there is none. For serving: a stale cache only lets ids
    travel that party B once held, and party B refuses those it no longer holds."""
    cached = store.newest_psi(server, dataset_digest(ids))
    if cached is not None:
        return cached
    return private_intersection(ids, transport=transport, store=store, server=server)[0]


@dataclass
class AlignedData:
    """A run's samples as aligned with party B, in party A's feature table.

    ``aligned`` lists the run's hashed ids (32 bytes each) in the agreed order; ``rows[i]`` is
    the feature-table row of ``aligned[i]`` (empty when serving from a table without the
    training rows); ``train_pos`` / ``eval_pos`` are positions into ``aligned``; ``x`` is the
    whole table through the run's ``transform`` (rows, features) float32.
    """

    aligned: list[bytes]
    rows: np.ndarray
    train_pos: np.ndarray
    eval_pos: np.ndarray
    x: np.ndarray
    transform: FeatureTransform

    def inputs(self, positions: np.ndarray | Sequence[int]) -> np.ndarray:
        """The transformed feature rows of these aligned positions."""
        rows: np.ndarray = self.x[self.rows[positions]]
        return rows


def align_run(
    local: LocalRun,
    *,
    features: FeatureTable,
    transport: Transport,
    store: LocalStore,
    server: str,
    split: Callable[[int], tuple[np.ndarray, np.ndarray]],
    serving: bool = False,
) -> tuple[AlignedData, AlignmentOut | None]:
    """Align ``local`` on the PSI intersection (once; party B sees HMACs of those ids only)
    and locate its samples in ``features``. ``split(n)`` gives the run's train and eval
    positions. Returns the data and party B's alignment answer when this call aligned."""
    key = bytes.fromhex(local.alignment_key)
    keys = hmac_ids(key, features.ids)
    answer = None
    if local.aligned_ids is None:
        answer = _align_at_party_b(local, features, keys, transport, store, server)
    blob = local.aligned_ids
    assert blob is not None
    aligned = [blob[i : i + 32] for i in range(0, len(blob), 32)]
    row_of = {k: row for row, k in enumerate(keys)}
    missing = [k for k in aligned if k not in row_of]
    if missing and not serving:
        raise ConfigError(f"{len(missing)} aligned ids are not in the feature table any more")
    rows = np.array([row_of[k] for k in aligned] if not missing else [], dtype=np.int64)
    train_pos, eval_pos = split(len(aligned))
    train_rows = rows[train_pos] if not missing else None
    transform = run_transform(store, local.id, features, train_rows)
    data = AlignedData(aligned, rows, train_pos, eval_pos, transform.apply(features), transform)
    return data, answer


def _align_at_party_b(
    local: LocalRun,
    features: FeatureTable,
    keys: list[bytes],
    transport: Transport,
    store: LocalStore,
    server: str,
) -> AlignmentOut:
    key = bytes.fromhex(local.alignment_key)
    info = transport.psi_info()
    psi, cached = private_intersection(
        features.ids, transport=transport, store=store, server=server, info=info
    )
    offered = hmac_ids(key, psi.intersection)
    if not offered:
        raise ConfigError("party A and party B hold no sample id in common")
    phase("aligning the run on %s ids", f"{len(offered):,}")
    started = time.perf_counter()
    if "keys" in info.alignment_formats:
        answer, traffic = _align_keys(local.remote_id, offered, transport, info)
    else:  # a party B from before the binary alignment, or a feature party of several
        answer, traffic = _align_json(local.remote_id, offered, transport, info)
    # what travels is counted: the bodies as HttpTransport sends and receives them, plus the
    # PSI messages when this run's alignment is the one that ran the PSI
    traffic += 0 if cached else psi.wire_bytes
    common = {bytes.fromhex(h) for h in answer.intersection}
    if not common <= set(offered):
        raise ProtocolError("party B aligned the run on ids party A did not offer")
    aligned = b"".join(order_by_raw_id(features.ids, keys, common))
    store.update_run(local.id, alignment_bytes=traffic, aligned_ids=aligned)
    local.alignment_bytes = traffic
    local.aligned_ids = aligned
    phase(
        "aligned: %s samples, %s train, %s eval (%.1f s)",
        f"{len(common):,}",
        f"{answer.train:,}",
        f"{answer.eval:,}",
        time.perf_counter() - started,
    )
    return answer


def _align_json(
    run_id: str, offered: list[bytes], transport: Transport, info: PsiInfo
) -> tuple[AlignmentOut, int]:
    """The JSON alignment (hex keys both ways); the answer and the bytes of both bodies."""
    request = AlignmentIn(hashed_ids=[k.hex() for k in offered])
    # {"hashed_ids":["<64 hex>",...]}: 67 bytes a key and 16 around them
    size = 67 * len(offered) + 16
    _fits_body("the alignment", size, len(offered), "an intersection", info)
    answer = transport.align(run_id, request.hashed_ids)
    return answer, len(request.model_dump_json()) + len(answer.model_dump_json())


def _align_keys(
    run_id: str, offered: list[bytes], transport: Transport, info: PsiInfo
) -> tuple[AlignmentOut, int]:
    """The binary alignment (shared.alignkeys): key prefixes up, a bitmap back."""
    request, ordered = request_for(offered)
    body = encode_align_request(request)
    _fits_body("the alignment", len(body), len(offered), "an intersection", info)
    raw = transport.align_keys(run_id, body)
    try:
        reply = decode_align_reply(raw)
    except CodecError as exc:
        raise ProtocolError(f"party B's alignment reply: {exc}") from None
    if reply.n != request.n:
        raise ProtocolError(f"party B answered for {reply.n} keys, party A sent {request.n}")
    kept = [k for k, ok in zip(ordered, reply.mask().tolist(), strict=True) if ok]
    answer = AlignmentOut(intersection=[k.hex() for k in kept], train=reply.train, eval=reply.eval)
    return answer, len(body) + len(raw)


def run_transform(
    store: LocalStore, run_id: int, features: FeatureTable, train_rows: np.ndarray | None
) -> FeatureTransform:
    """The run's transform: the stored one, else fitted on ``train_rows`` of ``features``
    (feature-table rows of the run's training samples) and stored.

    A run that has checkpoints but no stored transform was begun by a release that z-scored
    the whole table: it gets that transform back (all rows), so that it resumes, evaluates
    and serves as it was trained.
    """
    entry = store.serving(run_id)
    if entry is not None:
        return FeatureTransform.from_json(entry.transform)
    if store.checkpoint_steps(run_id) and train_rows is not None:
        train_rows = np.arange(len(features.ids))
    if train_rows is None:
        raise ConfigError(
            "this run has no stored feature transform and the feature table does not hold "
            "its training rows: run `fedlite-a train` (or evaluate) with the training table"
        )
    transform = FeatureTransform.fit(features, train_rows)
    store.save_serving(RunServing(run_id=run_id, transform=transform.to_json()))
    return transform
