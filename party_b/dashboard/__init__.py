"""Party B's operator view: a dashboard page and per-run metrics for Prometheus.

    access.py       OperatorCredential: the dashboard's own secret (not an API token)
    reports.py      what the page reads: runs of every token, server health, one run's curves
    health.py       memory and per-route latency, from party B's Prometheus registry
    compression.py  the raw float32 baseline of a run's compression ratio
    prometheus.py   RunCollector: per-run progress and traffic on /metrics, for the operator
                    (loss, accuracy and evaluations only if FEDLITE_B_METRICS_LABEL_SERIES)
    routes.py       /dashboard/ (the page) and /dashboard/api/* (JSON, credential required)
    static/         index.html, dashboard.js, charts.js (inline SVG), dashboard.css: served
                    from the package, no build step, nothing from another host

The dashboard is off unless the operator sets ``FEDLITE_B_DASHBOARD_TOKEN``
(docs/DEPLOY.md, section 4); the same credential opens the per-run series of ``/metrics``
(without it, ``/metrics`` carries the process's metrics only: nothing run-specific).
"""

import logging
from datetime import UTC, datetime

from fastapi import FastAPI

from party_b.dashboard.access import OperatorCredential
from party_b.dashboard.prometheus import RunCollector
from party_b.dashboard.reports import Reports
from party_b.dashboard.routes import dashboard_router
from party_b.service import Service
from party_b.settings import Settings

__all__ = ["RunCollector", "install_dashboard"]

log = logging.getLogger("fedlite.party_b")


def install_dashboard(app: FastAPI, settings: Settings, service: Service) -> bool:
    """Serve the dashboard on ``app`` if the operator set its credential; whether it did.

    Raises StartupError when the credential is also an API token party B holds."""
    app.state.operator = None  # /metrics: no per-run series without the credential
    if settings.dashboard_token is None:
        return False
    credential = OperatorCredential(settings.dashboard_token.get_secret_value())
    with service.context.sessions() as session:
        credential.refuse_if_a_token(session)
    app.state.operator = credential
    reports = Reports(service, started_at=datetime.now(UTC))
    app.include_router(dashboard_router(reports, credential))
    log.info("operator dashboard at /dashboard/ (FEDLITE_B_DASHBOARD_TOKEN opens it)")
    return True
