"""Errors the service raises; the API renders each as an RFC 9457 problem+json response.

The service layer never imports FastAPI: it raises these, and ``party_b.api.problems``
renders them. A problem's HTTP status and title come from its type
(``api_schemas.problems.PROBLEMS``), so each type is bound to its status in one place.
"""

from typing import Any

from api_schemas.problems import PROBLEMS, ProblemType

__all__ = ["MaintenanceError", "ProblemError", "StartupError"]


class ProblemError(Exception):
    """An error a caller can cause, with its stable problem type and a detail for humans.

    ``extensions`` become extra members of the problem object (e.g. ``expected_step``), which
    clients read to recover without parsing prose.
    """

    def __init__(self, type_: ProblemType, detail: str, **extensions: Any) -> None:
        kind = PROBLEMS[type_]
        super().__init__(f"{kind.title}: {detail}")
        self.type = type_
        self.status = kind.status
        self.title = kind.title
        self.detail = detail
        self.extensions = extensions

    def body(self) -> dict[str, Any]:
        """The problem+json object: type, title, status, detail and the extensions."""
        return {
            "type": str(self.type),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **self.extensions,
        }

    @classmethod
    def not_found(cls, what: str) -> "ProblemError":
        return cls(ProblemType.NOT_FOUND, what)

    @classmethod
    def invalid(cls, detail: str) -> "ProblemError":
        return cls(ProblemType.INVALID_REQUEST, detail)

    @classmethod
    def malformed(cls, detail: str) -> "ProblemError":
        return cls(ProblemType.MALFORMED_MESSAGE, detail)

    @classmethod
    def shape(cls, detail: str) -> "ProblemError":
        return cls(ProblemType.SHAPE_MISMATCH, detail)

    @classmethod
    def limit(cls, detail: str) -> "ProblemError":
        return cls(ProblemType.LIMIT_EXCEEDED, detail)

    @classmethod
    def run_state(cls, detail: str, **extensions: Any) -> "ProblemError":
        return cls(ProblemType.RUN_STATE, detail, **extensions)

    @classmethod
    def internal(cls, detail: str) -> "ProblemError":
        return cls(ProblemType.INTERNAL, detail)


class StartupError(Exception):
    """party B cannot start as configured; the message says which file and what to do."""


class MaintenanceError(Exception):
    """An operator's request that cannot be carried out; the message says why and what to do."""
