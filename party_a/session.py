"""From ``fedlite-a`` flags to a ready trainer: connection, config, features, local state.

``train`` may create a run (and the state directory); ``evaluate``, ``predict`` and
``finish`` only ever use a run that party A's state already holds, and say where they looked
when it is not there: a mistyped ``--name`` or a command run from another directory (the
default ``--state-dir`` is relative) must not score with an untrained model.
"""

import argparse
import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from party_a.errors import ConfigError, RunNotFound

if TYPE_CHECKING:
    from api_schemas import RunOut
    from party_a.config import PartyAConfig
    from party_a.state import LocalRun, LocalStore
    from party_a.trainer import PartyATrainer

__all__ = [
    "DEFAULT_STATE_DIR",
    "connection",
    "local_runs",
    "open_session",
    "open_state",
    "overrides",
    "run_not_found",
    "state_dir_default",
]

DEFAULT_STATE_DIR = Path("fedlite-a-state")
_STATE_FILE = "party_a.sqlite"


def state_dir_default() -> Path:
    """FEDLITE_A_STATE_DIR, else ./fedlite-a-state (relative to the current directory)."""
    return Path(os.environ.get("FEDLITE_A_STATE_DIR") or DEFAULT_STATE_DIR)


def connection(args: argparse.Namespace) -> tuple[str, str]:
    """(party B's URL, token) from the flags or FEDLITE_A_SERVER / FEDLITE_A_TOKEN."""
    server = args.server or os.environ.get("FEDLITE_A_SERVER")
    token = args.token or os.environ.get("FEDLITE_A_TOKEN")
    if not server or not token:
        raise ConfigError("need --server and --token (or FEDLITE_A_SERVER / FEDLITE_A_TOKEN)")
    return server, token


def overrides(args: argparse.Namespace) -> dict[str, Any]:
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
    for item in getattr(args, "set", None) or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set takes key=value, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = value  # a bare string
    return out


def _where(state_dir: Path) -> str:
    """The state directory as a user should read it: absolute, and how it was chosen."""
    if os.environ.get("FEDLITE_A_STATE_DIR") and state_dir == state_dir_default():
        how = "FEDLITE_A_STATE_DIR"
    elif state_dir == DEFAULT_STATE_DIR:
        how = "the default --state-dir, relative to the current directory"
    else:
        how = "--state-dir"
    return f"{state_dir.resolve()} ({how})"


def open_state(state_dir: Path, *, create: bool) -> "LocalStore":
    """Party A's local store; a new one is made mode 600 in a mode-700 directory. Without
    ``create``, a missing one is a ConfigError that says where it looked."""
    from party_a.state import LocalStore

    path = state_dir / _STATE_FILE
    if not path.is_file():
        if not create:
            raise ConfigError(
                f"no party A state in {_where(state_dir)}: run `fedlite-a train` first, or "
                "pass the --state-dir (or FEDLITE_A_STATE_DIR) that train used"
            )
        # private from the start: it holds the ids common with party B and the model
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with suppress(FileExistsError):
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return LocalStore.in_directory(state_dir)


def local_runs(store: "LocalStore") -> list["LocalRun"]:
    from sqlalchemy import select

    from party_a.state import LocalRun

    with store.session() as session:
        return list(session.scalars(select(LocalRun).order_by(LocalRun.created_at)))


def run_not_found(error: RunNotFound, store: "LocalStore", state_dir: Path) -> ConfigError:
    """``error`` with where party A looked and what it found there instead."""
    known = [f"{r.name!r} (party B at {r.server})" for r in local_runs(store)]
    found = f"it holds {', '.join(known)}" if known else "it holds no run yet"
    return ConfigError(
        f"no run named {error.name!r} for party B at {error.server} in {_where(state_dir)}; "
        f"{found}. Train it first, or pass the --name / --config and --state-dir it was "
        "trained with"
    )


def _config(
    args: argparse.Namespace, store: "LocalStore", server: str, *, create: bool
) -> "PartyAConfig":
    """The run config: --config and flags; for a run that exists, without --config, the
    config it was trained with (found by --name)."""
    from party_a.config import PartyAConfig, load_config

    if create or args.config is not None:
        return load_config(args.config, overrides(args))
    if not args.name:
        raise ConfigError("give the run with --name NAME (or --config run.toml)")
    server = server.strip().rstrip("/")
    local = store.find_run(server, args.name)
    if local is None:
        raise run_not_found(RunNotFound(args.name, server), store, args.state_dir)
    given = {k: v for k, v in overrides(args).items() if k != "run.name"}
    if given:
        raise ConfigError(
            f"{', '.join(given)}: a trained run's config cannot change; without --config, "
            "give only --name"
        )
    return PartyAConfig.model_validate(local.config)


def _with_device(config: "PartyAConfig", args: argparse.Namespace) -> "PartyAConfig":
    """``config`` with ``--device`` applied (checked when the trainer resolves it, in one
    line). The device is no part of a run (its stored config leaves it out), so unlike the
    other flags it also applies to a trained run."""
    device = getattr(args, "device", None)
    if device is None:
        return config
    return config.model_copy(update={"run": config.run.model_copy(update={"device": device})})


@contextmanager
def open_session(
    args: argparse.Namespace, *, create: bool, serving: bool = False
) -> Iterator[tuple["PartyATrainer", "RunOut"]]:
    """Config, features, transport, local store and trainer, prepared (run found or, with
    ``create``, made at party B; ids aligned; checkpoint restored), and the run as party B
    sees it. ``serving``: ``--features`` is a serving table, which need not hold the
    training rows (the run's stored transform and codebook are used)."""
    from party_a.client import HttpTransport
    from party_a.features import load_features
    from party_a.trainer import PartyATrainer

    server, token = connection(args)
    store = open_state(args.state_dir, create=create)
    transport = None
    try:
        config = _with_device(_config(args, store, server, create=create), args)
        key = server.strip().rstrip("/")
        local = store.find_run(key, config.run.name)
        if not create and local is None:
            # before torch and the feature table are loaded: say so at once
            raise run_not_found(RunNotFound(config.run.name, key), store, args.state_dir)
        stored = store.serving(local.id) if local is not None else None
        transport = HttpTransport(server, token, ca_bundle=args.ca_bundle, retry_for=args.retry_for)
        features = load_features(
            args.features,
            id_column=args.id_column,
            # a trained run reads its own columns, whatever else the table holds
            feature_columns=(
                stored.transform["columns"] if stored else config.data.feature_columns or None
            ),
            standardize=config.data.standardize,
            group_column=config.data.group_column,
        )
        trainer = PartyATrainer(
            config=config,
            features=features,
            transport=transport,
            store=store,
            server=key,
        )
        try:
            remote = trainer.prepare(create=create, serving=serving)
        except RunNotFound as exc:
            raise run_not_found(exc, store, args.state_dir) from None
        yield trainer, remote
    finally:
        if transport is not None:
            transport.close()
        store.close()
