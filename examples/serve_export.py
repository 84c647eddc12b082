"""Serve a trained run from the two exports (``fedlite-a export``, ``fedlite-b export``),
without either party's service or trainer: each party runs its half on its own machine and
they exchange one file, exactly what ``predict`` sends over HTTP.

    # party A: features -> transform -> bottom -> codewords against the frozen codebook
    python examples/serve_export.py party-a --export a-export --features serving.csv \\
        --out activations.npz
    # party B: codewords -> z~ -> top model (+ its own feature columns) -> scores
    python examples/serve_export.py party-b --export b-export --activations activations.npz \\
        --table labels.csv --out scores.csv

The activations file holds HMAC(run key, id) for each row (never a raw id), the frozen
codebook and the codewords (or raw z in a SplitFed run, or with --raw). Needs torch, numpy,
fedlite-vfl's shared package and party A's table preparation (party_a.features: the fitted
preparation in the export's manifest); nothing of either party's service. Both images carry
it as /opt/fedlite/serve_export.py. A mistake (a missing file or column, a wrong export) is
one line on stderr and exit code 2.
"""

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shared.alignment import hmac_ids
from shared.idtables import read_id_table
from shared.pq.frozen import codebook_from_bytes, load_program, quantizer_of, read_manifest
from shared.preparation import SideFeatures
from shared.typedtables import read_typed_table


def party_a(args: argparse.Namespace) -> None:
    from party_a.features import ColumnRules, FeatureTransform, load_features

    manifest = read_manifest(args.export, "A")
    transform = FeatureTransform.from_json(manifest["transform"])
    # predict's own reading and preparation (party_a.features): the header first, so a wrong
    # --id-column or a missing column is told before any row loads; the run's columns with
    # the types they had; missing cells and unseen categories as predict fills them
    table = load_features(
        args.features,
        id_column=args.id_column,
        feature_columns=transform.source_columns,
        standardize=transform.mean is not None,
        rules=ColumnRules(),
        expect=transform,
    )
    x = transform.apply(table)
    tokens = manifest["input"] != "float32"
    inputs = torch.from_numpy(x.astype(np.int64 if tokens else np.float32))
    z = load_program(args.export, "bottom.pt2")(inputs)  # (n, d)
    keys = np.array(
        [k.hex() for k in hmac_ids(bytes.fromhex(manifest["alignment_key"]), table.ids)]
    )
    if manifest["codebook"] is None or args.raw:
        np.savez(args.out, keys=keys, z=z.numpy())
    else:
        codebook = codebook_from_bytes((args.export / manifest["codebook"]).read_bytes())
        codewords = quantizer_of(manifest).assign(z, codebook).codewords
        np.savez(args.out, keys=keys, codebook=codebook.numpy(), codewords=codewords.numpy())
    print(f"{len(keys)} rows -> {args.out}", file=sys.stderr)


def side_features(path: Path, side: dict[str, Any]) -> tuple[list[str], np.ndarray]:
    """Party B's table's ids and its side columns (n, width) float32, prepared as the service
    prepared them: with the export's fitted preparation (empty cells, categories), or, in an
    export from before it had one, the z-score of a table of numbers."""
    preparation = side.get("preparation")
    if preparation is None:
        table = read_id_table(path, id_column=side["id_column"], columns=side["columns"])
        x = table.matrix(side["columns"])
        x = (x - np.asarray(side["mean"], np.float32)) / np.asarray(side["scale"], np.float32)
        return table.ids, x.astype(np.float32)
    prepared = SideFeatures.from_json(preparation)
    typed = read_typed_table(
        path,
        id_column=side["id_column"],
        columns=side["columns"],
        as_text=[v.name for v in prepared.categorical],
        as_number=prepared.numeric.columns,
    )
    where = {c: j for j, c in enumerate(typed.numeric_names)}
    numbers = typed.numeric[:, [where[c] for c in prepared.numeric.columns]]
    return typed.ids, prepared.apply(numbers, typed.text)


def party_b(args: argparse.Namespace) -> None:
    manifest = read_manifest(args.export, "B")
    data = np.load(args.activations, allow_pickle=False)
    keys = [bytes.fromhex(k) for k in data["keys"].tolist()]
    if "z" in data:
        z_tilde = torch.from_numpy(data["z"])
    else:
        from shared.pq import PQCode

        code = PQCode(torch.from_numpy(data["codebook"]), torch.from_numpy(data["codewords"]))
        z_tilde = quantizer_of(manifest).decode(code)
    inputs = [z_tilde]
    side = manifest["side"]
    if side is not None:
        if args.table is None:
            raise ValueError("this model reads party B's feature columns: give --table")
        ids, x = side_features(args.table, side)
        hashed = hmac_ids(bytes.fromhex(manifest["alignment_key"]), ids)
        row_of = {k: row for row, k in enumerate(hashed)}
        missing = sum(k not in row_of for k in keys)
        if missing:
            raise ValueError(f"{missing} ids are not in {args.table}")
        inputs.append(torch.from_numpy(x[[row_of[k] for k in keys]]))
    logits = load_program(args.export, "top.pt2")(*inputs)
    scores = torch.sigmoid(logits) if manifest["output"] == "sigmoid" else logits.softmax(1)
    with open(args.out, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["key", *[f"score_{c}" for c in range(scores.shape[1])]])
        for key, row in zip(data["keys"].tolist(), scores.tolist(), strict=True):
            writer.writerow([key, *[f"{v:.6f}" for v in row]])
    print(f"{len(keys)} scores -> {args.out}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="party", required=True)
    a = sub.add_parser("party-a", help="features -> activations file")
    a.add_argument("--export", type=Path, required=True)
    a.add_argument("--features", type=Path, required=True, help="the rows to score")
    a.add_argument("--id-column", default="id")
    a.add_argument("--raw", action="store_true", help="send z itself, unquantized")
    a.add_argument("--out", type=Path, required=True)
    a.set_defaults(func=party_a)
    b = sub.add_parser("party-b", help="activations file -> scores CSV")
    b.add_argument("--export", type=Path, required=True)
    b.add_argument("--activations", type=Path, required=True)
    b.add_argument("--table", type=Path, help="party B's table, when the model reads its columns")
    b.add_argument("--out", type=Path, required=True)
    b.set_defaults(func=party_b)
    args = parser.parse_args()
    try:
        args.func(args)
    except (ValueError, OSError, KeyError) as exc:  # TableError is a ValueError
        detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        print(f"serve_export.py {args.party}: {detail}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
