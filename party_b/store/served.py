"""What ``fedlite-b serve`` serves with, recorded in party B's database at start-up.

    served_settings    one row per setting: its value as JSON, and when serve recorded it

The commands that act for party B without its process (``fedlite-b parties create``) read
it, so that a run they create gets what the database's party B would give it (``privacy``:
the label-privacy policy of new runs, ``PrivacyPolicy.to_stored()``). The latest start-up
wins; the row outlives the process. A table of its own, so that an older database gains it
with ``create_all`` at start-up.
"""

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, Session, mapped_column

from party_b.store.tables import Base, UtcDateTime

__all__ = ["SERVED_PRIVACY", "ServedSetting", "record_served", "served_setting"]

SERVED_PRIVACY = "privacy"  # the label-privacy policy serve gives new runs (to_stored())


class ServedSetting(Base):
    """One setting ``fedlite-b serve`` last started with, as JSON."""

    __tablename__ = "served_settings"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)
    recorded_at: Mapped[datetime] = mapped_column(UtcDateTime())


def record_served(session: Session, name: str, value: Any) -> ServedSetting:
    """Record (replace) the setting ``name`` serve starts with, as of now (not committed)."""
    row = session.get(ServedSetting, name)
    if row is None:
        row = ServedSetting(name=name)
        session.add(row)
    row.value = value
    row.recorded_at = datetime.now(UTC)
    return row


def served_setting(session: Session, name: str) -> ServedSetting | None:
    """The setting ``name`` as serve last recorded it; None if no serve ever did."""
    return session.get(ServedSetting, name)
