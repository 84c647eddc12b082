"""How party B's gradient travels back to party A: a run's downlink representation.

A run names its representation with one string (``RunCreate.downlink``; a new run that
names none gets ``api_schemas.default_downlink`` of its cut width), parsed into a
``DownlinkSpec``::

    "float32"                    4 bytes per value (the original StepResponse)
    "float16"                    2 bytes per value (the original ``grad_dtype = "float16"``)
    "bfloat16"                   2 bytes per value, float32's range
    "int8" "int4" "int2"         b bits per value + a float32 scale per row; int4 and int2
                                 round stochastically (unbiased), seeded by the step
    "int1"                       the sign of each value times the row's mean magnitude
    "topk:k=256"                 the k largest |values| of each row (indices + bfloat16)
    "pq:q=1152,L=2,R=1"          the grouped product quantizer of the uplink, applied to
                                 the gradient (optional ``it`` k-means iterations, default
                                 10, and ``cb=f2`` for a float16 codebook)

``encode_gradient(grad, spec, seed)`` gives the StepResponse fields that carry the
gradient, ``decode_gradient`` reads them back. Both are pure: the same gradient, spec and
seed always give the same bytes, which is what lets party B store a step's answer and send
it again byte for byte. ``roundtrip`` is what party A ends up with (for experiments).
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from shared.pq.quantizer import PQConfig
from shared.wire import gradients
from shared.wire.arrays import check_float32, float_bin
from shared.wire.reader import DEFAULT_LIMITS, CodecError, DecodeLimits, Fields

__all__ = [
    "KINDS",
    "DownlinkSpec",
    "decode_gradient",
    "encode_gradient",
    "gradient_keys",
    "roundtrip",
]

KINDS: Final = ("float32", "float16", "bfloat16", "int", "topk", "pq")
_PARAMS: Final = {"topk": ("k",), "pq": ("q", "L", "R", "it", "cb")}
_LEGACY_KEYS: Final = frozenset({"dt", "g"})
_COMPRESSED_KEYS: Final = frozenset({"gr"})


@dataclass(frozen=True)
class DownlinkSpec:
    """One downlink representation; ``kind`` plus the parameters that kind reads."""

    kind: str  # one of KINDS
    bits: int = 0  # "int": 1, 2, 4 or 8
    k: int = 0  # "topk": entries kept per row
    q: int = 0  # "pq": sub-vectors per row (divides d)
    L: int = 0  # "pq": codewords per codebook
    R: int = 1  # "pq": codebooks (divides q)
    it: int = 10  # "pq": k-means Lloyd iterations
    cb: str = "f4"  # "pq": codebook dtype tag, "f4" or "f2"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown downlink kind {self.kind!r}")
        if self.kind == "int" and self.bits not in gradients.INT_BITS:
            raise ValueError(f"int downlink takes {gradients.INT_BITS} bits, got {self.bits}")
        if self.kind == "topk" and self.k < 1:
            raise ValueError(f"topk needs k >= 1, got {self.k}")
        if self.kind == "pq":
            PQConfig(q=self.q, L=self.L, R=self.R, iterations=self.it).validate(self.q)
            if self.cb not in ("f4", "f2"):
                raise ValueError(f"pq codebook dtype cb must be 'f4' or 'f2', got {self.cb!r}")

    @classmethod
    def from_string(cls, text: str) -> "DownlinkSpec":
        """Parse ``"int4"``, ``"topk:k=64"``, ``"pq:q=1152,L=2"``...; ValueError naming the
        accepted forms otherwise."""
        name, _, rest = text.strip().partition(":")
        try:
            if name.startswith("int") and name[3:].isdigit() and not rest:
                return cls(kind="int", bits=int(name[3:]))
            if name in ("float32", "float16", "bfloat16") and not rest:
                return cls(kind=name)
            if name in _PARAMS:
                return cls(kind=name, **_parse_params(name, rest))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"downlink {text!r}: {exc}") from None
        raise ValueError(
            f"unknown downlink {text!r}; use float32, float16, bfloat16, int8, int4, int2, "
            "int1, topk:k=<entries per row> or pq:q=<sub-vectors>,L=<codewords>[,R=<groups>]"
        )

    def to_string(self) -> str:
        """The canonical string (``from_string(spec.to_string()) == spec``)."""
        if self.kind == "int":
            return f"int{self.bits}"
        if self.kind not in _PARAMS:
            return self.kind
        defaults = {f.name: f.default for f in fields(self)}
        parts = [
            f"{name}={getattr(self, name)}"
            for name in _PARAMS[self.kind]
            if name in ("k", "q", "L") or getattr(self, name) != defaults[name]
        ]
        return f"{self.kind}:{','.join(parts)}"

    def check_width(self, d: int) -> None:
        """ValueError unless this representation can carry gradients of width ``d``."""
        if self.kind == "topk" and self.k > d:
            raise ValueError(f"downlink topk:k={self.k} keeps more than the d={d} values a row")
        if self.kind == "pq":
            self.pq_config().validate(d)

    def pq_config(self) -> PQConfig:
        return PQConfig(q=self.q, L=self.L, R=self.R, iterations=self.it)


def _parse_params(kind: str, rest: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in _PARAMS[kind] or key in out:
            raise ValueError(f"{kind} takes {', '.join(_PARAMS[kind])} once each, got {item!r}")
        out[key] = value.strip() if key == "cb" else int(value)
    return out


def encode_gradient(grad: NDArray[np.float32], spec: DownlinkSpec, seed: int) -> dict[str, Any]:
    """The StepResponse fields that carry a finite (B, d) float32 gradient.

    float32 / float16: ``{"dt", "g"}``, the original fields; every other kind: ``{"gr": map}``
    (shared/wire/gradients.py). Raises ValueError for NaN/Inf and ``RangeError`` when a
    finite gradient overflows float16/bfloat16 (the sender may fall back to float32).
    """
    check_float32(grad, "grad", ndim=2)
    spec.check_width(grad.shape[1])
    if spec.kind in ("float32", "float16"):
        tag, data = float_bin(grad, "float16" if spec.kind == "float16" else "float32", "grad")
        return {"dt": tag, "g": data}
    if not np.isfinite(grad).all():
        raise ValueError("grad holds NaN or Inf values")
    if spec.kind == "bfloat16":
        return {"gr": gradients.bf16_to_wire(grad)}
    if spec.kind == "int":
        return {"gr": gradients.int_to_wire(grad, spec.bits, seed)}
    if spec.kind == "topk":
        return {"gr": gradients.topk_to_wire(grad, spec.k)}
    codebook = "float16" if spec.cb == "f2" else "float32"
    return {"gr": gradients.pq_to_wire(grad, spec.pq_config(), seed, codebook_dtype=codebook)}


def gradient_keys(obj: Mapping[str, Any]) -> frozenset[str]:
    """The gradient fields a StepResponse map holds: compressed if it has ``gr``."""
    return _COMPRESSED_KEYS if "gr" in obj else _LEGACY_KEYS


def decode_gradient(
    f: Fields, B: int, d: int, limits: DecodeLimits = DEFAULT_LIMITS
) -> NDArray[np.float32]:
    """The (B, d) float32 gradient from a StepResponse's fields; CodecError if malformed."""
    f.check_elements("B*d", B * d, limits)
    if "gr" in f.keys:
        grad: NDArray[np.float32] = gradients.gradient_from_wire(
            f.get_raw("gr"), f"{f.where}.gr", B, d, limits
        )
        return grad
    return f.get_float_array("g", f.get_dtype("dt"), (B, d))


def roundtrip(grad: NDArray[np.float32], spec: DownlinkSpec, seed: int) -> NDArray[np.float32]:
    """What party A decodes when party B sends ``grad`` with ``spec`` at ``seed``."""
    wire = encode_gradient(grad, spec, seed)
    B, d = grad.shape
    f = Fields(wire, "grad", frozenset(wire))
    try:
        return decode_gradient(f, B, d)
    except CodecError as exc:  # our own encoding: a bug, not a malformed message
        raise AssertionError(f"downlink {spec.to_string()} does not round-trip: {exc}") from exc
