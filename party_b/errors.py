"""Errors the service raises; the app turns each into an RFC 9457 problem+json response.

The service layer never imports FastAPI: it raises these, and ``party_b.app`` renders them.
"""

from typing import Any

from api_schemas.problems import ProblemType

__all__ = ["ProblemError"]


class ProblemError(Exception):
    """An error a caller can cause, with its HTTP status and stable problem type.

    ``extensions`` become extra members of the problem object (e.g. ``expected_step``), which
    clients read to recover without parsing prose.
    """

    def __init__(
        self, status: int, type_: ProblemType, title: str, detail: str, **extensions: Any
    ) -> None:
        super().__init__(f"{title}: {detail}")
        self.status = status
        self.type = type_
        self.title = title
        self.detail = detail
        self.extensions = extensions

    @classmethod
    def not_found(cls, what: str) -> "ProblemError":
        return cls(404, ProblemType.NOT_FOUND, "Not found", what)

    @classmethod
    def invalid(cls, detail: str) -> "ProblemError":
        return cls(422, ProblemType.INVALID_REQUEST, "Invalid request", detail)

    @classmethod
    def shape(cls, detail: str) -> "ProblemError":
        return cls(422, ProblemType.SHAPE_MISMATCH, "Activations do not fit the run", detail)

    @classmethod
    def limit(cls, detail: str) -> "ProblemError":
        return cls(422, ProblemType.LIMIT_EXCEEDED, "Over a server limit", detail)

    @classmethod
    def run_state(cls, detail: str, **extensions: Any) -> "ProblemError":
        return cls(
            409, ProblemType.RUN_STATE, "Not allowed in the run's status", detail, **extensions
        )
