"""From ``fedlite-a`` flags to a session: the connection, the run config and its overrides,
and what to say when the run asked for is not in party A's state.

``train`` may create a run (and the state directory); ``evaluate``, ``predict`` and
``finish`` only ever use a run that party A's state already holds, and say where they looked
when it is not there: a mistyped ``--name`` or a command run from another directory (the
default ``--state-dir`` is relative) must not score with an untrained model.
"""

import argparse
import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from party_a.errors import ConfigError, RunNotFound
from party_a.phases import phase
from party_a.session import describe, open_session, open_state

if TYPE_CHECKING:
    from api_schemas import RunOut
    from party_a.config import PartyAConfig
    from party_a.store import LocalRun, LocalStore
    from party_a.trainer import PartyATrainer

__all__ = ["connection", "local_runs", "overrides", "run_not_found", "session_from_args"]


def connection(args: argparse.Namespace) -> tuple[str, str]:
    """(party B's URL, token) from the flags or FEDLITE_A_SERVER / FEDLITE_A_TOKEN. With a
    client certificate the token may be empty: party B's operator can make the certificate
    the credential (docs/DEPLOY.md section 2)."""
    server = args.server or os.environ.get("FEDLITE_A_SERVER")
    token = args.token or os.environ.get("FEDLITE_A_TOKEN") or ""
    if not server or not (token or getattr(args, "client_cert", None)):
        raise ConfigError(
            "need --server and --token (or FEDLITE_A_SERVER / FEDLITE_A_TOKEN; with mutual "
            "TLS, --client-cert instead of the token if party B accepts the certificate alone)"
        )
    return server, token


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Flags that override the config file, as dotted keys."""
    named = {
        "name": "run.name",
        "party": "run.party",
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
    for attr in ("categorical", "numeric", "drop"):  # column lists: a,b,c
        value = getattr(args, attr, None)
        if value is not None:
            out[f"data.{attr}"] = [c.strip() for c in value.split(",") if c.strip()]
    for item in getattr(args, "set", None) or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set takes key=value, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = value  # a bare string
    return out


def local_runs(store: "LocalStore") -> list["LocalRun"]:
    from sqlalchemy import select

    from party_a.store import LocalRun

    with store.session() as session:
        return list(session.scalars(select(LocalRun).order_by(LocalRun.created_at)))


def run_not_found(error: RunNotFound, store: "LocalStore", state_dir: Path) -> ConfigError:
    """``error`` with where party A looked and what it found there instead."""
    known = [f"{r.name!r} (party B at {r.server})" for r in local_runs(store)]
    found = f"it holds {', '.join(known)}" if known else "it holds no run yet"
    return ConfigError(
        f"no run named {error.name!r} for party B at {error.server} in {describe(state_dir)}; "
        f"{found}. Train it first, or pass the --name / --config and --state-dir it was "
        "trained with"
    )


def _config(
    args: argparse.Namespace, store: "LocalStore", server: str, *, create: bool
) -> "PartyAConfig":
    """The run config: for ``train``, --config and flags; for a run that exists, the config
    it was trained with, found by --name or by the [run] name of --config (a run trained
    with ``--steps 20`` on top of run.toml is still the run of run.toml)."""
    from party_a.config import PartyAConfig, load_config

    if create:
        return load_config(args.config, overrides(args))
    given = {k: v for k, v in overrides(args).items() if k != "run.name"}
    name = args.name or (load_config(args.config, {}).run.name if args.config else None)
    if not name:
        raise ConfigError("give the run with --name NAME (or --config run.toml)")
    server = server.strip().rstrip("/")
    local = store.find_run(server, name)
    if local is None:
        raise run_not_found(RunNotFound(name, server), store, args.state_dir)
    # a flag that repeats the trained value (a party's --party on every command) is no change
    changed = [key for key, value in given.items() if _dotted(local.config, key) != value]
    if changed:
        raise ConfigError(
            f"{', '.join(changed)}: a trained run's config cannot change; give only --name "
            "(or --config, whose [run] name finds the run)"
        )
    return PartyAConfig.model_validate(local.config)


def _dotted(config: dict[str, Any], key: str) -> Any:
    """``config``'s value at a dotted key such as ``run.party`` (None where absent)."""
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


@contextmanager
def session_from_args(
    args: argparse.Namespace, *, create: bool, serving: bool = False
) -> Iterator[tuple["PartyATrainer", "RunOut | None"]]:
    """The flags' session, prepared: for training and evaluation the run found (or, with
    ``create``, made at party B), ids aligned, checkpoint restored, and party B's view of
    the run; with ``serving`` (predict) ``--features`` is a serving table, which need not
    hold the training rows, and party A's own state is enough (no view of party B)."""
    server, token = connection(args)
    phase("checking %s and the run config", args.features)
    from shared.idtables import check_columns

    # the id column from the header, before the config (whose model check loads torch) and
    # before any row: a wrong --id-column is told in a second
    check_columns(args.features, {args.id_column: "id column (--id-column)"})
    store = open_state(args.state_dir, create=create)
    try:
        config = _config(args, store, server, create=create).on_device(
            getattr(args, "device", None)
        )
        with open_session(
            server=server,
            token=token,
            config=config,
            features=args.features,
            store=store,
            create=create,
            id_column=args.id_column,
            ca_bundle=args.ca_bundle,
            client_cert=args.client_cert,
            client_key=args.client_key,
            retry_for=args.retry_for,
        ) as trainer:
            if serving:
                trainer.prepare_serving()
                yield trainer, None
            else:
                yield trainer, trainer.prepare(create=create)
    except RunNotFound as exc:
        raise run_not_found(exc, store, args.state_dir) from None
    finally:
        store.close()
