"""Party A's one assembly: a run's trainer from its config, party A's feature table, party B's
address and token, and party A's local store. The CLI (``party_a.cli``) and the Python API
(``party_a.api.connect``) both open their sessions here.

Heavy modules (torch, httpx, pandas) load inside ``open_session``, not at import: the CLI
imports this module for every command, ``--help`` too.
"""

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from party_a.errors import ConfigError, RunNotFound
from party_a.phases import phase

if TYPE_CHECKING:
    from party_a.config import PartyAConfig
    from party_a.features import FeatureTable
    from party_a.store import LocalStore
    from party_a.trainer import PartyATrainer

__all__ = ["DEFAULT_STATE_DIR", "describe", "open_session", "open_state", "state_dir_default"]

DEFAULT_STATE_DIR = Path("fedlite-a-state")
_STATE_FILE = "party_a.sqlite"


def state_dir_default() -> Path:
    """FEDLITE_A_STATE_DIR, else ./fedlite-a-state (relative to the current directory)."""
    return Path(os.environ.get("FEDLITE_A_STATE_DIR") or DEFAULT_STATE_DIR)


def describe(state_dir: Path) -> str:
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
    from party_a.store import LocalStore

    path = state_dir / _STATE_FILE
    if not path.is_file():
        if not create:
            raise ConfigError(
                f"no party A state in {describe(state_dir)}: run `fedlite-a train` first, or "
                "pass the --state-dir (or FEDLITE_A_STATE_DIR) that train used"
            )
        # private from the start: it holds the ids common with party B and the model
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with suppress(FileExistsError):
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return LocalStore.in_directory(state_dir)


@contextmanager
def open_session(
    *,
    server: str,
    token: str,
    config: "PartyAConfig",
    features: Path,
    store: "LocalStore",
    create: bool,
    id_column: str = "id",
    ca_bundle: Path | None = None,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    retry_for: float = 300.0,
) -> Iterator["PartyATrainer"]:
    """The run's trainer over HTTP, not yet prepared; the transport is closed at the end.

    Without ``create``, a run ``store`` does not hold is :class:`RunNotFound` before torch
    and the feature table load. A run that exists reads its own feature columns (stored with
    its transform), whatever else the table holds.
    """
    from party_a.transport.http import HttpTransport
    from party_a.transport.parties import PartyTransport

    key = server.strip().rstrip("/")
    local = store.find_run(key, config.run.name)
    if not create and local is None:
        raise RunNotFound(config.run.name, key)
    stored = store.serving(local.id) if local is not None else None
    transport = (
        HttpTransport(
            server,
            token,
            ca_bundle=ca_bundle,
            client_cert=client_cert,
            client_key=client_key,
            retry_for=retry_for,
        )
        if config.run.party is None
        else PartyTransport(
            server,
            token,
            party=config.run.party,
            ca_bundle=ca_bundle,
            client_cert=client_cert,
            client_key=client_key,
            retry_for=retry_for,
        )
    )
    try:
        # the table before torch: a wrong column is told in a second, not after the imports;
        # a run that exists reads its own columns, with the types they had (its preparation)
        table = _features(features, id_column, config, stored.transform if stored else None)
        config.check_model()  # the model registry: torch, which the trainer needs next
        from party_a.trainer import PartyATrainer  # torch

        yield PartyATrainer(
            config=config, features=table, transport=transport, store=store, server=key
        )
    finally:
        transport.close()


def _features(
    path: Path, id_column: str, config: "PartyAConfig", stored: dict[str, Any] | None
) -> "FeatureTable":
    """Party A's table, saying so (the first phase of a first contact), with what was read
    and inferred of each column, before any row is sent."""
    from party_a.features import FeatureTransform, load_features

    phase("loading features from %s", path)
    started = time.perf_counter()
    table = load_features(
        path,
        id_column=id_column,
        feature_columns=config.data.feature_columns,
        standardize=config.data.standardize,
        group_column=config.data.group_column,
        rules=config.data.rules(),
        settings=config.data.settings(),
        expect=FeatureTransform.from_json(stored) if stored is not None else None,
    )
    headline, columns = table.summary()
    phase(
        "features: %s rows, %d columns: %s (%.1f s); loading the model",
        f"{len(table.ids):,}",
        table.x.shape[1] + len(table.categorical),
        headline,
        time.perf_counter() - started,
    )
    for line in columns:  # categories and missing values, before any row is sent
        phase("  %s", line)
    return table
