"""Party A from Python (a notebook, a script): the trainer ``fedlite-a`` runs, in five lines.

    from party_a.api import connect

    with connect(url, token, features="host.csv", config="run.toml") as run:
        summary = run.train()              # PSI, alignment, every step; resumes where it stopped
        print(run.evaluate().metrics)      # held-out metrics, computed at party B
        print(run.predict(["s0001"]).scores)  # serving: party B's scores for these ids
        run.finish()

One feature party of a run with several (docs/PROTOCOL.md section 12) passes its name and
the token party B's operator issued to it; every party does the same, each in its own
process, and each call meets the other parties' at party B::

    with connect(url, telco_token, features="telco.csv", config="telco.toml", party="telco") as run:
        run.train()                        # ends when every party has applied the last step
        print(run.evaluate().metrics)      # every party evaluates: party B fuses their parts

``run`` is a :class:`party_a.trainer.PartyATrainer`, prepared: the run exists at party B (made
on first use, found by ``[run] name`` afterwards) and its ids are aligned. Party A's state (the
bottom model, checkpoints, the PSI cache) lives in ``state_dir`` exactly as for ``fedlite-a``,
so the CLI and this API can take turns on one run. To run party B in the same Python process,
see :func:`party_b.ops.background.serve_in_thread`.
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from party_a.config import PartyAConfig, load_config
from party_a.errors import ConfigError
from party_a.session import open_session, open_state, state_dir_default
from party_a.trainer import PartyATrainer

__all__ = ["connect"]


@contextmanager
def connect(
    server: str,
    token: str,
    *,
    features: str | Path,
    config: str | Path | PartyAConfig | None = None,
    overrides: Mapping[str, Any] | None = None,
    state_dir: str | Path | None = None,
    id_column: str = "id",
    ca_bundle: str | Path | None = None,
    client_cert: str | Path | None = None,
    client_key: str | Path | None = None,
    retry_for: float = 300.0,
    device: str | None = None,
    party: str | None = None,
) -> Iterator[PartyATrainer]:
    """A prepared party A session on party B at ``server``; closed at the end of the block.

    Args:
        server: party B's base URL (``https://`` in a deployment; ``http://`` to localhost).
        token: the API token party B's operator issued.
        features: party A's table (CSV, Parquet or npz with an id column).
        config: a run TOML (``examples/breast.toml``; every key in ``party_a.config``) or a
            ``PartyAConfig``; ``overrides``: dotted keys on top, e.g. ``{"run.steps": 50}``.
        state_dir: party A's state directory (default: FEDLITE_A_STATE_DIR or
            ./fedlite-a-state, as for the CLI).
        ca_bundle: the CA certificates (PEM) that signed party B's certificate, when it is
            not one this machine trusts.
        client_cert, client_key: party A's client certificate and its key (PEM), for a
            party B with mutual TLS (docs/DEPLOY.md section 2); ``token`` may then be empty
            if party B's operator made the certificate the credential.
        retry_for: seconds to keep retrying party B when it is unreachable or restarting
            (and, in a run with several feature parties, waiting for the other parties).
        device: where party A computes ("cpu", "cuda", "cuda:N", "auto"), over ``[run] device``;
            one this machine lacks raises ``shared.devices.DeviceUnavailable`` (a ValueError).
        party: this party's name in a run with several feature parties (``[run] party``);
            ``token`` is then the one party B's operator issued to it, and the run is the one
            that token acts for (joined, not created; docs/PROTOCOL.md section 12).
    """
    given = dict(overrides or {}) | ({"run.party": party} if party is not None else {})
    if isinstance(config, PartyAConfig):
        if overrides:
            raise ConfigError("overrides go with a TOML config; change the PartyAConfig itself")
        run_config = config
        if party is not None:
            run_config = config.model_copy(
                update={"run": config.run.model_copy(update={"party": party})}
            )
    else:
        run_config = load_config(Path(config) if config else None, given)
    run_config = run_config.on_device(device)
    store = open_state(Path(state_dir) if state_dir else state_dir_default(), create=True)
    try:
        with open_session(
            server=server,
            token=token,
            config=run_config,
            features=Path(features),
            store=store,
            create=True,
            id_column=id_column,
            ca_bundle=Path(ca_bundle) if ca_bundle else None,
            client_cert=Path(client_cert) if client_cert else None,
            client_key=Path(client_key) if client_key else None,
            retry_for=retry_for,
        ) as trainer:
            trainer.prepare(create=True)
            yield trainer
    finally:
        store.close()
