"""``fedlite-a``: party A's command line (the feature holder).

    fedlite-a align    --server URL --token T --features FILE --id-column id
                                             private set intersection with party B (cached)
    fedlite-a train    --server URL --token T --features FILE --id-column id --config run.toml
    fedlite-a evaluate (same flags)          held-out metrics, computed at party B
    fedlite-a predict  (same flags) --ids a,b,c   scores for given ids (serving)
    fedlite-a ratio    --d 9216 --batch 20 --q 1152 --L 2   message sizes, no server needed
    fedlite-a check    --server URL --token T   is party B reachable and the token valid?
    fedlite-a demo-data --out FILE           party A's half of the bundled demo data

The token may come from FEDLITE_A_TOKEN and the server from FEDLITE_A_SERVER instead of flags
(keeps the secret out of the process list). Party A's state (checkpoints, step log) lives in
``--state-dir`` (default ./fedlite-a-state); ``train`` resumes from it on its own.
"""

import argparse
import csv
import json
import logging
import os
import sys
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from party_a.errors import FedliteError
from shared.accounting import PAPER_PHI, compression_report

__all__ = ["main"]

log = logging.getLogger("fedlite.party_a")


# ====================================================================== ratio


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


# ====================================================================== connection


def _connection(args: argparse.Namespace) -> tuple[str, str]:
    server = args.server or os.environ.get("FEDLITE_A_SERVER")
    token = args.token or os.environ.get("FEDLITE_A_TOKEN")
    if not server or not token:
        raise FedliteError("need --server and --token (or FEDLITE_A_SERVER / FEDLITE_A_TOKEN)")
    return server, token


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help="party B's base URL (or FEDLITE_A_SERVER)")
    parser.add_argument("--token", help="API token issued by party B (or FEDLITE_A_TOKEN)")
    parser.add_argument(
        "--ca-bundle",
        type=Path,
        default=os.environ.get("FEDLITE_A_CA_BUNDLE") or None,
        help="CA certificates to trust for party B's TLS certificate (or FEDLITE_A_CA_BUNDLE)",
    )
    parser.add_argument(
        "--retry-for", type=float, default=300.0, help="seconds to keep retrying party B"
    )


def _cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when party B answers and accepts the token (the image's health check)."""
    from party_a.client import HttpTransport

    server, token = _connection(args)
    with HttpTransport(server, token, ca_bundle=args.ca_bundle, retry_for=args.retry_for) as t:
        info = t.psi_info()  # authenticated: a revoked token fails here
    print(json.dumps({"server": server, "ok": True, "party_b_ids": info.size}))
    return 0


# ====================================================================== align


def _cmd_align(args: argparse.Namespace) -> int:
    from party_a.alignment import private_intersection
    from party_a.client import HttpTransport
    from party_a.state import LocalStore
    from shared.tables import read_id_table

    server, token = _connection(args)
    ids = read_id_table(args.features, id_column=args.id_column).ids
    store = LocalStore.in_directory(args.state_dir)
    transport = HttpTransport(server, token, ca_bundle=args.ca_bundle, retry_for=args.retry_for)
    try:
        result, cached = private_intersection(
            ids, transport=transport, store=store, server=server.rstrip("/"), force=args.force
        )
    finally:
        transport.close()
        store.close()
    if args.ids_out:
        Path(args.ids_out).write_text("".join(f"{i}\n" for i in result.intersection))
    report = {
        "intersection": len(result.intersection),
        "party_a_ids": result.own_size,
        "party_b_ids": result.peer_size,
        "party_a_version": result.own_version[:16],
        "party_b_version": result.peer_version,
        "cached": cached,
        "seconds": round(result.seconds, 3),
    }
    print(json.dumps(report))
    return 0


# ====================================================================== session set-up


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Flags that override the config file, as dotted keys."""
    named = {
        "name": "run.name",
        "model": "run.model",
        "steps": "run.steps",
        "batch_size": "run.batch_size",
        "seed": "run.seed",
        "checkpoint_interval": "run.checkpoint_interval",
        "eval_fraction": "run.eval_fraction",
        "mode": "quantizer.mode",
        "q": "quantizer.q",
        "L": "quantizer.L",
        "R": "quantizer.R",
        "lam": "quantizer.lambda",
    }
    out: dict[str, Any] = {}
    for attr, key in named.items():
        value = getattr(args, attr, None)
        if value is not None:
            out[key] = value
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise FedliteError(f"--set takes key=value, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = value  # a bare string
    return out


@contextmanager
def _session(args: argparse.Namespace) -> Iterator[Any]:
    """Config, features, transport, local store and trainer, ready to prepare()."""
    from party_a.client import HttpTransport
    from party_a.config import load_config
    from party_a.features import load_features
    from party_a.state import LocalStore
    from party_a.trainer import PartyATrainer

    server, token = _connection(args)
    config = load_config(args.config, _overrides(args))
    features = load_features(
        args.features,
        id_column=args.id_column,
        feature_columns=config.data.feature_columns or None,
        standardize=config.data.standardize,
        group_column=config.data.group_column,
    )
    store = LocalStore.in_directory(args.state_dir)
    transport = HttpTransport(server, token, ca_bundle=args.ca_bundle, retry_for=args.retry_for)
    try:
        yield PartyATrainer(
            config=config,
            features=features,
            transport=transport,
            store=store,
            server=server.rstrip("/"),
        )
    finally:
        transport.close()
        store.close()


# ====================================================================== train


def _cmd_train(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    with _session(args) as trainer:
        remote = trainer.prepare()
        console.print(
            f"run [bold]{remote.id}[/] ({remote.name}): {remote.status.value}, party B at step "
            f"{remote.step}, party A at step {trainer.step}; "
            f"{remote.alignment.aligned if remote.alignment else '?'} aligned samples"
        )
        with _progress(console, trainer) as on_step:
            trainer.on_step = on_step
            summary = trainer.train()
        metrics: dict[str, float] = {}
        if not args.no_evaluate and len(trainer.eval_pos):
            answer = trainer.evaluate("eval")
            metrics = {
                "eval_loss": answer.loss,
                **{f"eval_{k}": v for k, v in answer.metrics.items()},
            }
            summary.eval_metrics = metrics
        if not args.no_finish:
            trainer.finish()

    table = Table(title="FedLite-VFL training summary", show_header=False)
    rows: list[tuple[str, str]] = [
        ("run", summary.run_id),
        ("steps", f"{summary.last_step} / {summary.steps}"),
        ("last batch loss", f"{summary.last_loss:.4f}"),
        ("uplink bytes sent", f"{summary.bytes_sent:,}"),
        ("SplitFed would send", f"{summary.raw_bytes:,}"),
        ("compression", f"{summary.compression:.1f}x"),
        ("downlink bytes", f"{summary.bytes_received:,}"),
        ("id alignment bytes", f"{summary.alignment_bytes:,}"),
        ("rollbacks", str(summary.rollbacks)),
        ("time", f"{summary.seconds:.1f} s"),
    ]
    rows += [(k.replace("_", " "), f"{v:.4f}") for k, v in metrics.items()]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if args.summary_json:
        data = {**summary.__dict__, "compression": summary.compression}
        Path(args.summary_json).write_text(json.dumps(data, indent=2, default=str) + "\n")
    return 0


@contextmanager
def _progress(console: Any, trainer: Any) -> Iterator[Any]:
    """A live progress bar on a terminal; a log line every ~5% of the run otherwise."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    total = trainer.config.run.steps
    if console.is_terminal:
        progress = Progress(
            TextColumn("step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TextColumn("sent {task.fields[sent]}"),
            TextColumn("{task.fields[ratio]:.0f}x"),
            TimeRemainingColumn(),
            console=console,
        )
        task = progress.add_task(
            "train", total=total, completed=trainer.step, loss=0.0, sent="0 B", ratio=1.0
        )

        def update(result: Any, summary: Any) -> None:
            progress.update(
                task,
                completed=result.step,
                loss=result.loss,
                sent=_human(summary.bytes_sent),
                ratio=summary.compression,
            )

        with progress:
            yield update
        return

    every = max(1, total // 20)

    def report(result: Any, summary: Any) -> None:
        if result.step % every == 0 or result.step == total:
            console.print(
                f"step {result.step}/{total} loss {result.loss:.4f} "
                f"sent {_human(summary.bytes_sent)} ({summary.compression:.0f}x less than SplitFed)"
            )

    yield report


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# ====================================================================== evaluate / predict


def _overlap_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--overlap",
        type=float,
        default=1.0,
        help="fraction of the ids both parties hold (give both parties the same value)",
    )
    parser.add_argument("--seed", type=int, default=0, help="which ids are not shared")


def _cmd_demo_data(args: argparse.Namespace) -> int:
    from shared.demo_data import write_party_a_demo

    print(write_party_a_demo(args.out, overlap=args.overlap, seed=args.seed))
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    with _session(args) as trainer:
        trainer.prepare()
        answer = trainer.evaluate(args.split, raw=args.raw)
    split = f"{args.split}+raw" if args.raw else args.split
    print(json.dumps({"split": split, "n": answer.n, "loss": answer.loss, **answer.metrics}))
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    ids = [i for i in (args.ids or "").split(",") if i]
    if args.ids_file:
        ids += [
            line.strip() for line in Path(args.ids_file).read_text().splitlines() if line.strip()
        ]
    if not ids:
        raise FedliteError("give ids with --ids a,b,c or --ids-file FILE")
    with _session(args) as trainer:
        trainer.prepare()
        answer = trainer.predict(ids)
    out = open(args.out, "w", newline="") if args.out else sys.stdout  # noqa: SIM115
    try:
        writer = csv.writer(out)
        writer.writerow(["id", *[f"score_{c}" for c in range(answer.scores.shape[1])]])
        for i, row in zip(answer.ids, answer.scores.tolist(), strict=True):
            writer.writerow([i, *[f"{v:.6f}" for v in row]])
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


# ====================================================================== parser


def _data_flags(parser: argparse.ArgumentParser) -> None:
    _connection_flags(parser)
    parser.add_argument(
        "--features", type=Path, required=True, help="feature table: CSV, Parquet, npz"
    )
    parser.add_argument("--id-column", default="id", help="sample-id column (default 'id')")
    parser.add_argument(
        "--state-dir", type=Path, default=Path("fedlite-a-state"), help="party A's local state"
    )


def _session_flags(parser: argparse.ArgumentParser) -> None:
    _data_flags(parser)
    parser.add_argument("--config", type=Path, help="run config (TOML); flags override it")
    parser.add_argument("--name", help="run name (config [run] name)")
    parser.add_argument("--model", help="split model (config [run] model)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--checkpoint-interval", type=int)
    parser.add_argument("--eval-fraction", type=float)
    parser.add_argument("--mode", choices=["pq", "raw"], help="pq = FedLite, raw = SplitFed")
    parser.add_argument("--q", type=int, help="subvectors per activation")
    parser.add_argument("--L", type=int, help="centroids per group")
    parser.add_argument("--R", type=int, help="groups")
    parser.add_argument("--lambda", dest="lam", type=float, help="gradient correction strength")
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="any config key, e.g. optimizer.bottom.lr=0.01",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedlite-a", description="FedLite-VFL party A: the feature holder's trainer."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log retries and recovery")
    sub = parser.add_subparsers(dest="command", required=True)

    align = sub.add_parser(
        "align",
        help="private set intersection of sample ids with party B (cached; train runs it too)",
        description="Run an ECDH private set intersection with party B and cache the result "
        "in --state-dir under the pair of dataset versions. Neither party learns the other's "
        "ids outside the intersection. Prints one JSON object.",
    )
    _data_flags(align)
    align.add_argument("--force", action="store_true", help="rerun even when cached")
    align.add_argument("--ids-out", type=Path, help="also write the common ids, one a line")
    align.set_defaults(func=_cmd_align)

    check = sub.add_parser("check", help="is party B reachable, and does it accept the token?")
    _connection_flags(check)
    check.set_defaults(func=_cmd_check)

    train = sub.add_parser("train", help="train (or resume) a run with party B")
    _session_flags(train)
    train.add_argument("--no-evaluate", action="store_true", help="skip the held-out evaluation")
    train.add_argument("--no-finish", action="store_true", help="leave the run open at party B")
    train.add_argument("--summary-json", type=Path, help="also write the summary as JSON")
    train.set_defaults(func=_cmd_train)

    evaluate = sub.add_parser("evaluate", help="held-out metrics of a run (computed at party B)")
    _session_flags(evaluate)
    evaluate.add_argument("--split", choices=["eval", "train"], default="eval")
    evaluate.add_argument(
        "--raw",
        action="store_true",
        help="send unquantized activations (a FedLite run's model without compression)",
    )
    evaluate.set_defaults(func=_cmd_evaluate)

    predict = sub.add_parser("predict", help="party B's scores for given ids (serving)")
    _session_flags(predict)
    predict.add_argument("--ids", help="comma-separated ids")
    predict.add_argument("--ids-file", type=Path, help="one id per line")
    predict.add_argument("--out", type=Path, help="CSV to write (default stdout)")
    predict.set_defaults(func=_cmd_predict)

    demo = sub.add_parser(
        "demo-data", help="write party A's half of the bundled breast-cancer demo data (CSV)"
    )
    demo.add_argument("--out", type=Path, default=Path("party_a_features.csv"))
    _overlap_flags(demo)
    demo.set_defaults(func=_cmd_demo_data)

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
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    try:
        code: int = args.func(args)
    except FedliteError as exc:
        print(f"fedlite-a {args.command}: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"fedlite-a {args.command}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
