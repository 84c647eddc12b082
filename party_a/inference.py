"""Party A's inference: evaluate and predict on a prepared run, and the frozen serving codebook.

Serving design (docs/ARCHITECTURE.md, "Serving"): in a FedLite run, ``evaluate`` and
``predict`` quantize every activation row against one codebook, fitted on the training
samples' activations when training ends and kept here with the model step it belongs to. A
sample's codewords, and so its score, then depend on that sample alone, never on the other
samples of the request (training fits a fresh codebook per chunk, as the paper does; serving
a request that way made a score depend on its batch). The wire is unchanged: each chunk
carries the frozen codebook and its codewords.

Because a score depends on its sample alone, any number of ids can be scored in requests of
any size: ``predict_stream`` cuts the list into requests within party B's limits
(``request_bounds``: its ``max_batch``, or the size a 422 names) and yields each answer as it
comes, so neither party holds more than one request's activations and scores at a time.
"""

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from api_schemas import FeatureParty, ProblemType
from party_a.alignment import AlignedData
from party_a.bottom import BottomTrainer
from party_a.errors import ConfigError, ProblemResponse
from party_a.features import FeatureTable
from party_a.store import LocalRun, LocalStore
from party_a.transport import Transport
from shared import codec
from shared.alignment import hmac_ids
from shared.pq.frozen import codebook_from_bytes, codebook_to_bytes
from shared.schedule import batch_digest

__all__ = [
    "DEFAULT_IDS_PER_REQUEST",
    "RequestBounds",
    "RunView",
    "check_ids",
    "evaluate",
    "freeze_codebook",
    "predict",
    "predict_stream",
    "request_bounds",
    "save_codebook",
    "stored_codebook",
]

log = logging.getLogger("fedlite.party_a")


def stored_codebook(store: LocalStore, run_id: int, step: int) -> Tensor | None:
    """The frozen codebook (R, L, s) of the model at ``step``, if one was stored."""
    entry = store.serving(run_id)
    if entry is None or entry.codebook is None or entry.codebook_step != step:
        return None
    return codebook_from_bytes(entry.codebook)


def save_codebook(store: LocalStore, run_id: int, step: int, codebook: Tensor) -> None:
    entry = store.serving(run_id)
    assert entry is not None, "the transform is stored when the run is prepared"
    entry.codebook = codebook_to_bytes(codebook)
    entry.codebook_step = step
    store.save_serving(entry)


def freeze_codebook(
    store: LocalStore,
    local: LocalRun,
    bottom: BottomTrainer,
    step: int,
    train_x: np.ndarray | None,
) -> None:
    """Set ``bottom.frozen`` to the serving codebook of the model at ``step``: the stored
    one, else fitted on ``train_x`` (the transformed training samples) and stored. Nothing to
    do in a raw (SplitFed) run."""
    if not bottom.pq:
        return
    frozen = stored_codebook(store, local.id, step)
    if frozen is not None:
        bottom.frozen = frozen
        return
    if train_x is None:
        raise ConfigError(
            f"run {local.name!r} has no serving codebook for step {step} and this feature "
            "table lacks its training rows: run `fedlite-a evaluate` once with the training "
            "table (it freezes the codebook), or pass --raw"
        )
    save_codebook(store, local.id, step, bottom.freeze_codebook(train_x, step))
    log.info("froze the serving codebook at step %d", step)


@dataclass(frozen=True)
class RunView:
    """What evaluate and predict read of a prepared run (``PartyATrainer.view()``)."""

    local: LocalRun
    bottom: BottomTrainer
    store: LocalStore
    transport: Transport
    data: AlignedData
    step: int  # the bottom model's step
    batch_size: int  # rows per chunk of a request
    model: str  # the run's model name, for messages
    party: str | None  # this party's name in a run with several feature parties

    def freeze_codebook(self) -> None:
        train_x = self.data.inputs(self.data.train_pos) if len(self.data.rows) else None
        freeze_codebook(self.store, self.local, self.bottom, self.step, train_x)


def evaluate(run: RunView, split: str, *, raw: bool) -> codec.EvaluateResponse:
    """Forward the held-out (or train) samples; party B computes the metrics.

    ``raw``: send the activations unquantized (in a FedLite run, the model as it would serve
    without compression, at SplitFed's bandwidth); default: quantized against the frozen
    serving codebook.
    """
    data = run.data
    positions = data.eval_pos if split == "eval" else data.train_pos
    if len(positions) == 0:
        raise ConfigError(f"the run has no {split} samples (eval_fraction = 0?)")
    if not raw:
        run.freeze_codebook()
    chunks = run.bottom.activations(data.inputs(positions), chunk_size=run.batch_size, raw=raw)
    body = codec.encode_evaluate_request(
        codec.EvaluateRequest(
            ids_digest=batch_digest([data.aligned[p] for p in positions]), chunks=chunks
        ),
        codebook_dtype=run.bottom.codebook_dtype,
    )
    return codec.decode_evaluate_response(run.transport.evaluate(run.local.remote_id, body, split))


# ids per predict request unless party B's limit was asked for (GET /v1/psi): within every
# default party B (whose FEDLITE_B_LIMIT_MAX_BATCH is 16,384); a party B with a lower limit
# says so when refusing a request (422 limit-exceeded, limit max_batch), and the list is cut
# again at that size
DEFAULT_IDS_PER_REQUEST = 4096


@dataclass(frozen=True)
class RequestBounds:
    """How party A cuts a list of ids into predict requests."""

    ids: int  # ids per request
    body_bytes: int | None  # party B's max_body_bytes (None: not asked, or not said)


def request_bounds(run: RunView, wanted: int | None = None, *, ask: bool) -> RequestBounds:
    """Ids per predict request: ``wanted`` (``--chunk-size``), else with ``ask`` party B's
    ``max_batch`` (one ``GET /v1/psi``: the whole-table command, where fewer, larger
    requests pay for it), else ``DEFAULT_IDS_PER_REQUEST``; never more chunks of
    ``batch_size`` rows than a message may hold.

    The feature parties of a run must cut one list at the same ids, whatever each one's
    width and activations: each asks party B's limits and caps the size by the largest body
    any party's request could take (``codec.predict_ids_within`` over the run's parties,
    PROTOCOL.md 12.8), and none halves its own requests when one is too large
    (``_predict_request``)."""
    ask = ask or run.party is not None
    info = run.transport.psi_info() if ask else None
    limit = info.max_batch if info is not None else None
    bound = limit if limit is not None else DEFAULT_IDS_PER_REQUEST
    if wanted is not None:
        if wanted < 1:
            raise ConfigError(f"--chunk-size must be at least 1, got {wanted}")
        if limit is not None and wanted > limit:
            raise ConfigError(
                f"--chunk-size {wanted:,} is over party B's limit of {limit:,} ids per request "
                "(its FEDLITE_B_LIMIT_MAX_BATCH): pass at most that, or leave --chunk-size out"
            )
        bound = wanted
    ids = max(1, min(bound, run.batch_size * codec.DEFAULT_LIMITS.max_chunks))
    body_bytes = info.max_body_bytes if info is not None else None
    if run.party is not None and body_bytes is not None:
        config = run.transport.get_run(run.local.remote_id).config
        if not config.parties:
            raise ConfigError("party B's run names no feature parties: use it without --party")
        parties = [_wire_width(party) for party in config.parties]
        ids = min(ids, codec.predict_ids_within(body_bytes, parties, config.batch_size))
    return RequestBounds(ids=ids, body_bytes=body_bytes)


def _wire_width(party: FeatureParty) -> tuple[int, int]:
    """A feature party's (d, c) for ``codec.predict_ids_within``: its cut width and the
    floats of the codebook each of its chunks carries (R * L * d / q; 0 for raw)."""
    quantizer = party.quantizer
    if quantizer.mode != "pq":
        return party.cut_dim, 0
    assert quantizer.q is not None and quantizer.L is not None  # the spec's own validation
    return party.cut_dim, quantizer.R * quantizer.L * (party.cut_dim // quantizer.q)


def check_ids(features: FeatureTable, common: set[str], ids: Sequence[str]) -> dict[str, int]:
    """The feature-table row of each id; every id must be in ``features`` and in
    ``common`` (the private set intersection with party B: only ids party B is known to hold
    travel, hashed under a key party B knows)."""
    if not ids:
        raise ConfigError("no ids to score")
    index = features.index()
    unknown = [i for i in ids if i not in index]
    if unknown:
        raise ConfigError(f"{len(unknown)} ids are not in the feature table: {unknown[:5]}")
    outside = [i for i in ids if i not in common]
    if outside:
        raise ConfigError(
            f"{len(outside)} ids are not in the private set intersection with party B: "
            f"{outside[:5]}"
        )
    return index


class _TooLarge(Exception):
    """A request that needs cutting to ``size`` ids (party B's limit, or half a body)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def predict_stream(
    run: RunView,
    features: FeatureTable,
    common: set[str],
    ids: Sequence[str],
    *,
    raw: bool,
    bounds: RequestBounds,
) -> Iterator[codec.PredictResponse]:
    """Scores for ``ids`` (party A's raw ids; they travel hashed under the run key), one
    answer per request of at most ``bounds.ids`` ids, in order: memory holds one request's
    activations and answer at a time, whatever the number of ids. A request party B finds
    over its limits (422 ``limit-exceeded`` of ``max_batch``, 413) is cut to the size it
    names (half, for a body) and the rest of the list follows at that size.

    A score depends on its sample only: rows are quantized against the frozen serving
    codebook (or, with ``raw``, not at all), so how the ids are cut into requests changes
    no score.
    """
    index = check_ids(features, common, ids)
    if not raw:
        run.freeze_codebook()
    key = bytes.fromhex(run.local.alignment_key)
    size, at = bounds.ids, 0
    while at < len(ids):
        part = list(ids[at : at + size])
        try:
            yield _predict_request(run, key, [index[i] for i in part], part, raw, bounds)
        except _TooLarge as cut:
            size = cut.size
            continue
        at += len(part)


def _predict_request(
    run: RunView, key: bytes, rows: list[int], ids: list[str], raw: bool, bounds: RequestBounds
) -> codec.PredictResponse:
    """One predict request for ``ids`` (feature-table ``rows``); ``_TooLarge`` when it must
    be cut first."""
    chunks = run.bottom.activations(run.data.x[rows], chunk_size=run.batch_size, raw=raw)
    per_sample = sum(codec.chunk_rows(chunks)) // len(ids)
    if per_sample != 1:
        raise ConfigError(
            f"predict gives one score per sample, but model {run.model!r} "
            f"makes {per_sample} activation rows per sample (one per token): use evaluate for it"
        )
    body = codec.encode_predict_request(
        codec.PredictRequest(ids=[k.hex() for k in hmac_ids(key, ids)], chunks=chunks),
        codebook_dtype=run.bottom.codebook_dtype,
    )
    if bounds.body_bytes is not None and len(body) > bounds.body_bytes and len(ids) > 1:
        _cut_alone(run, f"{len(body):,} bytes, over party B's limit of {bounds.body_bytes:,}")
        raise _TooLarge(len(ids) // 2)  # raw activations of a wide cut layer: 4·d bytes a row
    try:
        answer = codec.decode_predict_response(run.transport.predict(run.local.remote_id, body))
    except ProblemResponse as refused:
        smaller = _size_named(refused, len(ids))
        if smaller is None:
            raise
        if refused.type == ProblemType.PAYLOAD_TOO_LARGE:
            _cut_alone(run, f"refused by party B as too large ({refused.detail})")
        raise _TooLarge(smaller) from None
    return codec.PredictResponse(ids=ids, scores=answer.scores)


def _cut_alone(run: RunView, why: str) -> None:
    """A party of several may not cut its request smaller on its own: the others would wait
    for ids it no longer sends. ConfigError for such a run; nothing for a run of one."""
    if run.party is not None:
        raise ConfigError(
            f"a predict request of this party is {why}: in a run with several feature "
            "parties every party must cut the list alike, so pass the same smaller "
            "--chunk-size to every party, or ask party B's operator to raise "
            "FEDLITE_B_LIMIT_MAX_BODY_BYTES"
        )


def _size_named(refused: ProblemResponse, sent: int) -> int | None:
    """The request size party B's refusal of ``sent`` ids asks for, if it asks for one."""
    if refused.type == ProblemType.LIMIT_EXCEEDED and refused.extra.get("limit") == "max_batch":
        value = refused.extra.get("value")
        if isinstance(value, int) and 1 <= value < sent:
            return value
    if refused.type == ProblemType.PAYLOAD_TOO_LARGE and sent > 1:
        return sent // 2
    return None


def predict(
    run: RunView,
    features: FeatureTable,
    common: set[str],
    ids: list[str],
    *,
    raw: bool,
) -> codec.PredictResponse:
    """Every score of ``predict_stream`` in one answer (the Python API's ``predict``)."""
    bounds = request_bounds(run, ask=False)  # with several parties, it asks
    answers = list(predict_stream(run, features, common, ids, raw=raw, bounds=bounds))
    return codec.PredictResponse(ids=list(ids), scores=np.concatenate([a.scores for a in answers]))
