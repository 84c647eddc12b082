"""Bits on the wire: the paper's message-size formula and the measured size of our messages.

The paper (section 3.1) counts an uplink message of phi*d*R*L/q + B*q*log2(L) bits against
phi*d*B for the raw batch, with phi = 64 bits per float. Our wire differs from that model in
three honest ways, all visible in :func:`compression_report`: floats travel as float32 (or
float16), codewords take a whole ceil(log2 L) bits each, and every message carries msgpack
headers (version, type tag, shapes, the step number and the batch digest).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared.codec import (
    PQActivations,
    RawActivations,
    StepRequest,
    WireFloat,
    encode_step_request,
)
from shared.types import DIGEST_BYTES
from shared.wire.bitpack import bits_for

__all__ = [
    "PAPER_PHI",
    "PaperSize",
    "compression_report",
    "paper_message_bits",
    "raw_step_request_bytes",
    "pq_step_request_bytes",
]

PAPER_PHI = 64  # bits per float in the paper's accounting ("we always assume phi = 64")


@dataclass(frozen=True)
class PaperSize:
    """The paper's message-size model for one batch, in bits."""

    codebook_bits: float  # phi * d * R * L / q
    codeword_bits: float  # B * q * log2(L)
    raw_bits: float  # phi * d * B

    @property
    def total_bits(self) -> float:
        return self.codebook_bits + self.codeword_bits

    @property
    def ratio(self) -> float:
        return self.raw_bits / self.total_bits if self.total_bits else math.inf


def paper_message_bits(
    *, d: int, batch: int, q: int, L: int, R: int = 1, phi: int = PAPER_PHI
) -> PaperSize:
    """phi*d*R*L/q + B*q*log2(L) bits against phi*d*B (paper, section 3.1)."""
    for name, value in (("d", d), ("batch", batch), ("q", q), ("L", L), ("R", R), ("phi", phi)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if d % q or q % R:
        raise ValueError(f"need q | d and R | q, got d={d}, q={q}, R={R}")
    return PaperSize(
        codebook_bits=phi * d * R * L / q,
        codeword_bits=batch * q * math.log2(L),
        raw_bits=float(phi * d * batch),
    )


def pq_step_request_bytes(
    *, d: int, batch: int, q: int, L: int, R: int = 1, codebook_dtype: WireFloat = "float32"
) -> int:
    """Measured bytes of a real encoded one-chunk PQ step request of this shape.

    Sizes on our wire depend only on shapes and dtypes (bins have fixed lengths), so the
    message is built with zero-valued arrays; the step number is 1.
    """
    chunk = PQActivations(
        codebook=np.zeros((R, L, d // q), dtype=np.float32),
        codewords=np.zeros((batch, q), dtype=np.int64),
    )
    message = StepRequest(step=1, batch_digest=bytes(DIGEST_BYTES), chunks=(chunk,))
    return len(encode_step_request(message, codebook_dtype=codebook_dtype))


def raw_step_request_bytes(
    *, d: int, batch: int | Sequence[int], activations_dtype: WireFloat = "float32"
) -> int:
    """Measured bytes of the SplitFed step request (raw activations) of this shape.

    ``batch``: rows of the one chunk, or the rows of each chunk (one per client).
    """
    sizes = [batch] if isinstance(batch, int) else list(batch)
    chunks = tuple(RawActivations(activations=np.zeros((b, d), dtype=np.float32)) for b in sizes)
    message = StepRequest(step=1, batch_digest=bytes(DIGEST_BYTES), chunks=chunks)
    return len(encode_step_request(message, activations_dtype=activations_dtype))


def compression_report(
    *,
    d: int,
    batch: int,
    q: int,
    L: int,
    R: int = 1,
    phi: int = PAPER_PHI,
    codebook_dtype: WireFloat = "float32",
) -> dict[str, Any]:
    """Paper ratio and measured wire ratio of one uplink message, as a JSON-able dict.

    Keys: ``paper_bits``, ``paper_raw_bits``, ``paper_ratio`` (the paper's formula with
    ``phi``); ``wire_bytes`` and ``raw_wire_bytes`` (our encoded FedLite and raw float32
    SplitFed step requests, all bytes of the msgpack body), ``wire_ratio`` (their quotient);
    ``codeword_bits`` (ceil(log2 L), what each codeword occupies on our wire).
    """
    paper = paper_message_bits(d=d, batch=batch, q=q, L=L, R=R, phi=phi)
    wire = pq_step_request_bytes(d=d, batch=batch, q=q, L=L, R=R, codebook_dtype=codebook_dtype)
    raw = raw_step_request_bytes(d=d, batch=batch)
    return {
        "d": d,
        "batch": batch,
        "q": q,
        "L": L,
        "R": R,
        "phi": phi,
        "codebook_dtype": codebook_dtype,
        "paper_bits": paper.total_bits,
        "paper_raw_bits": paper.raw_bits,
        "paper_ratio": paper.ratio,
        "codeword_bits": bits_for(L),
        "wire_bytes": wire,
        "raw_wire_bytes": raw,
        "wire_ratio": raw / wire,
    }
