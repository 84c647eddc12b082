"""``fedlite-a``: party A's command line (the feature holder)."""

import argparse
import json
import sys
from collections.abc import Sequence

from shared.accounting import PAPER_PHI, compression_report

__all__ = ["main"]


def _cmd_ratio(args: argparse.Namespace) -> int:
    try:
        report = compression_report(
            d=args.d,
            batch=args.batch,
            q=args.q,
            L=args.L,
            R=args.R,
            phi=args.phi,
            codebook_dtype=args.codebook_dtype,
        )
    except ValueError as exc:
        print(f"fedlite-a ratio: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedlite-a", description="FedLite-VFL party A: the feature holder's trainer."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    ratio = sub.add_parser(
        "ratio",
        help="compression ratio of one uplink message (paper formula and measured wire bytes)",
        description="Print one JSON object: the paper's ratio phi*d*B / (phi*d*R*L/q + "
        "B*q*log2 L) and the measured encoded sizes of our FedLite and raw step requests.",
    )
    ratio.add_argument("--d", type=int, required=True, help="activation width")
    ratio.add_argument("--batch", type=int, required=True, help="rows per batch (B)")
    ratio.add_argument("--q", type=int, required=True, help="subvectors per row")
    ratio.add_argument("--L", type=int, required=True, help="centroids per group")
    ratio.add_argument("--R", type=int, default=1, help="groups (default 1)")
    ratio.add_argument(
        "--phi", type=int, default=PAPER_PHI, help="bits per float in the paper's formula"
    )
    ratio.add_argument("--codebook-dtype", choices=["float32", "float16"], default="float32")
    ratio.set_defaults(func=_cmd_ratio)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
