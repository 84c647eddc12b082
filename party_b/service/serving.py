"""Serving a run's top model: evaluate (metrics stay at party B) and predict (scores), for a
run with N >= 1 feature parties.

Each party's request is checked on its own (``evaluate``, ``predict``: 400, 409, 422, and
403 for training ids the run's privacy policy does not score); the checked part meets the
other parties' (``meetings``; at once with one party), and the meeting computes once on the
fused activations (``fusion.fuse``). Here, and only here, evaluations meet the labels: under
label DP the run's randomized ones (``run_targets``), so an evaluation is post-processing of
what the run trained on; party B's operator gets the same activations scored against the
true labels beside it (``party_b.privacy.truth``), never sent. Every party that took part
gets one audit row per evaluation or prediction, with the number of ids.

Activations that are finite but make the top model's outputs overflow are 422
``activations-out-of-range``, never a 500; nothing is logged for them.
"""

import hashlib
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from torch import Tensor

from api_schemas import ProblemType
from party_b import audit, store
from party_b.errors import ProblemError
from party_b.privacy.label_dp import run_targets
from party_b.privacy.serving import refuse_training_ids
from party_b.privacy.truth import label_rate, operator_evaluation
from party_b.service import activations
from party_b.service.context import ServiceContext
from party_b.service.fusion import fuse
from party_b.service.loader import key_index
from party_b.service.meetings import Agenda, Ticket, at_once
from party_b.service.runstate import Caller, RunState, party_of
from party_b.service.views import finite_or_none
from party_b.top import OutputNotFinite
from shared import codec
from shared.schedule import batch_digest

__all__ = ["Serving", "out_of_range"]

_ALIGNED_KEY = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class _Part:
    """One party's checked part of an evaluation or a prediction."""

    z: Tensor  # (rows, d_p) its z~, or its z when sent raw
    raw: bool  # sent unquantized
    caller: Caller  # whom the audit names
    body_bytes: int


class Serving:
    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    def evaluate(
        self, caller: Caller, run_id: str, body: bytes, split: str = "eval"
    ) -> bytes | Ticket:
        """A party's part of a forward pass over every ``split`` sample (in aligned order):
        the metrics at once for a run with one feature party, else its ticket."""
        if split not in ("eval", "train"):
            raise ProblemError.invalid(f"split must be 'eval' or 'train', got {split!r}")
        state = self._ctx.cache.owned(caller, run_id)
        index = party_of(state.plan, run_id, caller)
        request = activations.decode(codec.decode_evaluate_request, body, self._ctx.decode_limits)
        positions = state.positions_of(split)
        if len(positions) == 0:
            raise ProblemError.invalid(f"the run has no {split} samples")
        if request.ids_digest != batch_digest([state.aligned[p] for p in positions]):
            raise ProblemError(
                ProblemType.BATCH_MISMATCH,
                f"the evaluation ids' digest does not match party B's {len(positions)} "
                f"{split} samples",
            )
        part = self._part(state, index, caller, request.chunks, len(body), len(positions))
        compute = partial(self._evaluate, caller, run_id, split)
        key = ("eval", split, request.ids_digest.hex())
        what = f"the evaluation of {split}"
        return at_once(self._ticket(state, index, key, part, body, what, compute), bytes)

    def predict(self, caller: Caller, run_id: str, body: bytes) -> bytes | Ticket:
        """A party's part of a forward pass for the given (hashed) ids, during or after
        training: the scores at once for a run with one feature party, else its ticket."""
        state = self._ctx.cache.owned(caller, run_id)
        index = party_of(state.plan, run_id, caller)
        if state.rows_per_sample != 1:
            raise ProblemError.invalid(
                f"predict gives one score per sample; this run's model makes "
                f"{state.rows_per_sample} activation rows per sample (one per token)"
            )
        request = activations.decode(codec.decode_predict_request, body, self._ctx.decode_limits)
        # 403 unless the run's policy scores its training split's ids
        refuse_training_ids(state.privacy.policy, state.training_keys, request.ids)
        with state.lock:
            rows = self.rows_of(state, request.ids)  # 422 unknown-ids
        part = self._part(state, index, caller, request.chunks, len(body), len(request.ids))
        compute = partial(self._predict, caller, run_id, request.ids, rows)
        key = ("predict", _ids_key(request.ids))
        what = f"the prediction of {len(request.ids)} ids"
        return at_once(self._ticket(state, index, key, part, body, what, compute), bytes)

    def rows_of(self, state: RunState, hashed_hex: list[str]) -> np.ndarray:
        """Label-source rows of hashed ids (caller holds state.lock)."""
        if state.key_index is None:
            state.key_index = key_index(state.alignment_key, self._ctx.labels)
        rows, unknown = [], 0
        for h in hashed_hex:
            # written as the protocol says, 64 lowercase hex characters, or not an aligned key
            row = state.key_index.get(bytes.fromhex(h)) if _ALIGNED_KEY.fullmatch(h) else None
            if row is None:
                unknown += 1
            else:
                rows.append(row)
        if unknown:
            raise ProblemError(
                ProblemType.UNKNOWN_IDS,
                f"{unknown} of {len(hashed_hex)} ids are not aligned keys of ids party B holds "
                "(expected HMAC-SHA256 under the run's alignment key, 64 lowercase hex "
                "characters)",
            )
        return np.array(rows, dtype=np.int64)

    # ------------------------------------------------------------------ checking a part

    def _part(
        self,
        state: RunState,
        index: int,
        caller: Caller,
        chunks: Sequence[codec.Activations],
        body_bytes: int,
        samples: int,
    ) -> _Part:
        z = activations.dequantize(
            state.plan, index, chunks, rows=state.rows_per_sample * samples, allow_raw=True
        )
        return _Part(z, not activations.is_quantized(chunks), caller, body_bytes)

    def _ticket(
        self,
        state: RunState,
        index: int,
        key: tuple[str, ...],
        part: _Part,
        body: bytes,
        what: str,
        compute: Any,
    ) -> Ticket:
        plan = state.plan
        agenda = Agenda(what, plan.names, compute, wait=self._ctx.wait_of(plan))
        return Ticket(key, plan.names[index], part, codec.canonical_digest(body), agenda)

    # ------------------------------------------------------------------ the meetings

    def _evaluate(
        self, caller: Caller, run_id: str, split: str, parts: dict[str, _Part]
    ) -> dict[str, Any]:
        state = self._ctx.cache.owned(caller, run_id)
        with state.lock:
            rows = state.label_rows[state.positions_of(split)]
            labels = self._ctx.labels
            # under label DP the run's randomized labels: the reply is post-processing of them
            targets = run_targets(
                state.privacy, labels.targets(rows), rows, labels.num_outputs, labels
            )
            side = labels.side(rows) if state.trainer.model.side_features else None
            fused = self._fused(state, parts)
            with out_of_range():
                outcome = state.trainer.evaluate(fused, targets, side)
                # party B's operator's view: the true labels (never sent; privacy.truth)
                keys = [state.aligned[p] for p in state.positions_of(split)]
                truth = operator_evaluation(state.trainer, fused, labels, rows, side, keys)
            metrics = outcome.metrics | label_rate(state.privacy, targets, labels.num_outputs)
            # "eval+raw": the same samples, some sent unquantized (z, not z~)
            logged = f"{split}+raw" if any(p.raw for p in parts.values()) else split
            with self._ctx.sessions() as session:
                evaluation = store.log_evaluation(
                    session,
                    run_id=run_id,
                    step=state.step,
                    split=logged,
                    n=outcome.n,
                    loss=finite_or_none(outcome.loss),
                    metrics={k: finite_or_none(v) for k, v in metrics.items()},
                )
                store.log_operator_evaluation(session, evaluation, **truth)
                session.commit()
        response = codec.encode_evaluate_response(
            codec.EvaluateResponse(n=outcome.n, loss=outcome.loss, metrics=metrics)
        )
        self._served("evaluate", run_id, parts, response, ids=outcome.n, split=split)
        return dict.fromkeys(parts, response)

    def _predict(
        self,
        caller: Caller,
        run_id: str,
        ids: list[str],
        rows: np.ndarray,
        parts: dict[str, _Part],
    ) -> dict[str, Any]:
        state = self._ctx.cache.owned(caller, run_id)
        with state.lock:
            side: Tensor | None = None
            if state.config.use_side_features and state.trainer.model.side_features:
                side = self._ctx.labels.side(rows)
            with out_of_range():
                scores = state.trainer.predict(self._fused(state, parts), side)
        response = codec.encode_predict_response(
            codec.PredictResponse(ids=ids, scores=scores.numpy())
        )
        self._served("predict", run_id, parts, response, ids=len(ids))
        return dict.fromkeys(parts, response)

    @staticmethod
    def _fused(state: RunState, parts: dict[str, _Part]) -> Tensor:
        return fuse([parts[p].z for p in state.plan.names], state.plan.fusion)

    def _served(
        self,
        route: str,
        run_id: str,
        parts: dict[str, _Part],
        response: bytes,
        *,
        ids: int,
        **detail: Any,
    ) -> None:
        """Count the traffic and audit every party that took part (one row each)."""
        metrics = self._ctx.metrics
        metrics.bytes_received.labels(route).inc(sum(p.body_bytes for p in parts.values()))
        metrics.bytes_sent.labels(route).inc(len(response) * len(parts))
        for part in parts.values():
            audit.record(self._ctx.sessions, part.caller, route, run_id, ids=ids, **detail)


def _ids_key(ids: Sequence[str]) -> str:
    """A prediction's meeting is named by its ids, in row order."""
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


@contextmanager
def out_of_range() -> Iterator[None]:
    """Turn the top model's overflow into a 422 problem."""
    try:
        yield
    except OutputNotFinite as exc:
        raise ProblemError(ProblemType.ACTIVATIONS_OUT_OF_RANGE, str(exc)) from None
