"""A run's feature parties at party B: their plan, fusing their activations and slicing the
gradient (docs/PROTOCOL.md section 12). Every run has a plan: a run created without
``parties`` has one feature party (named ``a``), its token's, and fusing is then the identity.

    fuse([z~_1 (rows, d_1), ..., z~_N]) -> Z (rows, D)     concat: D = sum d_p; sum, mean: D = d
    slices(dL/dZ (rows, D)) -> [g_1 (rows, d_1), ...]      concat: column blocks; sum: dL/dZ;
                                                           mean: dL/dZ / N
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from api_schemas import RunCreate
from shared.codec import DownlinkSpec
from shared.pq import GroupedProductQuantizer, PQConfig

__all__ = ["PartyPlan", "fuse", "slices"]


@dataclass(frozen=True)
class PartyPlan:
    """What party B needs of each feature party of a run, in the run's party order."""

    names: tuple[str, ...]
    widths: tuple[int, ...]  # d_p
    dequantizers: tuple[GroupedProductQuantizer | None, ...]  # None: a raw (SplitFed) party
    downlinks: tuple[DownlinkSpec, ...]  # parsed once per run, not per step
    fusion: str  # "concat", "sum" or "mean"
    named: bool  # created with ``parties`` (their routes, their tokens), not by one token

    @classmethod
    def of(cls, spec: RunCreate) -> "PartyPlan":
        parties = spec.feature_parties()
        dequantizers: list[GroupedProductQuantizer | None] = []
        for party in parties:
            q = party.quantizer
            if q.mode == "raw":
                dequantizers.append(None)
            else:
                assert q.q is not None and q.L is not None
                dequantizers.append(
                    GroupedProductQuantizer(party.cut_dim, PQConfig(q=q.q, L=q.L, R=q.R))
                )
        return cls(
            names=tuple(p.name for p in parties),
            widths=tuple(p.cut_dim for p in parties),
            dequantizers=tuple(dequantizers),
            downlinks=tuple(DownlinkSpec.from_string(p.downlink) for p in parties),
            fusion=spec.fusion or "concat",
            named=spec.parties is not None,
        )

    def index(self, party: str) -> int:
        return self.names.index(party)

    def downlink_purpose(self, party: str) -> str:
        """The step-seed purpose of a party's stochastic downlink (PROTOCOL.md 12.6)."""
        return "downlink" if len(self.names) == 1 else f"downlink:{party}"


def fuse(parts: Sequence[Tensor], fusion: str) -> Tensor:
    """The top model's input from the parties' z~, in party order (each (rows, d_p))."""
    if len(parts) == 1:
        return parts[0]
    if fusion == "concat":
        return torch.cat(list(parts), dim=1)
    total = parts[0].clone()
    for part in parts[1:]:
        total += part  # float32, in party order
    return total if fusion == "sum" else total / len(parts)


def slices(grad: Tensor, widths: Sequence[int], fusion: str) -> list[Tensor]:
    """Each party's gradient from dL/dZ (rows, D): its columns (concat), all of it (sum),
    or all of it over N (mean)."""
    if len(widths) == 1:
        return [grad]
    if fusion == "concat":
        return list(torch.split(grad, list(widths), dim=1))
    shared = grad if fusion == "sum" else grad / len(widths)
    return [shared] * len(widths)
