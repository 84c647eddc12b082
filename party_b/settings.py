"""Party B's configuration: one pydantic-settings class, from env (FEDLITE_B_*) or flags.

An unknown key is an error wherever it comes from: a flag (argparse), a keyword (pydantic's
``extra="forbid"``) or an environment variable (:func:`check_environment`; pydantic-settings
alone would ignore ``FEDLITE_B_LIMIT_MAX_BATCHH=5`` and serve with the default).
"""

import argparse
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from party_b.privacy.policy import DEFAULT_PRESET, PrivacyPolicy, parse_policy

__all__ = [
    "MIN_DASHBOARD_TOKEN",
    "Limits",
    "Settings",
    "check_environment",
    "known_environment",
    "settings_from_flags",
]


MIN_DASHBOARD_TOKEN = 24  # characters of the operator's dashboard credential


class Limits(BaseSettings):
    """Operator limits on what one caller may ask for; each breach is a clear 4xx problem."""

    model_config = SettingsConfigDict(env_prefix="FEDLITE_B_LIMIT_", extra="forbid")

    max_body_bytes: int = Field(default=64 * 2**20, ge=1024, description="request body size")
    max_batch: int = Field(default=16384, ge=1, description="rows per step / evaluate request")
    max_dim: int = Field(default=65536, ge=1, description="activation width d")
    max_q: int = Field(default=65536, ge=1)
    max_L: int = Field(default=65536, ge=1, le=65536)
    max_steps: int = Field(default=10_000_000, ge=1, description="steps per run")
    max_runs_per_token: int = Field(default=64, ge=1, description="runs not yet finished")
    max_aligned_ids: int = Field(default=5_000_000, ge=1, description="ids per alignment")
    max_top_params: int = Field(
        default=50_000_000, ge=1, description="parameters of one run's top model (memory)"
    )
    max_top_layers: int = Field(default=64, ge=1, description="entries of a top-model size list")
    max_top_activations: int = Field(
        default=2**28,
        ge=1,
        description="floats of top-model activations per step: rows per step x (cut_dim + "
        "the sum of the top model's sizes)",
    )
    epsilon_budget: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="label-DP epsilon a token's runs may spend in all, unless the operator "
        "gave it its own budget (fedlite-b token budget); default: two label draws at the "
        "epsilon new runs get; 0: none (docs/PRIVACY.md 2.4)",
    )


class Settings(BaseSettings):
    """Everything ``fedlite-b serve`` needs. Env vars: FEDLITE_B_<FIELD>, e.g. FEDLITE_B_PORT."""

    model_config = SettingsConfigDict(env_prefix="FEDLITE_B_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    data_dir: Path = Field(default=Path("fedlite-b-data"), description="SQLite file lives here")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default sqlite:///<data_dir>/party_b.sqlite"
    )
    labels: Path | None = Field(default=None, description="label table, CSV(.gz) or Parquet")
    id_column: str = "id"
    label_column: str = "y"
    feature_columns: list[str] | None = Field(
        default=None, description="party B's own features; default: every other column"
    )
    group_column: str | None = Field(
        default=None, description="the client of each row (the 'clients' batch schedule)"
    )
    # how the feature columns are typed and prepared (shared.preparation, as party A's [data])
    categorical: list[str] = Field(
        default_factory=list,
        description="feature columns that are categories whatever they hold (integer codes)",
    )
    numeric: list[str] = Field(
        default_factory=list,
        description="feature columns that are numbers (a word in one is an error naming its row)",
    )
    max_categories: int = Field(
        default=1000, ge=1, description="values a categorical column keeps, the most frequent"
    )
    min_frequency: int = Field(
        default=5, ge=1, description='a value in fewer labelled rows joins the "other" bucket'
    )
    label_source: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="instead of a table: 'module:factory', a callable returning a LabelSource",
    )
    tokens: str = Field(
        default="",
        description="operator tokens to register at start-up, 'name:token,name:token' "
        "(stored hashed; tokens can also be issued with 'fedlite-b token issue')",
    )
    tokens_file: Path | None = Field(
        default=None,
        description="tokens with their scope, expiry and client certificate, registered at "
        "start-up from a TOML file (a mounted secret; party_b/token_file.py)",
    )
    checkpoints_kept: int = Field(default=3, ge=2, description="checkpoints kept per run")
    torch_threads: int | None = Field(default=None, ge=1)
    device: str = Field(
        default="cpu",
        description="where the top models compute: cpu, cuda, cuda:N or auto (party_b/device.py)",
    )
    worker_threads: int = Field(default=8, ge=1, description="concurrent torch requests")
    max_live_runs: int | None = Field(
        default=32,
        ge=1,
        description="training runs kept in memory; past it the least recently used one is "
        "checkpointed and leaves memory until its next request (party_b/service/bounds.py)",
    )
    max_live_bytes: int | None = Field(
        default=None,
        ge=1,
        description="bytes of training runs' tensors and arrays kept in memory (default: half "
        "the memory of the machine, or of its container's limit); the least recently used "
        "runs leave memory first (party_b/service/bounds.py)",
    )
    replica_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="this process's name in the run leases, for replicas on one database "
        "(default: host name, process id and a random suffix)",
    )
    step_hold_seconds: float | None = Field(
        default=5.0,
        ge=0,
        le=60,
        description="longest wait of a training step that overtook its predecessor before it "
        "is refused (default 5; 0 refuses it at once; party_b/service/__init__.py says why)",
    )
    drain_seconds: float = Field(
        default=0.0,
        ge=0,
        le=600,
        description="after SIGTERM, answer new API requests 503 and /readyz 503 for at least "
        "this long before the port closes, so that load balancers stop sending work here "
        "first (party_b/drain.py; requests in flight always finish)",
    )
    party_wait_seconds: float = Field(
        default=20.0,
        gt=0,
        le=110,
        description="a run with several feature parties: longest wait of one party's request "
        "for the others' (a step, an alignment, an evaluation...) before 409 "
        "parties-incomplete; below party A's 120 s request timeout",
    )
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_ca_certs: Path | None = Field(
        default=None,
        description="mutual TLS: CA certificates (PEM) whose client certificates party B "
        "accepts; set, every connection must present one (docs/DEPLOY.md)",
    )
    trusted_proxy_subject: str | None = Field(
        default=None,
        min_length=1,
        description="mutual TLS behind a load balancer that verifies the clients' "
        "certificates: the subject of the balancer's own client certificate. On a connection "
        "with it, the caller's certificate is the one the balancer names in the header "
        "X-Fedlite-Client-Subject; on any other connection that header is ignored "
        "(party_b/access.py; needs --ssl-ca-certs)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = Field(
        default="text", description="one line per record: text, or one JSON object"
    )
    access_log: Literal["quiet", "all", "off"] = Field(
        default="quiet",
        description="HTTP access lines: quiet = all but successful training steps, health "
        "checks and metrics scrapes; all; off",
    )
    privacy: str = Field(
        default=DEFAULT_PRESET,
        description="label privacy of new runs (docs/PRIVACY.md): 'protected' (the default: "
        "label differential privacy), 'off' (logged as the operator's choice), "
        "'recommended' (Marvell's noise), each optionally followed by overrides, e.g. "
        "'protected,label_epsilon=2'; each run keeps the policy it was created with",
    )
    metrics_label_series: bool = Field(
        default=False,
        description="also export each run's loss, accuracy and evaluation metrics on /metrics "
        "(label-derived; off by default). /metrics carries per-run series only for a request "
        "with the operator's credential (FEDLITE_B_DASHBOARD_TOKEN)",
    )
    limits: Limits = Field(default_factory=Limits)
    dashboard_token: SecretStr | None = Field(
        default=None,
        description="the operator's credential for the dashboard at /dashboard/ (party_b."
        "dashboard); unset: no dashboard. Never a party A token. Environment only, not a flag, "
        "to keep it out of the process list",
    )

    @field_validator("dashboard_token")
    @classmethod
    def _dashboard_token_is_long(cls, value: SecretStr | None) -> SecretStr | None:
        secret = value.get_secret_value() if value is not None else None
        # it travels in an Authorization header: visible ASCII only, no spaces
        if secret is not None and (
            len(secret) < MIN_DASHBOARD_TOKEN or not all(33 <= ord(c) <= 126 for c in secret)
        ):
            raise ValueError(
                f"the dashboard token must be at least {MIN_DASHBOARD_TOKEN} visible ASCII "
                "characters without spaces, e.g. the output of "
                "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @field_validator("log_level", "log_format", "access_log", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("privacy")
    @classmethod
    def _privacy_parses(cls, value: str) -> str:
        parse_policy(value)  # ValueError: pydantic reports it against FEDLITE_B_PRIVACY
        return value

    def privacy_policy(self) -> PrivacyPolicy:
        return parse_policy(self.privacy)

    @field_validator("tokens")
    @classmethod
    def _tokens_are_named_and_long(cls, value: str) -> str:
        for name, token in parse_token_list(value):
            if len(token) < 16:
                raise ValueError(f"token for {name!r} is shorter than 16 characters")
        return value

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'party_b.sqlite').resolve()}"


def parse_token_list(value: str) -> list[tuple[str, str]]:
    """'alice:tok1,bob:tok2' -> [('alice', 'tok1'), ('bob', 'tok2')]; raises ValueError."""
    pairs = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, token = item.partition(":")
        if not sep or not name or not token:
            raise ValueError(f"token entries must look like 'name:token', got {item!r}")
        pairs.append((name, token))
    return pairs


def known_environment() -> set[str]:
    """Every FEDLITE_B_* variable party B reads (upper case)."""
    names = {f"FEDLITE_B_{name.upper()}" for name in Settings.model_fields}
    return names | {f"FEDLITE_B_LIMIT_{name.upper()}" for name in Limits.model_fields}


def check_environment(environ: Mapping[str, str]) -> None:
    """ValueError naming each FEDLITE_B_* variable party B does not read, with the closest
    known name. Names are matched without regard to case, as pydantic-settings reads them."""
    known = known_environment()
    unknown = sorted(
        k for k in environ if k.upper().startswith("FEDLITE_B_") and k.upper() not in known
    )
    if not unknown:
        return
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name.upper(), sorted(known), n=1)
        lines.append(f"{name} (did you mean {close[0]}?)" if close else name)
    raise ValueError(
        f"unknown environment variable{'s' if len(lines) > 1 else ''}: {'; '.join(lines)}. "
        "Every setting is FEDLITE_B_<FLAG> or FEDLITE_B_LIMIT_<LIMIT>: see fedlite-b serve --help"
    )


_FLAG_FIELDS = (
    "host", "port", "data_dir", "database_url", "labels", "id_column", "label_column",
    "group_column", "max_categories", "min_frequency", "label_source", "tokens",
    "tokens_file", "ssl_certfile", "ssl_keyfile", "ssl_ca_certs",
    "trusted_proxy_subject", "log_level", "log_format", "access_log", "torch_threads",
    "worker_threads", "privacy", "device", "max_live_runs", "max_live_bytes", "replica_id",
)  # fmt: skip


def settings_from_flags(args: argparse.Namespace) -> Settings:
    """Env (FEDLITE_B_*, each one known) first, then any flag given on the command line."""
    check_environment(os.environ)
    overrides: dict[str, Any] = {}
    for field in _FLAG_FIELDS:
        value = getattr(args, field, None)
        if value is not None:
            overrides[field] = value
    if getattr(args, "verbose", False):
        overrides["log_level"] = "debug"
    for listed in ("feature_columns", "categorical", "numeric"):  # comma-separated
        value = getattr(args, listed, None)
        if value is not None:
            overrides[listed] = [c.strip() for c in value.split(",") if c.strip()]
    return Settings(**overrides)
