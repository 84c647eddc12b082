"""Codec benchmark: encode/decode time and bytes per message at the paper's shapes.

For every quantizer shape of ``benchmarks.quantizer`` it encodes and decodes the step
request party A sends (FedLite: codebook + bit-packed codewords; SplitFed: raw float32
activations of the same batch) and the step response party B sends back (the float32
gradient), and reports median microseconds over repeats and the exact bytes on the wire.

    python -m benchmarks.codec [--repeats 200]
"""

import argparse
import os
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import summary_ms, timed, versions, write_result
from benchmarks.quantizer import SHAPES, Shape, femnist_batch, nwp_batch
from shared import codec
from shared.pq import GroupedProductQuantizer, PQConfig

DIGEST = bytes(range(8))


def messages(z: torch.Tensor, shape: Shape) -> dict[str, tuple[Any, Any, Any]]:
    """name -> (message, encoder, decoder) for one batch of activations."""
    quantizer = GroupedProductQuantizer(shape.d, PQConfig(q=shape.q, L=shape.L, R=shape.R))
    code = quantizer.encode(z, seed=0)
    pq = codec.PQActivations(code.codebook.numpy(), code.codewords.numpy())
    raw = codec.RawActivations(z.numpy())
    grad = np.random.default_rng(0).standard_normal(z.shape, dtype=np.float32) * 1e-3
    return {
        "step_request_fedlite": (
            codec.StepRequest(step=100, batch_digest=DIGEST, chunks=(pq,)),
            codec.encode_step_request,
            codec.decode_step_request,
        ),
        "step_request_splitfed": (
            codec.StepRequest(step=100, batch_digest=DIGEST, chunks=(raw,)),
            codec.encode_step_request,
            codec.decode_step_request,
        ),
        "step_response": (
            codec.StepResponse(step=100, loss=1.5, metrics={"n": 20.0, "accuracy": 0.5}, grad=grad),
            codec.encode_step_response,
            codec.decode_step_response,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    load_before = os.getloadavg()
    rows = []
    for shape in SHAPES:
        z = femnist_batch(shape.batch, 0) if shape.name == "femnist" else nwp_batch(shape.batch, 0)
        row: dict[str, Any] = {"tag": shape.tag, "batch": shape.batch, "d": shape.d}
        for name, (message, encode, decode) in messages(z, shape).items():
            data = encode(message)
            enc = summary_ms(timed(partial(encode, message), args.repeats, warmup=5))
            dec = summary_ms(timed(partial(decode, data), args.repeats, warmup=5))
            row[name] = {
                "bytes": len(data),
                "encode_us": 1000 * enc["median_ms"],
                "decode_us": 1000 * dec["median_ms"],
            }
        row["compression"] = (
            row["step_request_splitfed"]["bytes"] / row["step_request_fedlite"]["bytes"]
        )
        rows.append(row)
        print(
            shape.tag,
            {k: v for k, v in row.items() if isinstance(v, dict)},
            f"compression {row['compression']:.0f}x",
            flush=True,
        )
    path = write_result(
        "codec",
        {
            "versions": versions("torch", "numpy", "msgpack"),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "repeats": args.repeats,
            "rows": rows,
        },
        args.out,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
