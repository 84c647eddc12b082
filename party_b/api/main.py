"""``create_app(settings)``: party B's FastAPI app, built from its parts. No import-time state.

Training endpoints take and return msgpack (docs/PROTOCOL.md); the rest is JSON with an
OpenAPI schema. Every error is RFC 9457 problem+json with a stable ``type``. Torch work runs
in worker threads so the event loop keeps serving other runs, health checks and metrics.
"""

import importlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from party_b import auth
from party_b.api.deps import CallerLookup
from party_b.api.docs_ui import install_docs
from party_b.api.lifecycle import InFlightMiddleware, Lifecycle
from party_b.api.middleware import BodyLimitMiddleware, MetricsMiddleware
from party_b.api.openapi import install_openapi
from party_b.api.paths import CanonicalPathMiddleware
from party_b.api.problems import install_problem_handlers
from party_b.api.readiness import DatabaseProbe
from party_b.api.routes import ROUTERS
from party_b.dashboard import RunCollector, install_dashboard
from party_b.drain import checkpoint_live_runs
from party_b.labels import LabelSource, load_label_table
from party_b.metrics import Metrics
from party_b.privacy import PrivacyPolicy
from party_b.service import LiveBounds, build_service
from party_b.service.bounds import default_live_bytes
from party_b.settings import Settings, parse_token_list
from party_b.store import make_engine, make_session_factory
from party_b.store.engine import checkpoint_wal, one_at_a_time
from party_b.subjects import normalize_subject
from party_b.token_file import read_token_file, register_file_tokens
from shared.preparation import PreparationSettings

__all__ = ["create_app"]

log = logging.getLogger("fedlite.party_b")


def create_app(settings: Settings, *, labels: LabelSource | None = None) -> FastAPI:
    """Build party B: database, label table, tokens, service, routes."""
    if labels is None:
        log.info("loading the label table %s", settings.labels or settings.label_source)
        started = time.perf_counter()
        labels = load_labels(settings)
        labelled = labels.labeled
        log.info(
            "label table: %d ids (%d labelled), %d classes, %d feature columns (%.1f s)",
            len(labels.ids),
            len(labels.ids) if labelled is None else int(labelled.sum()),
            labels.num_outputs,
            labels.side_width,
            time.perf_counter() - started,
        )
    engine, sessions = open_database(settings)
    metrics = Metrics()
    service = build_service(
        sessions=sessions,
        labels=labels,
        limits=settings.limits,
        metrics=metrics,
        checkpoints_kept=settings.checkpoints_kept,
        privacy=settings.privacy_policy(),
        step_hold=settings.step_hold_seconds,
        bounds=live_bounds(settings),
        replica_id=settings.replica_id,
        party_wait=settings.party_wait_seconds,
    )
    log_privacy(service.context.privacy, explicit="privacy" in settings.model_fields_set)
    service.runs.recover()  # logs, per training run, the step it resumes from
    lifecycle = Lifecycle(metrics.registry)
    callers = CallerLookup(sessions)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        lifecycle.serving()  # /readyz may say ready from now on
        yield
        lifecycle.drain()  # already, after fedlite-b serve's SIGTERM drain (party_b.drain)
        # every live run resumes where it stopped, here or on another replica
        await anyio.to_thread.run_sync(checkpoint_live_runs, service)
        callers.close()
        checkpoint_wal(engine)  # on SIGTERM: the .sqlite file alone then holds every row
        engine.dispose()

    app = FastAPI(
        title="FedLite-VFL party B",
        version="1.0",
        summary="The label holder's top-model service for two-party split learning.",
        lifespan=lifespan,
        docs_url=None,  # install_docs: served from local files, no CDN
        redoc_url=None,  # ReDoc would load from a CDN too
    )
    app.state.service = service
    app.state.sessions = sessions
    app.state.callers = callers  # who a request's token and certificate say it is
    # whose connections may name the caller's certificate (party_b.access.presented_subject)
    app.state.trusted_proxy_subject = (
        normalize_subject(settings.trusted_proxy_subject)
        if settings.trusted_proxy_subject
        else None
    )
    app.state.metrics = metrics
    app.state.lifecycle = lifecycle
    app.state.database_probe = DatabaseProbe(engine)
    app.state.limiter = anyio.CapacityLimiter(settings.worker_threads)
    for router in ROUTERS:
        app.include_router(router)
    # per-run series on /metrics, for the operator's credential only (routes/ops.py)
    app.state.run_registry = CollectorRegistry(auto_describe=True)
    app.state.run_registry.register(
        RunCollector(service, label_series=settings.metrics_label_series)
    )
    install_dashboard(app, settings, service)  # only with FEDLITE_B_DASHBOARD_TOKEN set
    install_problem_handlers(app)
    install_openapi(app)
    install_docs(app)
    install_middleware(app, settings.limits.max_body_bytes, lifecycle, metrics)
    return app


def install_middleware(
    app: FastAPI, max_body_bytes: int, lifecycle: Lifecycle, metrics: Metrics
) -> None:
    """Party B's middleware around every request, innermost first (also what
    ``benchmarks.floor.http_path`` times around an empty route)."""
    # inside the body limit, before routing: one spelling of every path (paths.py)
    app.add_middleware(CanonicalPathMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes)
    # outside the body limit: a draining party B refuses a request before reading its body
    app.add_middleware(InFlightMiddleware, lifecycle=lifecycle)
    # Outermost, so that it also counts what BodyLimitMiddleware refuses (route "unmatched").
    app.add_middleware(MetricsMiddleware, metrics=metrics)


def live_bounds(settings: Settings) -> LiveBounds:
    """The runs in memory: the settings', a byte budget derived from the memory by default."""
    max_bytes = settings.max_live_bytes
    if max_bytes is None:
        max_bytes = default_live_bytes()
        log.info(
            "training runs in memory: at most %s runs and %.1f GiB of their tensors (half the "
            "memory party B may use; FEDLITE_B_MAX_LIVE_BYTES sets another)",
            settings.max_live_runs or "any number of",
            max_bytes / 2**30,
        )
    return LiveBounds(settings.max_live_runs, max_bytes)


def log_privacy(policy: PrivacyPolicy, *, explicit: bool) -> None:
    """Say at start-up what new runs get; ``off`` is the operator's choice, and logged so."""
    epsilon = policy.epsilon
    guarantee = (
        f"label-DP epsilon {epsilon:g} for the label table's lifetime"
        if epsilon is not None
        else "no bound"
    )
    log.info(
        "label privacy of new runs: %s (%s; %s)",
        policy.describe(),
        guarantee,
        "set by FEDLITE_B_PRIVACY / --privacy" if explicit else "the default",
    )
    if policy.is_off:
        log.warning(
            "label privacy is OFF for new runs, by the operator's choice: party A can read "
            "party B's labels off the step gradients (docs/PRIVACY.md)"
        )
    elif epsilon is None:
        log.warning(
            "new runs get no label-DP bound (%s): their protection is empirical only "
            "(docs/PRIVACY.md)",
            policy.describe(),
        )


def load_labels(settings: Settings) -> LabelSource:
    """The label set the settings name: a table, or an operator-chosen factory."""
    if settings.label_source is not None:
        # An operator-chosen factory (like uvicorn's 'module:app'): label sets that are not
        # one table, e.g. the experiments' images, tags and next tokens.
        module_name, _, attr = settings.label_source.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        source: LabelSource = factory()
        return source
    if settings.labels is None:
        raise ValueError("party B needs a label table: set FEDLITE_B_LABELS or --labels")
    return load_label_table(
        settings.labels,
        id_column=settings.id_column,
        label_column=settings.label_column,
        feature_columns=settings.feature_columns,
        group_column=settings.group_column,
        settings=PreparationSettings(settings.max_categories, settings.min_frequency),
        categorical=settings.categorical,
        numeric=settings.numeric,
    )


def open_database(settings: Settings) -> tuple[Engine, sessionmaker[Session]]:
    """The engine and sessions of party B's database, with the configured tokens registered."""
    if settings.database_url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.resolved_database_url())
    sessions = make_session_factory(engine)
    with one_at_a_time(engine), sessions() as session:
        for name, token in parse_token_list(settings.tokens):
            if not auth.register_token(session, name, token):
                log.warning("token %r from the configuration was revoked; it stays revoked", name)
        if settings.tokens_file is not None:
            for name in register_file_tokens(session, read_token_file(settings.tokens_file)):
                log.warning("token %r of the tokens file was revoked; it stays revoked", name)
    return engine, sessions
