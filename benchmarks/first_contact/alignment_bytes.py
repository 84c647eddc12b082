"""What the alignment costs on the wire: the bodies of one PSI and of aligning a run on its
intersection, JSON (hex keys) against binary (docs/PROTOCOL.md 8.1), as party A's HTTP
client counts them."""

from pathlib import Path
from typing import Any

from benchmarks.common import TOKEN

__all__ = ["alignment_bytes"]


def alignment_bytes(url: str, features: Path, work: Path) -> dict[str, Any]:
    """Bodies of one PSI and of aligning two runs on its intersection: JSON, then binary."""
    from api_schemas import RunCreate
    from party_a.alignment import private_intersection
    from party_a.session import open_state
    from party_a.transport.http import HttpTransport
    from shared.alignkeys import decode_align_reply, encode_align_request, request_for
    from shared.alignment import hmac_ids
    from shared.idtables import read_id_table

    ids = read_id_table(features, id_column="id").ids
    store = open_state(work / "bytes-state", create=True)
    spec = RunCreate.model_validate(
        {
            "name": "bytes",
            "model": "tabular_mlp",
            "top": {"hidden": [16]},
            "cut_dim": 16,
            "quantizer": {"mode": "pq", "q": 4, "L": 4},
            "optimizer": {"name": "adam", "lr": 0.001},
            "seed": 0,
            "batch_size": 64,
            "steps": 20,
        }  # fmt: skip
    )
    out: dict[str, Any] = {}
    with HttpTransport(url, TOKEN) as transport:
        before = transport.bytes_sent, transport.bytes_received
        psi, _cached = private_intersection(ids, transport=transport, store=store, server=url)
        out["psi"] = {
            "ids_here": len(ids),
            "common": len(psi.intersection),
            "sent": transport.bytes_sent - before[0],
            "received": transport.bytes_received - before[1],
        }
        for fmt in ("json", "keys"):
            run = transport.create_run(spec.model_copy(update={"name": f"bytes-{fmt}"}))
            offered = hmac_ids(bytes.fromhex(run.alignment_key), psi.intersection)
            before = transport.bytes_sent, transport.bytes_received
            if fmt == "json":
                aligned = len(transport.align(run.id, [k.hex() for k in offered]).intersection)
            else:
                body = encode_align_request(request_for(offered)[0])
                aligned = decode_align_reply(transport.align_keys(run.id, body)).count
            out[fmt] = {
                "aligned": aligned,
                "sent": transport.bytes_sent - before[0],
                "received": transport.bytes_received - before[1],
            }
    store.close()
    for part in ("psi", "json", "keys"):
        out[part]["total"] = out[part]["sent"] + out[part]["received"]
    out["first_contact_before"] = out["psi"]["total"] + out["json"]["total"]
    out["first_contact_after"] = out["psi"]["total"] + out["keys"]["total"]
    return out
