"""What party A is doing, said as it happens: one line per phase of a run's first contact
("loading features", "PSI: 29,200 ids", "aligning", "evaluating"), so that the minute before
the first step is not silent.

Phases go to the logger ``fedlite.party_a.phase`` at INFO. ``fedlite-a`` prints them on
stderr with the seconds since it started (:func:`show_phases`); from Python, configure that
logger (``logging.basicConfig(level=logging.INFO)`` shows them).
"""

import logging
import time
from typing import TextIO

__all__ = ["PHASE_LOGGER", "phase", "show_phases"]

PHASE_LOGGER = "fedlite.party_a.phase"
_log = logging.getLogger(PHASE_LOGGER)


def phase(message: str, *args: object) -> None:
    """Say that party A is now doing ``message % args``."""
    _log.info(message, *args)


class _Elapsed(logging.Formatter):
    def __init__(self, prog: str, started: float) -> None:
        super().__init__()
        self._prog = prog
        self._started = started

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.monotonic() - self._started
        return f"{self._prog}: [{seconds:5.1f} s] {record.getMessage()}"


def show_phases(stream: TextIO, *, prog: str = "fedlite-a", started: float | None = None) -> None:
    """Print every phase on ``stream`` from now on, with the seconds since ``started``
    (a ``time.monotonic()``; default now); replaces what an earlier call set up."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Elapsed(prog, time.monotonic() if started is None else started))
    for old in list(_log.handlers):
        _log.removeHandler(old)
    _log.addHandler(handler)
    _log.setLevel(logging.INFO)
    _log.propagate = False
