"""Party B's audit trail: who created, aligned, finished, deleted, evaluated or scored which
run, with how many ids, when.

Each event is one row of the table ``audit_log`` (in party B's database, with the runs: a
backup or ``db copy`` carries it) and one structured log line on the logger
``fedlite.audit``: ``audit action=predict actor=scorer subject="CN=scorer,O=Bank A"
run=4f0c... ids=512 outcome=ok`` in the text format, the same fields as JSON members with
``FEDLITE_B_LOG_FORMAT=json``. ``fedlite-b audit`` reads the table (``--jsonl`` for a SIEM,
``--totals`` for "who scored how many of our customers").

``actor`` is the token's name, ``subject`` the client certificate's (mutual TLS); ``ids`` is
the number of ids the call concerned: offered in a PSI request, aligned, evaluated, scored.
Calls refused for their scope are recorded too (``outcome=refused``), and so are evaluations
and predictions refused after it (``refused``: the problem's ``status`` and ``problem``, e.g.
a 403 ``privacy-refused`` for training ids, a 400 body, a 404 run): who tried to score what
is the trail's point, whether or not party B answered.
"""

import logging
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from party_b.errors import ProblemError
from party_b.service.runstate import Caller
from party_b.store.audit import add_audit_entry
from party_b.store.tables import AuditEntry

__all__ = ["AUDIT_LOGGER", "AUDITED_REFUSALS", "record", "refused"]

AUDIT_LOGGER = "fedlite.audit"
log = logging.getLogger(AUDIT_LOGGER)


def record(
    sessions: sessionmaker[Session],
    caller: Caller,
    action: str,
    run_id: str | None,
    *,
    ids: int | None = None,
    outcome: str = "ok",
    **detail: Any,
) -> None:
    """Store and log one event (``action``: a ``party_b.access.Action`` value)."""
    entry = AuditEntry(
        action=action,
        actor=caller.name,
        subject=caller.subject,
        run_id=run_id,
        ids=ids,
        outcome=outcome,
        detail=detail,
    )
    with sessions() as session:
        add_audit_entry(session, entry)
        fields = {
            "at": entry.at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "action": action,
            "actor": caller.name,
            "subject": caller.subject,
            "run": run_id,
            "ids": ids,
            "outcome": outcome,
            **detail,
        }
    text = " ".join(f"{k}={_value(v)}" for k, v in fields.items() if v is not None and k != "at")
    log.info("audit %s", text, extra={"audit": fields})


# what a refusal of an audited call is recorded for: the caller's mistake or probe (a bad
# body, another run's id, training ids the policy does not score, a limit), not a wait that
# party A resends by itself (409) or party B's own state (5xx)
AUDITED_REFUSALS = frozenset({400, 403, 404, 413, 422})


def refused(
    sessions: sessionmaker[Session],
    caller: Caller,
    action: str,
    run_id: str | None,
    error: ProblemError,
) -> None:
    """Record ``action`` refused with ``error``, if its status is one of AUDITED_REFUSALS."""
    if error.status in AUDITED_REFUSALS:
        slug = str(error.type).rsplit(":", 1)[-1]
        record(
            sessions, caller, action, run_id, outcome="refused", status=error.status, problem=slug
        )


def _value(value: Any) -> str:
    text = str(value)
    return f'"{text}"' if any(c in text for c in ' ="') else text
