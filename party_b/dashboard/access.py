"""The operator's credential: the one secret that opens the dashboard's data.

It is not an API token and never becomes one: it lives only in party B's settings
(``FEDLITE_B_DASHBOARD_TOKEN``), is never written to the token table, and the dashboard
compares a request's bearer credential against it alone. So a party A token opens no
dashboard data, and the operator credential opens no run of the API (``party_b.auth`` does
not know it). Start-up refuses a credential that equals a token party B knows.
"""

import hashlib
import hmac

from fastapi import Request
from sqlalchemy.orm import Session

from api_schemas import ProblemType
from party_b import store
from party_b.auth import hash_token
from party_b.errors import ProblemError, StartupError

__all__ = ["OperatorCredential"]


class OperatorCredential:
    """Checks ``Authorization: Bearer <credential>`` against the operator's credential."""

    def __init__(self, secret: str) -> None:
        # Kept only as a digest: both sides of the comparison are then 32 bytes, so neither
        # the time it takes nor an early exit on length says anything about the secret.
        self._digest = hashlib.sha256(secret.encode("utf-8")).digest()
        self._token_hash = hash_token(secret)

    def matches(self, candidate: str) -> bool:
        given = hashlib.sha256(candidate.encode("utf-8")).digest()
        return hmac.compare_digest(given, self._digest)

    async def __call__(self, request: Request) -> None:
        """The FastAPI dependency (async: a plain ``def`` dependency would go to a worker
        thread and back): ``check``."""
        self.check(request)

    def check(self, request: Request) -> None:
        """401 problem+json unless the request carries the credential."""
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            raise ProblemError(
                ProblemType.UNAUTHORIZED, "send 'Authorization: Bearer <operator credential>'"
            )
        if not self.matches(credential.strip()):
            raise ProblemError(
                ProblemType.UNAUTHORIZED, "that is not the dashboard's operator credential"
            )

    def refuse_if_a_token(self, session: Session) -> None:
        """StartupError if the credential is also an API token party B holds (active, revoked
        or replaced): each secret must open one door only."""
        token = store.token_by_hash(session, self._token_hash)
        revoked = store.revoked_hash(session, self._token_hash)
        holder = token if token is not None else revoked
        name = holder.name if holder is not None else None
        if name is not None:
            raise StartupError(
                f"FEDLITE_B_DASHBOARD_TOKEN is the API token of {name!r}: the operator's "
                "dashboard credential must be a secret of its own (make one with python3 -c "
                "'import secrets; print(secrets.token_urlsafe(32))')"
            )
