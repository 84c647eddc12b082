"""Serving a run's top model: evaluate (metrics stay at party B) and predict (scores).

Activations that are finite but make the top model's outputs overflow are 422
``activations-out-of-range``, never a 500; nothing is logged for them.
"""

import re
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from torch import Tensor

from api_schemas import ProblemType
from party_b import audit, store
from party_b.errors import ProblemError
from party_b.privacy.label_dp import run_targets
from party_b.privacy.serving import refuse_training_ids
from party_b.service import activations
from party_b.service.context import ServiceContext
from party_b.service.fusion import one_party_route
from party_b.service.loader import key_index
from party_b.service.runstate import Caller, RunState
from party_b.service.views import finite_or_none
from party_b.top import OutputNotFinite
from shared import codec
from shared.schedule import batch_digest

__all__ = ["Serving", "out_of_range"]

_ALIGNED_KEY = re.compile(r"[0-9a-f]{64}")


class Serving:
    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    def evaluate(self, caller: Caller, run_id: str, body: bytes, split: str = "eval") -> bytes:
        """Forward only over all ``split`` samples (in aligned order); metrics stay at party B."""
        if split not in ("eval", "train"):
            raise ProblemError.invalid(f"split must be 'eval' or 'train', got {split!r}")
        state = self._ctx.cache.owned(caller, run_id)
        one_party_route(state.config, "sends its part of an evaluation")
        with state.lock:
            request = activations.decode(
                codec.decode_evaluate_request, body, self._ctx.decode_limits
            )
            positions = state.positions_of(split)
            if len(positions) == 0:
                raise ProblemError.invalid(f"the run has no {split} samples")
            if request.ids_digest != batch_digest([state.aligned[p] for p in positions]):
                raise ProblemError(
                    ProblemType.BATCH_MISMATCH,
                    f"the evaluation ids' digest does not match party B's {len(positions)} "
                    f"{split} samples",
                )
            rows_per_sample = state.rows_per_sample
            z_tilde = activations.dequantize(
                state,
                request.chunks,
                expected_rows=rows_per_sample * len(positions),
                allow_raw=True,
            )
            rows = state.label_rows[positions]
            # under label DP the run's randomized labels: the reply is post-processing of them
            labels = self._ctx.labels
            targets = run_targets(
                state.privacy, labels.targets(rows), rows, labels.num_outputs, labels
            )
            with out_of_range():
                outcome = state.trainer.evaluate(z_tilde, targets, self._side(state, rows))
            # "eval+raw": the same samples, sent unquantized (z, not z~)
            logged_split = split if activations.is_quantized(request.chunks) else f"{split}+raw"
            with self._ctx.sessions() as session:
                store.log_evaluation(
                    session,
                    run_id=run_id,
                    step=state.step,
                    split=logged_split,
                    n=outcome.n,
                    loss=finite_or_none(outcome.loss),
                    metrics={k: finite_or_none(v) for k, v in outcome.metrics.items()},
                )
                session.commit()
        response = codec.encode_evaluate_response(
            codec.EvaluateResponse(n=outcome.n, loss=outcome.loss, metrics=outcome.metrics)
        )
        self._ctx.metrics.bytes_received.labels("evaluate").inc(len(body))
        self._ctx.metrics.bytes_sent.labels("evaluate").inc(len(response))
        audit.record(self._ctx.sessions, caller, "evaluate", run_id, ids=outcome.n, split=split)
        return response

    def predict(self, caller: Caller, run_id: str, body: bytes) -> bytes:
        """Forward only for the given (hashed) ids: serving after or during training."""
        state = self._ctx.cache.owned(caller, run_id)
        one_party_route(state.config, "sends its part of a prediction")
        if state.rows_per_sample != 1:
            raise ProblemError.invalid(
                f"predict gives one score per sample; this run's model makes "
                f"{state.rows_per_sample} activation rows per sample (one per token)"
            )
        request = activations.decode(codec.decode_predict_request, body, self._ctx.decode_limits)
        refuse_training_ids(state, request.ids)  # 403 unless the run's policy allows them
        side: Tensor | None = None
        with state.lock:
            if state.config.use_side_features and state.trainer.model.side_features:
                side = self._ctx.labels.side(self.rows_of(state, request.ids))
            z_tilde = activations.dequantize(
                state, request.chunks, expected_rows=request.rows, allow_raw=True
            )
            with out_of_range():
                scores = state.trainer.predict(z_tilde, side)
        response = codec.encode_predict_response(
            codec.PredictResponse(ids=request.ids, scores=scores.numpy())
        )
        self._ctx.metrics.bytes_received.labels("predict").inc(len(body))
        self._ctx.metrics.bytes_sent.labels("predict").inc(len(response))
        audit.record(self._ctx.sessions, caller, "predict", run_id, ids=len(request.ids))
        return response

    def _side(self, state: RunState, rows: np.ndarray) -> Tensor | None:
        return self._ctx.labels.side(rows) if state.trainer.model.side_features else None

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


@contextmanager
def out_of_range() -> Iterator[None]:
    """Turn the top model's overflow into a 422 problem."""
    try:
        yield
    except OutputNotFinite as exc:
        raise ProblemError(ProblemType.ACTIVATIONS_OUT_OF_RANGE, str(exc)) from None
