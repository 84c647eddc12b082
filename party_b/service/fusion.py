"""A run's feature parties at party B: their plan, fusing their activations, slicing the
gradient, and their answers of one step packed for the store (docs/PROTOCOL.md section 12).

    fuse([z~_1 (rows, d_1), ..., z~_N]) -> Z (rows, D)     concat: D = sum d_p; sum, mean: D = d
    slices(dL/dZ (rows, D)) -> [g_1 (rows, d_1), ...]      concat: column blocks; sum: dL/dZ;
                                                           mean: dL/dZ / N

A run without ``parties`` never comes here: it has one feature party and today's path.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import msgpack
import torch
from torch import Tensor

from api_schemas import RunCreate
from party_b.errors import ProblemError
from shared.codec import DownlinkSpec
from shared.pq import GroupedProductQuantizer, PQConfig

__all__ = [
    "PartyPlan",
    "fuse",
    "one_party_route",
    "pack_answers",
    "slices",
    "unpack_answers",
]


@dataclass(frozen=True)
class PartyPlan:
    """What party B needs of each feature party of a run, in the run's party order."""

    names: tuple[str, ...]
    widths: tuple[int, ...]  # d_p
    dequantizers: tuple[GroupedProductQuantizer | None, ...]  # None: a raw (SplitFed) party
    downlinks: tuple[DownlinkSpec, ...]
    fusion: str  # "concat", "sum" or "mean"

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


def pack_answers(shas: Sequence[bytes], answers: Sequence[bytes]) -> tuple[bytes, bytes]:
    """Every party's request hash and answer of one step, in party order, as the two values a
    checkpoint stores: the hashes concatenated (32 bytes each) and a msgpack array of the
    answers (one ``bin`` each)."""
    packed: bytes = msgpack.packb(list(answers), use_bin_type=True)
    return b"".join(shas), packed


def unpack_answers(
    shas: bytes | None, answers: bytes | None, parties: int
) -> list[tuple[bytes, bytes]] | None:
    """``pack_answers`` undone: (sha, answer) per party, or None for a step never answered
    (step 0) or stored in another shape."""
    if shas is None or answers is None or len(shas) != 32 * parties:
        return None
    unpacked = msgpack.unpackb(answers, raw=False)
    if not isinstance(unpacked, list) or len(unpacked) != parties:
        return None
    return [(shas[32 * i : 32 * i + 32], bytes(unpacked[i])) for i in range(parties)]


def one_party_route(spec: RunCreate, what: str) -> None:
    """Today's routes serve runs with one feature party; a run with ``parties`` is served on
    the party routes only: 409 naming them."""
    if spec.parties is not None:
        names = ", ".join(p.name for p in spec.parties)
        raise ProblemError.run_state(
            f"this run has feature parties ({names}): each party {what} on "
            "/v1/runs/{id}/parties/{party}/... with its own token (docs/PROTOCOL.md section 12)"
        )
