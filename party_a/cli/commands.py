"""The ``fedlite-a`` subcommands, one function each: parsed flags in, exit code out.

Each raises :class:`party_a.errors.FedliteError` (or ValueError / OSError) for
:func:`party_a.cli.main` to turn into one line on stderr and an exit code.
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from party_a.cli.options import connection, local_runs, run_not_found, session_from_args
from party_a.cli.report import privacy_lines, progress, summary_rows, true_label_estimates
from party_a.errors import ConfigError, RunNotFound
from party_a.phases import phase
from party_a.session import open_state

if TYPE_CHECKING:
    from party_a.store import LocalRun, LocalStore
    from party_a.transport.http import HttpTransport
    from party_a.transport.parties import PartyTransport

__all__ = [
    "cmd_align",
    "cmd_check",
    "cmd_delete",
    "cmd_demo_data",
    "cmd_evaluate",
    "cmd_export",
    "cmd_finish",
    "cmd_predict",
    "cmd_ratio",
    "cmd_runs",
    "cmd_show",
    "cmd_train",
]


# ====================================================================== ratio


def cmd_ratio(args: argparse.Namespace) -> int:
    from shared.accounting import PAPER_PHI, compression_report  # torch: only for this command

    try:
        report = compression_report(
            d=args.d,
            batch=args.batch,
            q=args.q,
            L=args.L,
            R=args.R,
            phi=args.phi if args.phi is not None else PAPER_PHI,
            codebook_dtype=args.codebook_dtype,
        )
    except ValueError as exc:
        print(f"fedlite-a ratio: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


# ====================================================================== connection


def _transport(
    args: argparse.Namespace,
    server: str,
    token: str,
    *,
    timeout: float = 120.0,
    local: "LocalRun | None" = None,
) -> "HttpTransport":
    """party A's client of party B at ``server``, with the command line's CA bundle and retry
    budget; ``timeout`` per request, in seconds (the client's default). For ``local``, a run
    trained as one feature party of several, that party's routes."""
    from party_a.transport.http import HttpTransport
    from party_a.transport.parties import PartyTransport

    party = local.config.get("run", {}).get("party") if local is not None else None
    if party is not None:
        return PartyTransport(
            server,
            token,
            party=party,
            ca_bundle=args.ca_bundle,
            retry_for=args.retry_for,
            timeout=timeout,
        )
    return HttpTransport(
        server,
        token,
        ca_bundle=args.ca_bundle,
        client_cert=args.client_cert,
        client_key=args.client_key,
        retry_for=args.retry_for,
        timeout=timeout,
    )


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when party B answers and accepts the token (the image's health check): an API
    token, or a feature party's token of a run with several (docs/PROTOCOL.md 12)."""
    from party_a.errors import Unauthorized

    server, token = connection(args)
    party: dict[str, str] = {}
    with _transport(args, server, token, timeout=10.0) as t:
        try:
            info = t.psi_info()  # authenticated: a revoked token fails here
        except Unauthorized as refused:
            try:
                me = t.whoami()  # a feature party's token, perhaps
            except Unauthorized:
                raise refused from None  # neither: party B's first answer says why
            with _party_transport(args, server, token, party=me.party) as as_party:
                info = as_party.psi_info()
            party = {"run": me.run_id, "party": me.party}
    print(json.dumps({"server": server, "ok": True, "party_b_ids": info.size, **party}))
    return 0


def _party_transport(
    args: argparse.Namespace, server: str, token: str, *, party: str | None = None
) -> "PartyTransport":
    """The transport of the party a party token acts for (``party``, ``--party``, else what
    the token says: ``GET /v1/party``)."""
    from party_a.transport.parties import PartyTransport

    party = party or getattr(args, "party", None)
    if party is None:
        with _transport(args, server, token, timeout=10.0) as plain:
            party = plain.whoami().party
    return PartyTransport(
        server, token, party=party, ca_bundle=args.ca_bundle, retry_for=args.retry_for
    )


# ====================================================================== align


def cmd_align(args: argparse.Namespace) -> int:
    from party_a.alignment import private_intersection
    from shared.idtables import read_id_table

    server, token = connection(args)
    ids = read_id_table(args.features, id_column=args.id_column).ids
    store = open_state(args.state_dir, create=True)
    from party_a.errors import Unauthorized

    transport = (
        _transport(args, server, token)
        if getattr(args, "party", None) is None
        else _party_transport(args, server, token)
    )
    try:
        try:
            result, cached = private_intersection(
                ids, transport=transport, store=store, server=server.rstrip("/"), force=args.force
            )
        except Unauthorized:
            if getattr(args, "party", None) is not None:
                raise
            transport.close()  # a feature party's token? its party's routes
            transport = _party_transport(args, server, token)
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


# ====================================================================== train


def cmd_train(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from party_a.transport.http import HttpTransport

    console = Console(stderr=True)
    with session_from_args(args, create=True) as (trainer, remote):
        assert remote is not None
        console.print(
            f"run [bold]{remote.id}[/] ({remote.name}): {remote.status.value}, party B at step "
            f"{remote.step}, party A at step {trainer.step}; "
            f"{remote.alignment.aligned if remote.alignment else '?'} aligned samples"
        )
        for line in privacy_lines(remote.privacy):  # label DP: what the user reads, and why
            console.print(line, markup=False)
        if trainer.step < trainer.config.run.steps:
            phase("training: steps %d to %d", trainer.step + 1, trainer.config.run.steps)
        with progress(console, total=trainer.config.run.steps, start=trainer.step) as on_step:
            trainer.on_step = on_step
            summary = trainer.train()
        metrics: dict[str, float] = {}
        if not args.no_evaluate and len(trainer.eval_pos):
            phase("evaluating on %s held-out samples", f"{len(trainer.eval_pos):,}")
            answer = trainer.evaluate("eval")
            metrics = {
                "eval_loss": answer.loss,
                **{f"eval_{k}": v for k, v in answer.metrics.items()},
            }
            summary.eval_metrics = metrics
        if not args.no_finish:
            trainer.finish()
        transport = trainer.transport
        assert isinstance(transport, HttpTransport)
        http = (transport.bytes_sent, transport.bytes_received)

    table = Table(title="FedLite-VFL training summary", show_header=False)
    evaluated = len(trainer.eval_pos) if metrics else 0
    for key, value in summary_rows(summary, metrics, http, run=remote, evaluated=evaluated):
        table.add_row(key, value)
    console.print(table)
    if args.summary_json:
        data = {
            **summary.__dict__,
            "compression": summary.compression,
            "http_bytes_sent": http[0],
            "http_bytes_received": http[1],
        }
        text = json.dumps(_json_number(data), indent=2, default=str, allow_nan=False)
        Path(args.summary_json).write_text(text + "\n")
    return 0


# ====================================================================== evaluate / predict


def cmd_demo_data(args: argparse.Namespace) -> int:
    from shared.demo_data import write_party_a_demo

    start, sep, stop = str(args.columns).partition(":")
    if not (sep and start.isdigit() and stop.isdigit()):
        raise ConfigError(f"--columns takes START:STOP, e.g. 0:10, got {args.columns!r}")
    columns = (int(start), int(stop))
    print(write_party_a_demo(args.out, overlap=args.overlap, seed=args.seed, columns=columns))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """One JSON line: the split's loss and metrics as party B computed them; under party B's
    label DP they are on the run's randomized labels ("labels": "randomized"), and the
    held-out split's also come with estimates of the true-label ones, as ``train`` shows."""
    with session_from_args(args, create=False) as (trainer, remote):
        phase("evaluating the %s split", args.split)
        answer = trainer.evaluate(args.split, raw=args.raw)
    split = f"{args.split}+raw" if args.raw else args.split
    shown: dict[str, object] = {"split": split, "n": answer.n, "loss": answer.loss}
    shown |= answer.metrics
    privacy = remote.privacy if remote is not None else None
    if privacy is not None:
        shown["labels"] = "randomized" if privacy.label_dp else "true"
    if args.split == "eval":
        estimates = true_label_estimates(answer.metrics, remote, answer.n)
        if estimates:
            shown["true_label_estimates"] = {k: vars(e) for k, e in estimates.items()}
    # a value party B withholds (NaN) is null: JSON has no NaN, and "NaN" breaks parsers
    print(json.dumps(_json_number(shown)))
    return 0


def _json_number(value: object) -> object:
    """``value`` with every NaN or infinite float (a withheld loss) as None, in dicts too."""
    if isinstance(value, dict):
        return {k: _json_number(v) for k, v in value.items()}
    return None if isinstance(value, float) and not math.isfinite(value) else value


def cmd_predict(args: argparse.Namespace) -> int:
    """Scores for --ids, --ids-file or --all, in requests within party B's limits, written as
    they come (``party_a.cli.scores``: --out resumes after an interruption)."""
    from rich.console import Console

    from party_a import inference
    from party_a.cli.scores import columns_line, ids_digest, open_sink, progress

    listed = _listed_ids(args)
    with session_from_args(args, create=False, serving=True) as (trainer, _remote):
        common = trainer.common_ids()
        ids = listed if listed is not None else _held_ids(trainer.features.ids, common)
        view = trainer.view()
        bounds = inference.request_bounds(view, args.chunk_size, ask=True)
        columns = columns_line(view.transport.get_run(view.local.remote_id).classes)
        if columns is not None:  # which probability each column is: party B's classes
            phase("scores: %s", columns)
        job = {
            "server": trainer.server,
            "run": view.local.remote_id,
            "step": view.step,
            "raw": args.raw,
            "ids": len(ids),
            "ids_sha256": ids_digest(ids),
        }
        with open_sink(args.out, job, id_column=args.id_column) as sink:
            if sink.done:
                done, total = f"{sink.done:,}", f"{len(ids):,}"
                phase("resuming %s: %s of %s ids scored already", args.out, done, total)
            phase("scoring %s ids, at most %s a request", f"{len(ids):,}", f"{bounds.ids:,}")
            todo = ids[sink.done :]  # empty when a run was cut off after its last request
            answers = (
                inference.predict_stream(
                    view, trainer.features, common, todo, raw=args.raw, bounds=bounds
                )
                if todo
                else iter(())
            )
            console = Console(stderr=True)
            with progress(console, total=len(ids), done=sink.done) as advance:
                for answer in answers:
                    sink.write(answer.ids, answer.scores)
                    advance(len(answer.ids))
    return 0


def _listed_ids(args: argparse.Namespace) -> list[str] | None:
    """The ids of --ids and --ids-file (one a line), or None for --all; read before the
    session, so that a missing file is told at once."""
    ids = [i for i in (args.ids or "").split(",") if i]
    if args.ids_file:
        with open(args.ids_file) as lines:
            ids += [line.strip() for line in lines if line.strip()]
    if args.all:
        if ids:
            raise ConfigError("give --all or ids (--ids, --ids-file), not both")
        return None
    if not ids:
        raise ConfigError("give ids with --ids a,b,c or --ids-file FILE, or --all")
    return ids


def _held_ids(table_ids: list[str], common: set[str]) -> list[str]:
    """--all: every id of the feature table that party B holds, in the table's order."""
    ids = [i for i in table_ids if i in common]
    if not ids:
        raise ConfigError("party B holds none of the feature table's ids: nothing to score")
    phase(
        "--all: %s of the table's %s ids are at party B (the private set intersection)",
        f"{len(ids):,}",
        f"{len(table_ids):,}",
    )
    return ids


# ====================================================================== finish / runs


def _run_name(args: argparse.Namespace) -> str:
    if args.name:
        return str(args.name)
    if args.config is None:
        raise ConfigError("give the run with --name NAME or --config run.toml")
    from party_a.config import load_config

    return load_config(args.config, {}).run.name


def cmd_finish(args: argparse.Namespace) -> int:
    """Finish a run this state holds (one trained with --no-finish); needs no feature table."""
    server, token = connection(args)
    server = server.strip().rstrip("/")
    name = _run_name(args)
    store = open_state(args.state_dir, create=False)
    try:
        local = store.find_run(server, name)
        if local is None:
            raise run_not_found(RunNotFound(name, server), store, args.state_dir)
        with _transport(args, server, token, local=local) as transport:
            remote = transport.finish(local.remote_id)
        store.update_run(local.id, status="finished")
    finally:
        store.close()
    print(json.dumps({"run": remote.id, "name": remote.name, "status": remote.status.value}))
    return 0


def _local_run(args: argparse.Namespace, store: "LocalStore") -> tuple[str, "LocalRun"]:
    """(party B's URL, the run named by --name / --config) from party A's state, or exit 2."""
    server, _token = connection(args)
    server = server.strip().rstrip("/")
    name = _run_name(args)
    local = store.find_run(server, name)
    if local is None:
        raise run_not_found(RunNotFound(name, server), store, args.state_dir)
    return server, local


def cmd_show(args: argparse.Namespace) -> int:
    """A run as party B and party A see it: status, step, checkpoints, sizes (JSON)."""
    store = open_state(args.state_dir, create=False)
    try:
        server, local = _local_run(args, store)
        with _transport(args, server, connection(args)[1], local=local) as transport:
            remote = transport.get_run(local.remote_id)
        shown = {
            "party_b": json.loads(remote.model_dump_json(exclude={"alignment_key"})),
            "party_a": {
                "status": local.status,
                "checkpoints": store.checkpoint_steps(local.id),
                "serving_codebook_step": getattr(store.serving(local.id), "codebook_step", None),
            },
        }
    finally:
        store.close()
    print(json.dumps(shown, indent=2, default=str))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete a run at party B (frees its quota; gone already is fine) and in party A's state."""
    from party_a.errors import NotFound

    store = open_state(args.state_dir, create=False)
    try:
        server, local = _local_run(args, store)
        with _transport(args, server, connection(args)[1], local=local) as transport:
            try:
                transport.delete_run(local.remote_id)
            except NotFound:
                pass  # deleted at party B already (or by its operator): forget it here too
        store.delete_run(local.id)
    finally:
        store.close()
    print(json.dumps({"deleted": local.name, "run": local.remote_id, "server": server}))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    """One line per run in party A's state: name, status, party B's URL and run id."""
    store = open_state(args.state_dir, create=False)
    try:
        for run in local_runs(store):
            steps = store.checkpoint_steps(run.id)
            newest = steps[-1] if steps else 0
            print(f"{run.name}\t{run.status}\tcheckpoint {newest}\t{run.server}\t{run.remote_id}")
    finally:
        store.close()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write a trained run's half of the model, with what serving it needs, to --out."""
    from party_a.cli.export import export_run

    name = _run_name(args)
    server = (args.server or os.environ.get("FEDLITE_A_SERVER") or "").strip().rstrip("/")
    store = open_state(args.state_dir, create=False)
    try:
        runs = [r for r in local_runs(store) if r.name == name and server in ("", r.server)]
        if not runs:
            raise run_not_found(RunNotFound(name, server or "any server"), store, args.state_dir)
        if len(runs) > 1:
            raise ConfigError(
                f"runs named {name!r} for several party B servers: pick one with --server "
                f"({', '.join(r.server for r in runs)})"
            )
        manifest = export_run(store, runs[0], args.out)
    finally:
        store.close()
    print(json.dumps({"export": str(args.out), "run": name, "step": manifest["step"]}))
    return 0
