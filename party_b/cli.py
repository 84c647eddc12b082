"""``fedlite-b``: party B's command line (the label holder's service)."""

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select

from party_b import auth
from party_b.settings import Settings
from party_b.store import ApiToken, make_engine, make_session_factory

__all__ = ["main"]


def _settings(args: argparse.Namespace) -> Settings:
    """Env (FEDLITE_B_*) first, then any flag given on the command line."""
    overrides: dict[str, Any] = {}
    for field in (
        "host",
        "port",
        "data_dir",
        "database_url",
        "labels",
        "id_column",
        "label_column",
        "group_column",
        "label_source",
        "tokens",
        "ssl_certfile",
        "ssl_keyfile",
        "log_level",
        "torch_threads",
        "worker_threads",
    ):
        value = getattr(args, field, None)
        if value is not None:
            overrides[field] = value
    if getattr(args, "feature_columns", None) is not None:
        overrides["feature_columns"] = [c for c in args.feature_columns.split(",") if c]
    return Settings(**overrides)


def _cmd_serve(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from party_b.app import create_app

    settings = _settings(args)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    app = create_app(settings)
    with make_session_factory(make_engine(settings.resolved_database_url()))() as session:
        active = session.scalars(select(ApiToken).where(ApiToken.revoked_at.is_(None))).all()
    if not active:
        print(
            "fedlite-b serve: no active API tokens; issue one with "
            "'fedlite-b token issue --name <caller>' or set FEDLITE_B_TOKENS",
            file=sys.stderr,
        )
        return 2
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        ssl_certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
        ssl_keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        timeout_graceful_shutdown=10,
    )
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the local server answers /healthz (the container's health check)."""
    import ssl
    import urllib.request

    settings = _settings(args)
    scheme = "https" if settings.ssl_certfile else "http"
    url = f"{scheme}://127.0.0.1:{settings.port}/healthz"
    # Liveness of our own process on loopback: the certificate names the public host, not
    # 127.0.0.1, so it is not verified here (party A verifies it).
    context = None
    if scheme == "https":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=args.timeout, context=context) as response:
            ok = response.status == 200
    except OSError as exc:
        print(f"fedlite-b health: {url}: {exc}", file=sys.stderr)
        return 1
    print(f"{url}: {'ok' if ok else 'unhealthy'}")
    return 0 if ok else 1


def _cmd_db_backup(args: argparse.Namespace) -> int:
    """Online backup of the SQLite file (SQLite's backup API: consistent under WAL, while
    party B keeps serving); for PostgreSQL use pg_dump."""
    import sqlite3

    from sqlalchemy import make_url

    url = make_url(_settings(args).resolved_database_url())
    if url.get_backend_name() != "sqlite" or not url.database:
        print(
            f"fedlite-b db backup: {url.get_backend_name()} database: use its own tools "
            "(pg_dump for PostgreSQL)",
            file=sys.stderr,
        )
        return 2
    target = Path(args.to)
    if target.exists():
        print(f"fedlite-b db backup: {target} exists; not overwriting it", file=sys.stderr)
        return 1
    source = sqlite3.connect(url.database)
    copy = sqlite3.connect(target)
    try:
        source.backup(copy)
        check = copy.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        copy.close()
        source.close()
    print(f"{target}\t{target.stat().st_size} bytes\tintegrity_check: {check}")
    return 0 if check == "ok" else 1


def _cmd_db_copy(args: argparse.Namespace) -> int:
    from party_b.store import copy_database

    source = make_engine(args.source)
    target = make_engine(args.target)
    try:
        copied = copy_database(source, target)
    finally:
        source.dispose()
        target.dispose()
    for table, rows in copied.items():
        print(f"{table}\t{rows}")
    return 0


def _token_sessions(args: argparse.Namespace) -> Any:
    settings = _settings(args)
    if settings.database_url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    return make_session_factory(make_engine(settings.resolved_database_url()))


def _cmd_token_issue(args: argparse.Namespace) -> int:
    with _token_sessions(args)() as session:
        token = auth.issue_token(session, args.name)
    print(token)
    return 0


def _cmd_token_revoke(args: argparse.Namespace) -> int:
    with _token_sessions(args)() as session:
        if not auth.revoke_token(session, args.name):
            print(f"no active token named {args.name!r}", file=sys.stderr)
            return 1
    print(f"revoked {args.name}")
    return 0


def _cmd_token_list(args: argparse.Namespace) -> int:
    with _token_sessions(args)() as session:
        for row in session.scalars(select(ApiToken).order_by(ApiToken.name)):
            state = f"revoked {row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "active"
            print(f"{row.name}\t{state}")
    return 0


def _cmd_demo_data(args: argparse.Namespace) -> int:
    from shared.demo_data import write_party_b_demo

    print(write_party_b_demo(args.out, overlap=args.overlap, seed=args.seed))
    return 0


def _storage_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, help="directory of the default SQLite file")
    parser.add_argument("--database-url", help="SQLAlchemy URL (overrides --data-dir)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedlite-b",
        description="FedLite-VFL party B: the label holder's service. Every flag can also be "
        "set as an environment variable FEDLITE_B_<FLAG> (e.g. FEDLITE_B_PORT=8000).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    _storage_flags(serve)
    serve.add_argument("--labels", type=Path, help="label table: CSV(.gz) or Parquet")
    serve.add_argument("--id-column", help="sample-id column (default 'id')")
    serve.add_argument("--label-column", help="label column (default 'y')")
    serve.add_argument(
        "--feature-columns", help="comma-separated feature columns (default: all others)"
    )
    serve.add_argument("--group-column", help="client column (the 'clients' batch schedule)")
    serve.add_argument(
        "--label-source", help="'module:factory' returning a LabelSource, instead of --labels"
    )
    serve.add_argument("--tokens", help="'name:token,...' to register at start-up")
    serve.add_argument("--ssl-certfile", type=Path, help="TLS certificate (PEM)")
    serve.add_argument("--ssl-keyfile", type=Path, help="TLS private key (PEM)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--torch-threads", type=int, help="intra-op threads for torch")
    serve.add_argument("--worker-threads", type=int, help="concurrent torch requests")
    serve.set_defaults(func=_cmd_serve)

    demo = sub.add_parser(
        "demo-data", help="write party B's half of the bundled breast-cancer demo data (CSV)"
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

    token = sub.add_parser("token", help="issue, revoke and list API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    issue = token_sub.add_parser("issue", help="create a token and print it once")
    issue.add_argument("--name", required=True, help="who the token is for")
    _storage_flags(issue)
    issue.set_defaults(func=_cmd_token_issue)
    revoke = token_sub.add_parser("revoke", help="revoke a token (takes effect at once)")
    revoke.add_argument("--name", required=True)
    _storage_flags(revoke)
    revoke.set_defaults(func=_cmd_token_revoke)
    listing = token_sub.add_parser("list", help="list token names and states")
    _storage_flags(listing)
    listing.set_defaults(func=_cmd_token_list)

    health = sub.add_parser(
        "health", help="exit 0 if the server on this machine answers /healthz (port from env)"
    )
    health.add_argument("--port", type=int, help="port (default FEDLITE_B_PORT or 8000)")
    health.add_argument("--ssl-certfile", type=Path, help="set when the server uses TLS")
    health.add_argument("--timeout", type=float, default=5.0)
    health.set_defaults(func=_cmd_health)

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    copy = db_sub.add_parser(
        "copy",
        help="copy party B's state to another, empty database (e.g. SQLite -> PostgreSQL)",
        description="Stop party B first. Copies tokens, runs, step logs, checkpoints, "
        "evaluations and PSI keys in one transaction; then start party B with "
        "--database-url TARGET.",
    )
    copy.add_argument("--from", dest="source", required=True, help="source SQLAlchemy URL")
    copy.add_argument("--to", dest="target", required=True, help="target SQLAlchemy URL")
    copy.set_defaults(func=_cmd_db_copy)
    backup = db_sub.add_parser(
        "backup",
        help="online backup of the SQLite file to a new file (safe while serving)",
    )
    _storage_flags(backup)
    backup.add_argument("--to", required=True, type=Path, help="backup file to create")
    backup.set_defaults(func=_cmd_db_backup)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ValidationError as exc:
        print(f"fedlite-b: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"fedlite-b: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
