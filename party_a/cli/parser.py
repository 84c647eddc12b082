"""``fedlite-a``'s argument parser: every subcommand, its flags and help (``build_parser``)."""

import argparse
import os
from pathlib import Path
from typing import Any

from party_a.cli import commands
from party_a.session import state_dir_default
from shared.types import DECLARED_TYPES

__all__ = ["build_parser"]


# ====================================================================== parser


def _connection_flags(parser: argparse.ArgumentParser, *, retry_for: float = 300.0) -> None:
    parser.add_argument("--server", help="party B's base URL (or FEDLITE_A_SERVER)")
    parser.add_argument(
        "--token",
        help="API token issued by party B (or FEDLITE_A_TOKEN); one that begins with '-' "
        "goes as --token=VALUE",
    )
    parser.add_argument(
        "--ca-bundle",
        type=Path,
        default=os.environ.get("FEDLITE_A_CA_BUNDLE") or None,
        help="CA certificates to trust for party B's TLS certificate (or FEDLITE_A_CA_BUNDLE)",
    )
    parser.add_argument(
        "--client-cert",
        type=Path,
        default=os.environ.get("FEDLITE_A_CLIENT_CERT") or None,
        help="party A's client certificate (PEM) for a party B with mutual TLS "
        "(or FEDLITE_A_CLIENT_CERT)",
    )
    parser.add_argument(
        "--client-key",
        type=Path,
        default=os.environ.get("FEDLITE_A_CLIENT_KEY") or None,
        help="its private key, unencrypted PEM (or FEDLITE_A_CLIENT_KEY; default: in the "
        "certificate's file)",
    )
    parser.add_argument(
        "--retry-for",
        type=float,
        default=retry_for,
        help=f"seconds to keep retrying an unreachable party B (default {retry_for:g})",
    )


def _overlap_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--overlap",
        type=float,
        default=1.0,
        help="fraction of the ids both parties hold (give both parties the same value)",
    )
    parser.add_argument("--seed", type=int, default=0, help="which ids are not shared")


def _state_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=state_dir_default(),
        help="party A's local state (default FEDLITE_A_STATE_DIR, else ./fedlite-a-state)",
    )


def _data_flags(parser: argparse.ArgumentParser) -> None:
    _connection_flags(parser)
    parser.add_argument(
        "--features", type=Path, required=True, help="feature table: CSV, Parquet, npz"
    )
    parser.add_argument("--id-column", default="id", help="sample-id column (default 'id')")
    _state_flag(parser)


def _session_flags(parser: argparse.ArgumentParser) -> None:
    _data_flags(parser)
    parser.add_argument("--config", type=Path, help="run config (TOML); flags override it")
    parser.add_argument("--name", help="run name (config [run] name)")
    parser.add_argument(
        "--party",
        help="this party's name in a run with several feature parties (config [run] party); "
        "the token is the one party B's operator issued to this party",
    )
    parser.add_argument("--model", help="split model (config [run] model)")
    parser.add_argument("--steps", type=int, help="training steps in all (config [run] steps)")
    parser.add_argument(
        "--batch-size", type=int, help="samples per step (per client with the clients schedule)"
    )
    parser.add_argument(
        "--seed", type=int, help="seeds the split, the batches and the model (config [run] seed)"
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=int,
        help="steps between checkpoints both parties keep (a restart resumes from one)",
    )
    parser.add_argument(
        "--eval-fraction",
        type=float,
        help="share of the aligned samples held out for evaluation, e.g. 0.2",
    )
    parser.add_argument("--mode", choices=["pq", "raw"], help="pq = FedLite, raw = SplitFed")
    parser.add_argument(
        "--q", type=int, help="subvectors per activation (must divide the cut width)"
    )
    parser.add_argument("--L", type=int, help="centroids per group")
    parser.add_argument("--R", type=int, help="groups")
    parser.add_argument("--lambda", dest="lam", type=float, help="gradient correction strength")
    parser.add_argument(
        "--device",
        help="where party A computes: cpu (default), cuda, cuda:N or auto; a local choice, "
        "also for a trained run (config [run] device)",
    )
    for flag, what in (*DECLARED_TYPES, ("drop", "columns the run never reads")):
        parser.add_argument(
            f"--{flag}", metavar="COLUMNS", help=f"comma-separated: {what} (config [data] {flag})"
        )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="any config key, e.g. optimizer.bottom.lr=0.01",
    )


def _global_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """-v and --version, on the main parser and again on every subcommand, so that they work
    before or after it (on a subcommand they default to SUPPRESS, so that leaving them out
    there does not overwrite what was given before it)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="log retries and recovery",
    )
    parser.add_argument(
        "--torch-threads",
        type=_threads,
        metavar="N",
        default=None if top else argparse.SUPPRESS,
        help="intra-op threads of party A's steps (default: chosen from the bottom model's "
        "size and the cores)",
    )
    parser.add_argument("--version", action="version", version=f"fedlite-a {_version()}")


def _threads(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a thread count is an integer >= 1, got {text!r}")
    return int(text)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedlite-vfl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _add(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand's parser, with the global flags again (they go before or after it)."""
    child: argparse.ArgumentParser = sub.add_parser(name, **kwargs)
    _global_flags(child, top=False)
    return child


def _serving_parsers(sub: Any) -> None:
    """evaluate, predict and export: what is done with a trained run."""
    evaluate = _add(sub, "evaluate", help="held-out metrics of a trained run (computed at party B)")
    _session_flags(evaluate)
    evaluate.add_argument("--split", choices=["eval", "train"], default="eval")
    evaluate.add_argument(
        "--raw",
        action="store_true",
        help="send unquantized activations (a FedLite run's model without compression)",
    )
    evaluate.set_defaults(func=commands.cmd_evaluate)

    predict = _add(
        sub,
        "predict",
        help="party B's scores for given ids, or a whole table (a trained run)",
        description="Score ids in requests within party B's limits (its max_batch, or "
        "--chunk-size), writing each answer as it comes. With --out, an interrupted run of "
        "the same command resumes after the last complete request; FILE.parquet is written "
        "as Parquet, anything else as CSV.",
    )
    _session_flags(predict)
    predict.add_argument("--ids", help="comma-separated ids")
    predict.add_argument("--ids-file", type=Path, help="one id per line")
    predict.add_argument(
        "--all",
        action="store_true",
        help="every id of --features that party B holds (the private set intersection)",
    )
    predict.add_argument(
        "--out", type=Path, help="CSV or .parquet to write, resumably (default: CSV on stdout)"
    )
    predict.add_argument(
        "--chunk-size",
        type=int,
        metavar="N",
        help="ids per request (default: party B's limit, FEDLITE_B_LIMIT_MAX_BATCH)",
    )
    predict.add_argument(
        "--raw",
        action="store_true",
        help="send unquantized activations (default: quantized with the run's frozen codebook)",
    )
    predict.set_defaults(func=commands.cmd_predict)

    export = _add(
        sub,
        "export",
        help="write party A's half of a trained run for serving (model, transform, codebook)",
    )
    export.add_argument("--server", help="party B's URL, when runs of that name exist for several")
    _state_flag(export)
    export.add_argument("--name", help="run name (or the [run] name of --config)")
    export.add_argument("--config", type=Path, help="run config (TOML) naming the run")
    export.add_argument("--out", type=Path, required=True, help="directory to create")
    export.set_defaults(func=commands.cmd_export)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedlite-a",
        description="FedLite-VFL party A: the feature holder's trainer.",
        epilog="Exit codes: 0 done; 1 party B refused the request or could not be reached; "
        "2 a configuration or usage error, or a token party B does not accept (retrying "
        "will not fix it).",
    )
    _global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True)

    align = _add(
        sub,
        "align",
        help="private set intersection of sample ids with party B (cached; train runs it too)",
        description="Run an ECDH private set intersection with party B and cache the result "
        "in --state-dir under the pair of dataset versions. Neither party learns the other's "
        "ids outside the intersection. Prints one JSON object.",
    )
    _data_flags(align)
    align.add_argument("--force", action="store_true", help="rerun even when cached")
    align.add_argument("--ids-out", type=Path, help="also write the common ids, one a line")
    align.add_argument("--party", help="a feature party of a run with several: its name")
    align.set_defaults(func=commands.cmd_align)

    check = _add(
        sub,
        "check",
        help="is party B reachable, and does it accept the token? (answers in seconds)",
    )
    _connection_flags(check, retry_for=5.0)
    check.set_defaults(func=commands.cmd_check)

    train = _add(
        sub,
        "train",
        help="train (or resume) a run with party B",
        description="Create the run at party B (or find it again by its [run] name), align "
        "the ids (private set intersection), train, evaluate on the held-out split at party B "
        "and finish. Run the same command again after an interruption: it resumes. Flags "
        "override the --config file; every config key is in party_a/config.py.",
        epilog="example:\n  fedlite-a train --server https://partyb.example.org:8443 "
        "--ca-bundle ca.crt \\\n    --features features.csv --id-column customer_id "
        "--config run.toml --steps 300\n(the token from FEDLITE_A_TOKEN; see docs/DEPLOY.md)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _session_flags(train)
    train.add_argument("--no-evaluate", action="store_true", help="skip the held-out evaluation")
    train.add_argument("--no-finish", action="store_true", help="leave the run open at party B")
    train.add_argument("--summary-json", type=Path, help="also write the summary as JSON")
    train.set_defaults(func=commands.cmd_train)

    _serving_parsers(sub)

    finish = _add(sub, "finish", help="finish a run left open (train --no-finish)")
    _connection_flags(finish)
    _state_flag(finish)
    finish.add_argument("--name", help="run name (or the [run] name of --config)")
    finish.add_argument("--config", type=Path, help="run config (TOML) to take the name from")
    finish.set_defaults(func=commands.cmd_finish)

    for name, func, what in (
        ("show", commands.cmd_show, "a run as party B and party A see it (JSON)"),
        ("delete", commands.cmd_delete, "delete a run at party B (frees its quota) and here"),
    ):
        child = _add(sub, name, help=what)
        _connection_flags(child)
        _state_flag(child)
        child.add_argument("--name", help="run name (or the [run] name of --config)")
        child.add_argument("--config", type=Path, help="run config (TOML) naming the run")
        child.set_defaults(func=func)

    runs = _add(sub, "runs", help="the runs party A's state directory holds")
    _state_flag(runs)
    runs.set_defaults(func=commands.cmd_runs)

    demo = _add(
        sub, "demo-data", help="write party A's half of the bundled breast-cancer demo data (CSV)"
    )
    demo.add_argument("--out", type=Path, default=Path("party_a_features.csv"))
    demo.add_argument(
        "--columns",
        default="0:20",
        help="START:STOP of party A's 20 columns, e.g. 0:10 and 10:20 for two feature parties",
    )
    _overlap_flags(demo)
    demo.set_defaults(func=commands.cmd_demo_data)

    ratio = _add(
        sub,
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
        "--phi", type=int, help="bits per float in the paper's formula (default: its 64)"
    )
    ratio.add_argument("--codebook-dtype", choices=["float32", "float16"], default="float32")
    ratio.set_defaults(func=commands.cmd_ratio)
    return parser
