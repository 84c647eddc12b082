"""``fedlite-b``: party B's command line (the label holder's service).

    fedlite-b serve                      the HTTP(S) service (every flag is also FEDLITE_B_<FLAG>)
    fedlite-b token issue|revoke|list    API tokens (issue refuses an existing name: --rotate)
    fedlite-b token budget --name N      a token's label-DP spend, and its cap (--epsilon X)
    fedlite-b privacy draws|redraw       the label tables' draws of randomized labels
    fedlite-b evaluate RUN               a run's evaluations on the true labels (operator only)
    fedlite-b db backup --to FILE        online backup of the SQLite file, safe while serving
    fedlite-b db copy --from URL --to URL   move the state to another database (B stopped)
    fedlite-b runs list|show ID|delete ID   every caller's runs (delete: party B stopped)
    fedlite-b audit [--totals] [--jsonl]  who did what to which run, with how many ids, when
    fedlite-b parties create|tokens|revoke|list   runs with several feature parties
    fedlite-b health                     exit 0 if the local server answers /healthz
    fedlite-b export --run ID --out DIR  a trained run's top model and transform, for serving
    fedlite-b demo-data --out FILE       party B's half of the bundled demo data

Global flags (``-v``, ``--log-format``, ``--version``) go before or after the subcommand.
Every mistake is one line on stderr naming the file or setting and the fix. Exit codes: 0
done; 1 the request failed (no such token, backup refused, server unhealthy); 2 a
configuration or start-up error (bad flag or FEDLITE_B_* variable, missing or mismatched
file), which a restart will not fix.
"""

import argparse
import logging
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from party_b.errors import MaintenanceError, StartupError
from party_b.settings import settings_from_flags
from shared.types import DECLARED_TYPES

# The database and admin modules (SQLAlchemy: ~0.3 s to import) load in the commands that use
# them: ``fedlite-b health``, a container's and Kubernetes' probe every few seconds, needs none

__all__ = ["build_parser", "main"]


# ====================================================================== serve / health


def _cmd_serve(args: argparse.Namespace) -> int:
    from party_b.ops import logs
    from party_b.ops.maintenance import create_private_database
    from party_b.ops.preflight import check_files
    from party_b.store import sole

    settings = settings_from_flags(args)
    check_files(settings)  # before the slow imports: a wrong file is reported at once
    config = logs.configure(
        level=settings.log_level, fmt=settings.log_format, access=settings.access_log
    )
    if settings.database_url is None:
        create_private_database(settings.resolved_database_url())
    try:  # before anything reads the file: a second party B on it is refused here
        sole.hold(settings.resolved_database_url())
    except sole.SQLiteInUse as exc:
        raise StartupError(str(exc)) from None
    log = logging.getLogger("fedlite.party_b")
    log.info("starting party B: loading torch and the web framework")

    import threading

    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from party_b.api import create_app
    from party_b.device import use_device
    from party_b.drain import DrainingServer, checkpoint_live_runs
    from party_b.ops.mtls import tls_protocol
    from shared import threads

    if settings.torch_threads:
        threads.pin(settings.torch_threads)  # every run's steps then take it (shared.threads)
    use_device(settings.device)  # before any run loads: StartupError naming the fix
    app = create_app(settings)
    _check_tokens(settings, log)
    _record_served(settings)  # before the port opens: `parties create` then reads it
    # party B's blinded ids, built now (seconds per 10,000 ids) and not on party A's first PSI
    threading.Thread(
        target=app.state.service.alignment.warm_up, name="psi-set-up", daemon=True
    ).start()
    from party_b.service.warmup import warm_up

    # before the port opens (and the first health check passes): a run taken over waits for
    # none of torch's lazy imports
    log.info("warmed up in %.1f s", warm_up())
    server_config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=config,
        log_level=settings.log_level,
        access_log=settings.access_log != "off",
        ssl_certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
        ssl_keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        # mutual TLS: a client certificate from these CAs, or no handshake
        ssl_ca_certs=str(settings.ssl_ca_certs) if settings.ssl_ca_certs else None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if settings.ssl_ca_certs else ssl.CERT_NONE,
        http=tls_protocol(AutoHTTPProtocol),  # the client certificate's subject, to the app
        timeout_graceful_shutdown=10,
    )
    server = DrainingServer(  # SIGTERM: drain, checkpoint every live run, stop
        server_config,
        lifecycle=app.state.lifecycle,
        checkpoint=lambda: checkpoint_live_runs(app.state.service),
        drain_seconds=settings.drain_seconds,
    )
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl+C, re-raised by uvicorn once it has stopped cleanly
        pass
    if not server.started:  # e.g. the port is taken: uvicorn logged why (as uvicorn.run does)
        sys.exit(3)
    return 0


def _check_tokens(settings: Any, log: logging.Logger) -> None:
    """StartupError unless some API token is active (nobody could use party B)."""
    from party_b import store

    engine = store.make_engine(settings.resolved_database_url())
    try:
        with store.make_session_factory(engine)() as session:
            active = store.active_tokens(session)
    finally:
        engine.dispose()  # an idle connection left open would keep the WAL from folding in
    if not active:
        raise StartupError(
            "no active API tokens; issue one with 'fedlite-b token issue --name <caller>' "
            "or set FEDLITE_B_TOKENS"
        )
    mutual = "on" if settings.ssl_ca_certs else "off"
    log.info("%d active API token(s); mutual TLS %s", len(active), mutual)


def _record_served(settings: Any) -> None:
    """Record in the database the privacy policy this party B gives new runs, for the runs
    ``fedlite-b parties create`` makes without ``--privacy`` (``party_b.store.served``)."""
    from party_b import store
    from party_b.store.engine import one_at_a_time

    engine = store.make_engine(settings.resolved_database_url())
    try:
        with one_at_a_time(engine), store.make_session_factory(engine)() as session:
            store.record_served(
                session, store.SERVED_PRIVACY, settings.privacy_policy().to_stored()
            )
            session.commit()
    finally:
        engine.dispose()


def _cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the local server answers /healthz, or with --ready /readyz (the
    container's health check; Kubernetes' probes of a replica that requires client
    certificates, which the kubelet's own probes cannot present)."""
    import urllib.request

    settings = settings_from_flags(args)
    scheme = "https" if settings.ssl_certfile else "http"
    route = "readyz" if args.ready else "healthz"
    url = f"{scheme}://127.0.0.1:{settings.port}/{route}"
    # Liveness of our own process on loopback: the certificate names the public host, not
    # 127.0.0.1, so it is not verified here (party A verifies it).
    context = None
    if scheme == "https":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        cert, key = args.client_cert, args.client_key
        if cert is None and settings.ssl_ca_certs is not None:
            # mutual TLS: present party B's own certificate (DEPLOY.md's CA makes it valid
            # for client authentication too)
            cert, key = settings.ssl_certfile, settings.ssl_keyfile
        if cert is not None:
            context.load_cert_chain(str(cert), str(key) if key else None)
    try:
        with urllib.request.urlopen(url, timeout=args.timeout, context=context) as response:
            ok = response.status == 200
    except OSError as exc:
        hint = ""
        if settings.ssl_ca_certs is not None:
            hint = (
                " (party B requires client certificates: pass --client-cert/--client-key "
                "signed by its --ssl-ca-certs CA)"
            )
        print(f"fedlite-b health: {url}: {exc}{hint}", file=sys.stderr)
        return 1
    print(f"{url}: {'ok' if ok else 'unhealthy'}")
    return 0 if ok else 1


def _cmd_demo_data(args: argparse.Namespace) -> int:
    from shared.demo_data import write_party_b_demo

    print(write_party_b_demo(args.out, overlap=args.overlap, seed=args.seed))
    return 0


# ====================================================================== parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedlite-vfl")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def _global_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """On the main parser and on every subcommand (SUPPRESS there, so that leaving a flag
    out after the subcommand keeps what was given before it)."""
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="debug logging (same as --log-level debug)",
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=default,
        help="text lines (default) or one JSON object per line (FEDLITE_B_LOG_FORMAT)",
    )
    parser.add_argument("--version", action="version", version=f"fedlite-b {_version()}")


def _add(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    child: argparse.ArgumentParser = sub.add_parser(name, **kwargs)
    _global_flags(child, top=False)
    return child


def _storage_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", type=Path, help="directory of party_b.sqlite (default ./fedlite-b-data)"
    )
    parser.add_argument("--database-url", help="SQLAlchemy URL (overrides --data-dir)")


def _label_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--labels", type=Path, help="label table: CSV(.gz) or Parquet")
    parser.add_argument("--id-column", help="sample-id column (default 'id')")
    parser.add_argument(
        "--label-column", help="label column (default 'y'; empty for rows only served)"
    )
    parser.add_argument(
        "--feature-columns", help="comma-separated feature columns (default: all others)"
    )
    parser.add_argument("--group-column", help="client column (the 'clients' batch schedule)")
    for flag, what in DECLARED_TYPES:
        parser.add_argument(
            f"--{flag}",
            metavar="COLUMNS",
            help=f"comma-separated feature columns that are {what}; the others are typed by "
            "what they hold",
        )
    parser.add_argument(
        "--max-categories", type=int, help="values a categorical column keeps (default 1000)"
    )
    parser.add_argument(
        "--min-frequency",
        type=int,
        help='a value in fewer labelled rows joins the "other" bucket (default 5)',
    )
    parser.add_argument(
        "--label-source", help="'module:factory' returning a LabelSource, instead of --labels"
    )


def _cmd_export(args: argparse.Namespace) -> int:
    import json

    from party_b.api.main import load_labels
    from party_b.ops.export import export_run

    settings = settings_from_flags(args)
    manifest = export_run(settings, load_labels(settings), args.run, args.out)
    print(json.dumps({"export": str(args.out), "run": args.run, "step": manifest["step"]}))
    return 0


def _serve_parser(sub: Any) -> None:
    serve = _add(sub, "serve", help="run the HTTP service")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    _storage_flags(serve)
    _label_flags(serve)
    serve.add_argument("--tokens", help="'name:token,...' to register at start-up")
    serve.add_argument(
        "--tokens-file",
        type=Path,
        help="TOML file of tokens with scope, expiry and certificate, registered at start-up "
        "(a mounted secret; party_b/token_file.py)",
    )
    serve.add_argument("--ssl-certfile", type=Path, help="TLS certificate (PEM)")
    serve.add_argument("--ssl-keyfile", type=Path, help="TLS private key (PEM, unencrypted)")
    serve.add_argument(
        "--ssl-ca-certs",
        type=Path,
        help="mutual TLS: require client certificates signed by these CAs (PEM)",
    )
    serve.add_argument(
        "--trusted-proxy-subject",
        help="behind a load balancer that verifies client certificates: its own client "
        "certificate's subject; on its connections the caller is the certificate it names "
        "(header X-Fedlite-Client-Subject); needs --ssl-ca-certs",
    )
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--access-log",
        choices=["quiet", "all", "off"],
        help="HTTP access lines (default quiet: none for successful steps, /healthz, /metrics)",
    )
    serve.add_argument(
        "--privacy",
        help="label privacy of new runs (docs/PRIVACY.md): 'protected' (default: label "
        "differential privacy, no loss or accuracy in step replies), 'off' (logged as your "
        "choice), 'recommended' (Marvell's noise), optionally with overrides, e.g. "
        "'protected,label_epsilon=2'",
    )
    serve.add_argument(
        "--torch-threads",
        type=int,
        help="intra-op threads of every step (default: chosen per run from its top model's "
        "size and the cores, shared/threads.py)",
    )
    serve.add_argument(
        "--device", help="where the top models compute: cpu (default), cuda, cuda:N or auto"
    )
    serve.add_argument("--worker-threads", type=int, help="concurrent torch requests")
    serve.add_argument(
        "--max-live-runs", type=int, help="training runs kept in memory (default 32; LRU out)"
    )
    serve.add_argument(
        "--max-live-bytes", type=int, help="bytes of training runs kept in memory (default: any)"
    )
    serve.add_argument(
        "--replica-id", help="this process's name in the run leases (replicas on one database)"
    )
    serve.set_defaults(func=_cmd_serve)


def _token_parser(sub: Any) -> None:
    from party_b.ops import admin

    token = _add(sub, "token", help="issue, revoke and list API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    issue = _add(token_sub, "issue", help="create a token and print it once")
    issue.add_argument("--name", required=True, help="who the token is for")
    issue.add_argument(
        "--rotate", action="store_true", help="replace the token of an existing name"
    )
    issue.add_argument("--out", type=Path, help="write the token to this new file (mode 600)")
    issue.add_argument(
        "--scope",
        help="what the token may do: train (runs, alignment, steps, evaluate), predict "
        "(scores only), read (look only), or all (default); comma-separated for several",
    )
    issue.add_argument(
        "--expires",
        help="when the token stops working: a duration (30d, 12h, 2w) or a UTC date "
        "(2027-01-31); default never",
    )
    issue.add_argument(
        "--subject",
        help="bind the token to a client certificate (mutual TLS): its subject as "
        "`openssl x509 -noout -subject -nameopt RFC2253` prints it, e.g. 'CN=bank-a,O=Bank A'",
    )
    issue.add_argument(
        "--certificate-only",
        action="store_true",
        help="with --subject: the certificate alone identifies the caller (no bearer token)",
    )
    issue.add_argument(
        "--runs-of",
        metavar="NAME",
        help="act on the runs of the token NAME (e.g. a predict-only token for a scoring "
        "partner, on the runs the training token made)",
    )
    _storage_flags(issue)
    issue.set_defaults(func=admin.cmd_token_issue)
    revoke = _add(token_sub, "revoke", help="revoke a token (takes effect at once)")
    revoke.add_argument("--name", required=True)
    _storage_flags(revoke)
    revoke.set_defaults(func=admin.cmd_token_revoke)
    listing = _add(
        token_sub, "list", help="list tokens: state (active, revoked, expired), scope, expiry"
    )
    _storage_flags(listing)
    listing.set_defaults(func=admin.cmd_token_list)
    from party_b.ops import budget_admin

    budget = _add(
        token_sub,
        "budget",
        help="a token's label-DP epsilon spent over its runs, and its cap (set or remove)",
        description="Without --epsilon or --none, shows what the token's runs spent. A run "
        "creation that would take the token past its cap is refused (problem "
        "privacy-budget-exceeded); a run without label DP has no bound, and no cap covers it.",
    )
    budget.add_argument("--name", required=True, help="the token's name")
    cap = budget.add_mutually_exclusive_group()
    cap.add_argument("--epsilon", type=budget_admin.epsilon_value, help="set the cap")
    cap.add_argument("--none", action="store_true", help="remove the cap")
    _storage_flags(budget)
    budget.set_defaults(func=budget_admin.cmd_token_budget)


def _db_parser(sub: Any) -> None:
    from party_b.ops import admin

    db = _add(sub, "db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    copy = _add(
        db_sub,
        "copy",
        help="copy party B's state to another, empty database (e.g. SQLite -> PostgreSQL)",
        description="Stop party B first. Copies tokens, runs, step logs, checkpoints, "
        "evaluations and PSI keys in one transaction; then start party B with "
        "--database-url TARGET.",
    )
    copy.add_argument("--from", dest="source", required=True, help="source SQLAlchemy URL")
    copy.add_argument("--to", dest="target", required=True, help="target SQLAlchemy URL")
    copy.set_defaults(func=admin.cmd_db_copy)
    backup = _add(
        db_sub,
        "backup",
        help="online backup of the SQLite file to a new file (safe while serving; mode 600)",
    )
    _storage_flags(backup)
    backup.add_argument("--to", required=True, type=Path, help="backup file to create")
    backup.set_defaults(func=admin.cmd_db_backup)


def _runs_parser(sub: Any) -> None:
    from party_b.ops import runs_admin

    runs = _add(sub, "runs", help="every caller's runs: list, show, delete")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    listing = _add(runs_sub, "list", help="id, name, owner, status, newest checkpoint")
    _storage_flags(listing)
    listing.set_defaults(func=runs_admin.cmd_runs_list)
    show = _add(runs_sub, "show", help="one run as JSON (config, checkpoints, evaluations)")
    show.add_argument("run", help="the run's id")
    _storage_flags(show)
    show.set_defaults(func=runs_admin.cmd_runs_show)
    delete = _add(
        runs_sub,
        "delete",
        help="delete a run and all its stored state (party B stopped; while it serves, the "
        "owner uses DELETE /v1/runs/{id})",
    )
    delete.add_argument("run", help="the run's id")
    _storage_flags(delete)
    delete.set_defaults(func=runs_admin.cmd_runs_delete)


def _health_parser(sub: Any) -> None:
    health = _add(
        sub, "health", help="exit 0 if the server on this machine answers /healthz (port from env)"
    )
    health.add_argument("--port", type=int, help="port (default FEDLITE_B_PORT or 8000)")
    health.add_argument("--ssl-certfile", type=Path, help="set when the server uses TLS")
    health.add_argument(
        "--ssl-ca-certs", type=Path, help="set when the server requires client certificates"
    )
    health.add_argument(
        "--client-cert",
        type=Path,
        help="client certificate for a server with mutual TLS (default: the server's own "
        "--ssl-certfile / FEDLITE_B_SSL_CERTFILE)",
    )
    health.add_argument("--client-key", type=Path, help="its private key")
    health.add_argument("--timeout", type=float, default=5.0)
    health.add_argument(
        "--ready",
        action="store_true",
        help="ask /readyz (started, not draining, database answering) instead of /healthz",
    )
    health.set_defaults(func=_cmd_health)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; ``only="health"``: the main parser with that subcommand alone, which
    imports nothing of the database (``main`` builds it when the subcommand is health)."""
    parser = argparse.ArgumentParser(
        prog="fedlite-b",
        description="FedLite-VFL party B: the label holder's service. Every flag can also be "
        "set as an environment variable FEDLITE_B_<FLAG> (e.g. FEDLITE_B_PORT=8000); an "
        "unknown FEDLITE_B_* variable is an error.",
        epilog="Exit codes: 0 done; 1 the request failed; 2 a configuration or start-up error.",
    )
    _global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True)
    if only == "health":
        _health_parser(sub)
        return parser
    _serve_parser(sub)

    demo = _add(
        sub, "demo-data", help="write party B's half of the bundled breast-cancer demo data"
    )
    demo.add_argument("--out", type=Path, default=Path("party_b_labels.csv"))
    demo.add_argument(
        "--overlap",
        type=float,
        default=1.0,
        help="fraction of the ids both parties hold (give both parties the same value)",
    )
    demo.add_argument("--seed", type=int, default=0, help="which ids are not shared")
    demo.set_defaults(func=_cmd_demo_data)

    _token_parser(sub)
    _health_parser(sub)
    _db_parser(sub)
    _runs_parser(sub)
    from party_b.ops.audit_admin import add_audit_parser

    add_audit_parser(sub, _add, _storage_flags)
    from party_b.ops.budget_admin import add_privacy_parser
    from party_b.ops.evaluate_admin import add_evaluate_parser

    add_privacy_parser(sub, _add, _storage_flags)
    add_evaluate_parser(sub, _add, _storage_flags)
    export = _add(
        sub,
        "export",
        help="write a trained run's top model, classes and feature transform for serving",
    )
    export.add_argument("--run", required=True, help="the run's id (party A's `fedlite-a runs`)")
    export.add_argument("--out", type=Path, required=True, help="directory to create")
    _storage_flags(export)
    _label_flags(export)
    export.set_defaults(func=_cmd_export)
    from party_b.ops import parties

    parties.add_parser(sub, _add, _storage_flags, _label_flags)
    return parser


def _one_line(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", "")))
    return "invalid configuration: " + "; ".join(parts)


def _subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (its first word past the global flags), if any."""
    words = iter(argv)
    for word in words:
        if word == "--log-format":
            next(words, None)  # its value
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = "health" if _subcommand(argv) == "health" else None
    args = build_parser(only).parse_args(argv)
    command = " ".join(
        c
        for c in (
            args.command,
            getattr(args, "token_command", None),
            getattr(args, "db_command", None),
            getattr(args, "runs_command", None),
            getattr(args, "parties_command", None),
            getattr(args, "privacy_command", None),
        )
        if c
    )
    if args.command != "serve":  # serve configures logging from its settings
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.WARNING,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    try:
        code: int = args.func(args)
    except ValidationError as exc:
        print(f"fedlite-b {command}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except MaintenanceError as exc:
        print(f"fedlite-b {command}: {exc}", file=sys.stderr)
        return 1
    except (StartupError, ValueError, ImportError) as exc:
        print(f"fedlite-b {command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. a data directory party B may not write
        print(f"fedlite-b {command}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
