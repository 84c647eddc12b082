"""From the wire to z~: decoding a request's body and dequantizing its activation chunks.

A body that does not decode is 400 ``malformed-message`` (the codec's message names the
field), or 422 ``limit-exceeded`` naming the limit and its ``FEDLITE_B_LIMIT_*`` setting
when what it declares is over one (``declared.over_limit``); chunks that decode but do not
fit the run (rows, width, quantizer, kind) are 422 ``shape-mismatch``.
"""

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from api_schemas import ProblemType
from party_b.errors import ProblemError
from party_b.service.declared import over_limit
from party_b.service.fusion import PartyPlan
from party_b.settings import Limits
from shared import codec
from shared.pq import GroupedProductQuantizer

__all__ = ["decode", "decode_limits", "dequantize", "is_quantized"]

M = TypeVar("M")


def decode_limits(limits: Limits) -> codec.DecodeLimits:
    """The codec's bounds from the operator's limits."""
    return codec.DecodeLimits(
        max_batch=limits.max_batch,
        max_dim=limits.max_dim,
        max_q=limits.max_q,
        max_L=limits.max_L,
    )


def decode(decoder: Callable[..., M], body: bytes, limits: codec.DecodeLimits) -> M:
    """``decoder(body)``; malformed input is a 400 problem naming what is wrong, a body over
    a limit a 422 naming the limit and its setting."""
    try:
        return decoder(body, limits=limits)
    except codec.CodecError as exc:
        over = over_limit(body, limits)
        if over is not None:
            limit, sentence = over
            value = getattr(limits, limit)
            detail = f"{sentence} (the decoder: {exc})"
            raise ProblemError(
                ProblemType.LIMIT_EXCEEDED, detail, limit=limit, value=value
            ) from None
        raise ProblemError.malformed(str(exc)) from None


def is_quantized(chunks: Sequence[codec.Activations]) -> bool:
    return not any(isinstance(c, codec.RawActivations) for c in chunks)


def dequantize(
    plan: PartyPlan,
    index: int,
    chunks: Sequence[codec.Activations],
    *,
    rows: int,
    allow_raw: bool = False,
) -> Tensor:
    """Party ``index``'s chunks as its z~ (rows, d_p), checked against its width and its
    quantizer (None: a raw party) in the run's ``plan``.

    ``allow_raw``: a FedLite party also sends raw activations (evaluate and predict: the
    model without compression; training steps must be quantized as configured)."""
    width, quantizer = plan.widths[index], plan.dequantizers[index]
    who = "the run" if len(plan.names) == 1 else f"party {plan.names[index]!r}"
    sent = sum(c.B for c in chunks)
    if sent != rows:
        raise ProblemError.shape(f"{sent} activation rows, expected {rows}")
    if chunks[0].d != width:
        raise ProblemError.shape(f"activations have d={chunks[0].d}, {who} has {width}")
    parts = [_dequantize_chunk(quantizer, chunk, allow_raw, who) for chunk in chunks]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _dequantize_chunk(
    quantizer: GroupedProductQuantizer | None,
    chunk: codec.Activations,
    allow_raw: bool,
    who: str,
) -> Tensor:
    whose = "" if who == "the run" else f" ({who})"
    if isinstance(chunk, codec.RawActivations):
        if quantizer is not None and not allow_raw:
            raise ProblemError.shape(f"raw activations sent to a FedLite (pq) run{whose}")
        return torch.from_numpy(chunk.activations)
    if quantizer is None:
        raise ProblemError.shape(f"quantized activations sent to a raw (SplitFed) run{whose}")
    cfg = quantizer.config
    if (chunk.q, chunk.R, chunk.L) != (cfg.q, cfg.R, cfg.L):
        raise ProblemError.shape(
            f"quantizer (q, R, L) = {(chunk.q, chunk.R, chunk.L)}, "
            f"{who} has {(cfg.q, cfg.R, cfg.L)}"
        )
    return quantizer.decode(chunk.to_code())
