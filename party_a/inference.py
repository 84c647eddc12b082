"""Party A's inference: evaluate and predict on a prepared run, and the frozen serving codebook.

Serving design (docs/ARCHITECTURE.md, "Serving"): in a FedLite run, ``evaluate`` and
``predict`` quantize every activation row against one codebook, fitted on the training
samples' activations when training ends and kept here with the model step it belongs to. A
sample's codewords, and so its score, then depend on that sample alone, never on the other
samples of the request (training fits a fresh codebook per chunk, as the paper does; serving
a request that way made a score depend on its batch). The wire is unchanged: each chunk
carries the frozen codebook and its codewords.
"""

import logging
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from party_a.alignment import AlignedData
from party_a.bottom import BottomTrainer
from party_a.errors import ConfigError
from party_a.features import FeatureTable
from party_a.store import LocalRun, LocalStore
from party_a.transport import Transport
from shared import codec
from shared.alignment import hmac_ids
from shared.pq.frozen import codebook_from_bytes, codebook_to_bytes
from shared.schedule import batch_digest

__all__ = ["RunView", "evaluate", "freeze_codebook", "predict", "save_codebook", "stored_codebook"]

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


def predict(
    run: RunView, features: FeatureTable, common: set[str], ids: list[str], *, raw: bool
) -> codec.PredictResponse:
    """Scores for ``ids`` (party A's raw ids; they travel hashed under the run key).

    Every id must be in ``features`` and in ``common``, the private set intersection with
    party B. A score depends on its sample only: rows are quantized against the frozen
    serving codebook (or, with ``raw``, not at all).
    """
    index = features.index()
    unknown = [i for i in ids if i not in index]
    if unknown:
        raise ConfigError(f"{len(unknown)} ids are not in the feature table: {unknown[:5]}")
    # Only ids party B is known to hold travel, hashed under a key party B knows.
    outside = [i for i in ids if i not in common]
    if outside:
        raise ConfigError(
            f"{len(outside)} ids are not in the private set intersection with party B: "
            f"{outside[:5]}"
        )
    keys = hmac_ids(bytes.fromhex(run.local.alignment_key), ids)
    if not raw:
        run.freeze_codebook()
    x = run.data.x[[index[i] for i in ids]]
    chunks = run.bottom.activations(x, chunk_size=run.batch_size, raw=raw)
    rows = sum(codec.chunk_rows(chunks))
    if rows != len(ids):
        raise ConfigError(
            f"predict gives one score per sample, but model {run.model!r} "
            f"makes {rows // max(len(ids), 1)} activation rows per sample (one per token): "
            "use evaluate for it"
        )
    body = codec.encode_predict_request(
        codec.PredictRequest(ids=[k.hex() for k in keys], chunks=chunks),
        codebook_dtype=run.bottom.codebook_dtype,
    )
    answer = codec.decode_predict_response(run.transport.predict(run.local.remote_id, body))
    return codec.PredictResponse(ids=list(ids), scores=answer.scores)
