"""One log format for every line party B writes: its own, uvicorn's server and access lines.

Text (the default) is ``2026-11-22 04:44:12,345 INFO fedlite.party_b: message``, the same
layout as party A's; ``json`` gives one object per line (``time`` in UTC ISO 8601, ``level``,
``logger``, ``message``, ``exc_info`` when there is one) for a log shipper. Access lines of
successful training steps, health checks and metrics scrapes are left out by default: a run
is thousands of steps, and its step log is in the database (``GET /v1/runs/{id}/steps``).
"""

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = ["TEXT_FORMAT", "JsonFormatter", "QuietAccess", "configure", "logging_config"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# POST /v1/runs/{id}/steps, GET /healthz, GET /metrics: routine when they succeed
_ROUTINE = re.compile(r"^(/v1/runs/[^/?]+/steps|/healthz|/metrics)(\?.*)?$")


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        audit = getattr(record, "audit", None)  # party_b.audit: its fields as members
        if isinstance(audit, dict):
            entry.update({k: v for k, v in audit.items() if k not in entry})
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class QuietAccess(logging.Filter):
    """Drops uvicorn's access lines of routine requests that succeeded (status < 400).

    uvicorn logs ``'%s - "%s %s HTTP/%s" %d'`` with args (client, method, path, version,
    status); anything else passes unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        _client, method, path, _version, status = args
        routine = method in ("GET", "POST") and _ROUTINE.match(str(path)) is not None
        return not (routine and isinstance(status, int) and status < 400)


def logging_config(
    *,
    level: str = "info",
    fmt: Literal["text", "json"] = "text",
    access: Literal["quiet", "all", "off"] = "quiet",
) -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` dict for the root, party B's and uvicorn's
    loggers (pass it to ``uvicorn.run(log_config=...)``)."""
    formatter: dict[str, Any] = (
        {"()": f"{__name__}.JsonFormatter"} if fmt == "json" else {"format": TEXT_FORMAT}
    )
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "default",
        "stream": "ext://sys.stderr",
    }
    access_handler = {**handler, "filters": ["quiet"] if access == "quiet" else []}
    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "filters": {"quiet": {"()": f"{__name__}.QuietAccess"}},
        "handlers": {"default": handler, "access": access_handler},
        "root": {"handlers": ["default"], "level": upper},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": upper, "propagate": False},
            "uvicorn.error": {"level": upper},
            # at --log-level warning or above there are no access lines, as with uvicorn's own
            "uvicorn.access": {
                "handlers": ["access"] if access != "off" else [],
                "level": upper if access != "off" else "CRITICAL",
                "propagate": False,
            },
        },
    }


def configure(
    *,
    level: str = "info",
    fmt: Literal["text", "json"] = "text",
    access: Literal["quiet", "all", "off"] = "quiet",
) -> dict[str, Any]:
    """Apply :func:`logging_config` to this process now; returns the dict applied."""
    import logging.config

    config = logging_config(level=level, fmt=fmt, access=access)
    logging.config.dictConfig(config)
    return config
